// LaunchRecurrence (launchers.h): the fused decode / prefill kernels of the
// formats without affine rows; those with them are compiled and launched by
// recurrence_kernel_affine.cu (the kernels: recurrence_kernels.cuh, their
// launch: recurrence_launch.cuh).
#include "kernels/cuda/internal/recurrence_launch.cuh"

namespace statecache {
namespace cuda_internal {

bool TilingSupported(int d_k, int d_v) {
  if (d_k < 1 || d_v < kTileStripe || d_v % kTileStripe != 0) return false;
  return MakeDecodeTiling(d_k, d_v).threads <= kMaxTileThreads;
}

int LaunchRecurrence(const RecurrenceParams& p, void* stream) {
  if (IsAffineRecurrenceFormat(p.geo.format)) return LaunchAffineRecurrence(p, stream);
  switch (p.geo.format) {
    case StateFormat::kFp32: return Launch<StateFormat::kFp32>(p, stream);
    case StateFormat::kFp16: return Launch<StateFormat::kFp16>(p, stream);
    case StateFormat::kBf16: return Launch<StateFormat::kBf16>(p, stream);
    case StateFormat::kFp8E4m3: return Launch<StateFormat::kFp8E4m3>(p, stream);
    case StateFormat::kNvfp4: return Launch<StateFormat::kNvfp4>(p, stream);
    case StateFormat::kDampSr: return Launch<StateFormat::kDampSr>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace cuda_internal
}  // namespace statecache
