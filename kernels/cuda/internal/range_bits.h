// The part of an affine group's range that MakeAffineParams uses, from
// integer maxima of the values' bits (host and device: range_bits_test
// checks it against the float definition on the host).
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_RANGE_BITS_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_RANGE_BITS_H_

#include <cstdint>
#include <type_traits>

#include "kernels/common/host_device.h"
#include "kernels/formats/numeric.h"

namespace statecache {
namespace cuda_internal {

// min(min x, 0) and max(max x, 0) of a group from integer maxima of the
// values' bits (VIMNMX3 on sm_90 takes three operands: 8 instructions per 16
// values and bound instead of 15 FMNMX). For non-NaN values: the signed
// maximum of the bits is the largest positive value's when there is one
// (negative floats are negative integers, and non-negative floats order like
// their bits); the unsigned maximum is the most negative value's when there
// is one (negative floats have the top bit set and order by magnitude).
// Groups containing NaN are outside the codecs' byte-equality contract.
struct RangeBits {
  uint32_t neg;  // unsigned max of the bits
  int32_t pos;   // signed max of the bits
};

// max of two or three 32-bit integers (VIMNMX3 on the device for three).
template <typename T>
SC_HD T Max2(T a, T b) {
#if defined(__CUDA_ARCH__)
  return max(a, b);
#else
  return a > b ? a : b;
#endif
}
template <typename T>
SC_HD T Max3(T a, T b, T c) {
  static_assert(std::is_same<T, int32_t>::value || std::is_same<T, uint32_t>::value, "32-bit");
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_signed<T>::value) {
    return __vimax3_s32(a, b, c);
  } else {
    return __vimax3_u32(a, b, c);
  }
#else
  return Max2(Max2(a, b), c);
#endif
}

SC_HD int32_t FloatToSignedBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(f);
#else
  return static_cast<int32_t>(FloatToBits(f));
#endif
}

template <int N>
SC_HD RangeBits LaneRangeBits(const float* x) {
  static_assert(N >= 2 && N % 2 == 0, "even N");
  // A chain that folds two values per step: one live partial per maximum
  // (the tile kernels run at their register limit; a tree would hold more).
  uint32_t u = Max2(FloatToBits(x[0]), FloatToBits(x[1]));
  int32_t v = Max2(FloatToSignedBits(x[0]), FloatToSignedBits(x[1]));
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int c = 2; c < N; c += 2) {
    u = Max3(u, FloatToBits(x[c]), FloatToBits(x[c + 1]));
    v = Max3(v, FloatToSignedBits(x[c]), FloatToSignedBits(x[c + 1]));
  }
  return RangeBits{u, v};
}

SC_HD RangeBits MaxRange(const RangeBits& a, const RangeBits& b) {
  return RangeBits{Max2(a.neg, b.neg), Max2(a.pos, b.pos)};
}

// min(group_min, 0) and max(group_max, 0) as MakeAffineParams computes them.
SC_HD float RangeMin(const RangeBits& r) {
  return (r.neg & 0x80000000u) != 0 ? BitsToFloat(r.neg) : 0.0f;
}
SC_HD float RangeMax(const RangeBits& r) {
  return r.pos > 0 ? BitsToFloat(static_cast<uint32_t>(r.pos)) : 0.0f;
}

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_RANGE_BITS_H_
