// Bit-exact scalar conversions shared by host and device code: FP16, BF16,
// FP8 E4M3 (OCP "e4m3fn": bias 7, max 448, no infinities) and FP4 E2M1.
//
// All encoders round to nearest, ties to even, and saturate at the format's
// largest finite value instead of producing infinities (DESIGN.md section 3:
// "FP16 storage saturates instead of overflowing"). Inputs are finite: the
// callers reject NaN/Inf before anything is encoded. The software
// implementations are used on both sides so CPU and GPU produce the same bits.
#ifndef STATECACHE_KERNELS_FORMATS_NUMERIC_H_
#define STATECACHE_KERNELS_FORMATS_NUMERIC_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/common/host_device.h"

#if !defined(__CUDA_ARCH__) && defined(__F16C__)
#include <immintrin.h>
#endif

namespace statecache {

SC_HD uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

SC_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// Round half to even; identical on host (std::rint in the default rounding
// mode) and device (rintf).
SC_HD float RoundEven(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::rint(x);
#endif
}

// Fused multiply-add, correctly rounded on both sides.
SC_HD float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return fmaf(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

inline constexpr float kFp16Max = 65504.0f;
inline constexpr uint16_t kFp16MaxBits = 0x7bff;  // binary16 bits of kFp16Max
inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kE2m1Max = 6.0f;

// float -> IEEE binary16 bits, round-to-nearest-even, saturating to +-65504.
// The portable definition; FloatToHalfBits below may use hardware that gives
// the same bits (numeric_test checks the two agree).
SC_HD uint16_t FloatToHalfBitsPortable(float f) {
  const uint32_t x = FloatToBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | kFp16MaxBits);  // >= 65520
  if (ax < 0x38800000u) {  // below 2^-14: subnormal (exact scaling, one rounding)
    const float m = RoundEven(BitsToFloat(ax) * 16777216.0f);  // * 2^24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(m));
  }
  uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax >> 13) & 0x3ffu);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

SC_HD float HalfBitsToFloatPortable(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -v : v;
  }
  if (e == 31) return BitsToFloat(sign | 0x7f800000u | (m << 13));
  return BitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}

SC_HD uint16_t FloatToHalfBits(float f) {
#if defined(__CUDA_ARCH__)
  // CUDA: the hardware RNE conversion saturating to the finite range (one
  // instruction; the same bits as clamping first; GPU tests compare against
  // the portable path's bytes).
  unsigned short h;
  asm("cvt.rn.satfinite.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#elif defined(__F16C__)
  // x86 F16C: RNE conversion, identical once clamped to the finite range.
  const float c = f > kFp16Max ? kFp16Max : (f < -kFp16Max ? -kFp16Max : f);
  return _cvtss_sh(c, _MM_FROUND_TO_NEAREST_INT);
#else
  return FloatToHalfBitsPortable(f);
#endif
}

SC_HD float HalfBitsToFloat(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;  // exact
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(h)));
  return f;
#elif defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return HalfBitsToFloatPortable(h);
#endif
}

// float -> bfloat16 bits, round-to-nearest-even, saturating to the largest
// finite bf16.
SC_HD uint16_t FloatToBf16Bits(float f) {
  const uint32_t x = FloatToBits(f);
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  uint32_t b = rounded >> 16;
  if ((b & 0x7fffu) >= 0x7f80u) b = (x & 0x80000000u) ? 0xff7fu : 0x7f7fu;
  return static_cast<uint16_t>(b);
}

SC_HD float Bf16BitsToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

// float -> FP8 E4M3 code (sign in bit 7), RNE, saturating to +-448.
SC_HD uint8_t FloatToE4m3(float f) {
  const uint32_t x = FloatToBits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const float a = BitsToFloat(x & 0x7fffffffu);
  if (a >= kE4m3Max) return sign | 0x7eu;
  if (a < 0.015625f) {  // below 2^-6: subnormal, step 2^-9
    return sign | static_cast<uint8_t>(RoundEven(a * 512.0f));
  }
  const uint32_t ax = FloatToBits(a);
  uint32_t code = ((((ax >> 23) - 127u + 7u) & 0xfu) << 3) | ((ax >> 20) & 0x7u);
  const uint32_t rem = ax & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (code & 1u))) ++code;
  if (code > 0x7eu) code = 0x7eu;
  return static_cast<uint8_t>(sign | code);
}

SC_HD float E4m3ToFloat(uint8_t c) {
  const uint32_t e = (c >> 3) & 0xfu;
  const uint32_t m = c & 0x7u;
  float v;
  if (e == 0) {
    v = static_cast<float>(m) * 0.001953125f;  // 2^-9
  } else {
    v = BitsToFloat(((e + 120u) << 23) | (m << 20));
  }
  return (c & 0x80u) ? -v : v;
}

// float -> FP4 E2M1 code (sign in bit 3): magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6},
// RNE on the code grid, saturating to +-6.
SC_HD uint8_t FloatToE2m1(float f) {
  const uint8_t sign = (FloatToBits(f) >> 31) ? 0x8u : 0x0u;
  const float a = std::fabs(f);
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return c == 0 ? 0 : static_cast<uint8_t>(sign | c);
}

SC_HD float E2m1ToFloat(uint8_t c) {
  const uint8_t m = c & 0x7u;
  const float v = m < 4 ? 0.5f * m : static_cast<float>(1u << (m / 2 - 1)) * (1.0f + 0.5f * (m & 1u));
  return (c & 0x8u) ? -v : v;
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_NUMERIC_H_
