// Device helpers both STEPQuant kernel units share (stepquant_kernel.cu,
// stepquant_fast_kernel.cu). Internal linkage.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_STEPQUANT_DEVICE_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_STEPQUANT_DEVICE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/internal/validation_block.cuh"
#include "kernels/formats/numeric.h"

namespace statecache {
namespace cuda_internal {
namespace {

// Whether the validation block `errors` (nullptr: none) holds an error.
__device__ bool Aborted(const int32_t* errors) { return ValidationBlockFailed(errors); }

// Element i of a q / k / v tensor of DType `dtype` (0 fp32, 1 bf16, 2 fp16).
__device__ float LoadIn(int dtype, const void* p, int64_t i) {
  if (dtype == 0) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  if (dtype == 1) return __uint_as_float(static_cast<uint32_t>(b) << 16);
  return HalfBitsToFloat(b);
}

}  // namespace
}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_STEPQUANT_DEVICE_CUH_
