// LaunchRecurrence (launchers.h): the fused decode / prefill kernels of the
// formats of CUDA unit kRecurrence (the format table, kernels/formats/
// format.h); those of kRecurrenceAffine are compiled and launched by
// recurrence_kernel_affine.cu (the kernels: recurrence_kernels.cuh, their
// launch: recurrence_launch.cuh).
#include "kernels/cuda/internal/recurrence_launch.cuh"

namespace statecache {
namespace cuda_internal {

bool TilingSupported(int d_k, int d_v) {
  if (d_k < 1 || d_v < kTileStripe || d_v % kTileStripe != 0) return false;
  return MakeDecodeTiling(d_k, d_v).threads <= kMaxTileThreads;
}

int LaunchRecurrence(const RecurrenceParams& p, const LaunchOptions& o, void* stream) {
  if (TraitsOf(p.geo.format).unit == CudaUnit::kRecurrenceAffine) {
    return LaunchAffineRecurrence(p, o, stream);
  }
  return DispatchFormat<CudaUnit::kRecurrence>(
      p.geo.format, [&](auto f) { return Launch<decltype(f)::value>(p, o, stream); });
}

}  // namespace cuda_internal
}  // namespace statecache
