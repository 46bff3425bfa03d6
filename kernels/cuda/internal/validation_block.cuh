// The op kernels' abort check: a validation block written by an earlier
// kernel of the same stream (the binding's validation), read after the grid
// dependency wait. nullptr = no validation (benchmark hooks).
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_VALIDATION_BLOCK_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_VALIDATION_BLOCK_CUH_

#include <cstdint>

#include "kernels/cuda/internal/kernel_params.h"

namespace statecache {
namespace cuda_internal {

// True when any of the block's first `fields` words is not kNoError.
__device__ __forceinline__ bool ValidationBlockFailed(const int32_t* block,
                                                      int fields = kNumValidationFields) {
  if (block == nullptr) return false;
  bool bad = false;
  for (int f = 0; f < fields; ++f) bad |= block[f] != kNoError;
  return bad;
}

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_VALIDATION_BLOCK_CUH_
