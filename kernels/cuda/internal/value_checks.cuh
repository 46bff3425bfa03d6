// The element checks of the validation kernels (launchers.h ValueCheck modes).
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_VALUE_CHECKS_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_VALUE_CHECKS_CUH_

#include <cmath>
#include <cstdint>

#include "kernels/formats/numeric.h"
#include "kernels/formats/state_bound.h"

namespace statecache {
namespace cuda_internal {

// Element i of `data` (DType code: 0 fp32, 1 bf16, 2 fp16) as float.
__device__ __forceinline__ float LoadCheckedValue(int dtype, const void* data, int64_t i) {
  if (dtype == 0) return static_cast<const float*>(data)[i];
  const uint16_t b = static_cast<const uint16_t*>(data)[i];
  return dtype == 1 ? Bf16BitsToFloat(b) : HalfBitsToFloat(b);
}

// mode 0 = finite, 1 = finite and <= 0 (g), 2 = finite and in [0, 2] (beta),
// 3 = finite and |x| <= kMaxStateMagnitude (states).
__device__ __forceinline__ bool IsBadValue(float x, int mode) {
  bool bad = !isfinite(x);
  if (mode == 1) bad |= x > 0.0f;
  if (mode == 2) bad |= x < 0.0f || x > 2.0f;
  if (mode == 3) bad |= !IsAcceptedStateValue(x);
  return bad;
}

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_VALUE_CHECKS_CUH_
