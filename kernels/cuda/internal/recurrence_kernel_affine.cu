// LaunchAffineRecurrence: the fused decode / prefill kernels of the formats
// of CUDA unit kRecurrenceAffine (affine rows), in a translation unit of their
// own so that ptxas schedules them with its default register-usage level
// (kernels/cuda/BUILD; the kernels: recurrence_kernels.cuh, their launch:
// recurrence_launch.cuh).
#include "kernels/cuda/internal/recurrence_launch.cuh"

namespace statecache {
namespace cuda_internal {

int LaunchAffineRecurrence(const RecurrenceParams& p, const LaunchOptions& o, void* stream) {
  return DispatchFormat<CudaUnit::kRecurrenceAffine>(
      p.geo.format, [&](auto f) { return Launch<decltype(f)::value>(p, o, stream); });
}

}  // namespace cuda_internal
}  // namespace statecache
