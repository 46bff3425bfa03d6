// CudaDecodeQueue: the CUDA backend's DecodeQueue (kernels/backend/backend.h),
// made by CudaBackend::NewDecodeQueue.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_DECODE_QUEUE_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_DECODE_QUEUE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend/backend.h"
#include "kernels/cuda/launch_options.h"

namespace statecache {
namespace cuda_internal {

// A new queue on the current device (its own stream, validation block,
// slot bitmap, pinned read-back ring and completion thread).
absl::StatusOr<std::unique_ptr<DecodeQueue>> NewCudaDecodeQueue(const LaunchOptions& options);

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_DECODE_QUEUE_H_
