// LaunchAffineRecurrence: the fused decode / prefill kernels of the formats
// with affine rows (IsAffineRecurrenceFormat), in a translation unit of their
// own so that ptxas schedules them with its default register-usage level
// (kernels/cuda/BUILD; the kernels: recurrence_kernels.cuh, their launch:
// recurrence_launch.cuh).
#include "kernels/cuda/internal/recurrence_launch.cuh"

namespace statecache {
namespace cuda_internal {

int LaunchAffineRecurrence(const RecurrenceParams& p, void* stream) {
  switch (p.geo.format) {
    case StateFormat::kInt8: return Launch<StateFormat::kInt8>(p, stream);
    case StateFormat::kInt8Hadamard: return Launch<StateFormat::kInt8Hadamard>(p, stream);
    case StateFormat::kInt4: return Launch<StateFormat::kInt4>(p, stream);
    case StateFormat::kInt4Hadamard: return Launch<StateFormat::kInt4Hadamard>(p, stream);
    case StateFormat::kDamp: return Launch<StateFormat::kDamp>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace cuda_internal
}  // namespace statecache
