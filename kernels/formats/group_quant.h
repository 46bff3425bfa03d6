// Per-group quantizers of DESIGN.md section 3, written once for host and
// device. Each works on one group of contiguous values along the value axis.
//
// The parameter derivation (Affine*Params, SymParams, Fp8Params, Nvfp4*) is
// separated from the per-element code functions so a CUDA kernel can compute
// the group's min/max/absmax with a warp reduction (order does not change a
// min or max) and then call the same element functions as the CPU reference:
// both sides produce identical bytes for identical FP32 inputs.
//
// Conventions (fixed here, relied on by the CUDA kernels):
//  - Affine (uint8 / uint4): the range is widened to include 0, so the zero
//    point z is an integer in [0, 2^b - 1] (exact in FP16). s is rounded to
//    FP16 (saturating at 65504) *before* encoding, and codes use the FP32
//    reciprocal of that rounded s: q = clamp(rint(x * (1/s)) + z, 0, 2^b - 1),
//    where x * (1/s) is rounded to an integer directly from the exact
//    product (one fused multiply-add with the 1.5 * 2^23 rounding constant),
//    so a kernel encodes a value with a single FMA.
//    A group whose FP16 s is 0 (all zero, or a range below FP16 resolution)
//    stores s = z = 0 and all-zero codes; it decodes to exact zeros.
//  - Symmetric int8 (damp-sr) and FP8: s = max(absmax, 1e-10) / qmax in FP32;
//    int8 codes round the exact product x * (1/s) as the affine codes do.
//  - NVFP4: one FP32 global scale per head, s_g = absmax(head) / (448 * 6);
//    E4M3 block scales of absmax(block) / (6 s_g); E2M1 codes of x / (s_b s_g).
#ifndef STATECACHE_KERNELS_FORMATS_GROUP_QUANT_H_
#define STATECACHE_KERNELS_FORMATS_GROUP_QUANT_H_

#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/formats/numeric.h"

namespace statecache {

SC_HD float Clamp(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

// ---- Asymmetric affine (uint8 / uint4), FP16 s and z -----------------------

struct AffineParams {
  uint16_t s_bits;  // FP16 scale
  uint16_t z_bits;  // FP16 zero point (an integer in [0, qmax])
  float inv_s;      // 1 / s, or 0 when s == 0
  float z;          // zero point as float
};

// x / d for the affine ranges (x >= 0 or NaN, d = qmax), correctly rounded:
// one multiply by the rounded reciprocal and one FMA correction (Markstein),
// so device code runs three instructions instead of the division's checked
// path. Bit-identical to the IEEE quotient for every non-negative float and
// NaN with d = 15 or 255 (group_quant_test checks all 2^31 inputs of each;
// other d are not checked, and no caller passes one); infinity takes the
// uncorrected product (also infinity).
SC_HD float QuotientByReciprocal(float x, int d) {
  const float r = d == 255 ? 1.0f / 255.0f : (d == 15 ? 1.0f / 15.0f : 1.0f / static_cast<float>(d));
  const float q0 = x * r;
  const float q = Fma(Fma(-static_cast<float>(d), q0, x), r, q0);
  return x <= 3.40282347e38f ? q : q0;
}

// 1 / s for a positive finite FP16 value s (as float: exponent in
// [-24, 15]), correctly rounded. On CUDA: the instruction sequence of the
// compiler's rcp.rn fast path (MUFU.RCP, then one Newton step), which is
// exact for inputs of this exponent range, without its range check and
// slow-path call; elsewhere a division.
SC_HD float ReciprocalOfHalf(float s) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  return Fma(r, Fma(-s, r, 1.0f), r);
#else
  return 1.0f / s;
#endif
}

// From the group's min and max (any order of reduction gives the same values);
// qmax is 15 (uint4) or 255 (uint8).
SC_HD AffineParams MakeAffineParams(float group_min, float group_max, int qmax) {
  const float mn = group_min < 0.0f ? group_min : 0.0f;
  const float mx = group_max > 0.0f ? group_max : 0.0f;
  AffineParams p;
  p.s_bits = FloatToHalfBits(QuotientByReciprocal(mx - mn, qmax));
  const float s = HalfBitsToFloat(p.s_bits);
  if (!(s > 0.0f)) {
    p.s_bits = 0;
    p.z_bits = 0;
    p.inv_s = 0.0f;
    p.z = 0.0f;
    return p;
  }
  p.inv_s = ReciprocalOfHalf(s);
  p.z = Clamp(RoundEven(-mn * p.inv_s), 0.0f, static_cast<float>(qmax));
  p.z_bits = FloatToHalfBits(p.z);
  return p;
}

// fma(x, inv_s, M) - M with M = 1.5 * 2^23 is rint of the exact product for
// |x * inv_s| < 2^22 (ties to even); beyond that it is a value of the same
// sign and size, which the clamp maps to 0 or qmax as rint would.
inline constexpr float kRoundMagic = 12582912.0f;

SC_HD float AffineRound(float x, float inv_s) {
  return Fma(x, inv_s, kRoundMagic) - kRoundMagic;
}

SC_HD uint8_t AffineEncode(float x, const AffineParams& p, int qmax) {
  return static_cast<uint8_t>(Clamp(AffineRound(x, p.inv_s) + p.z, 0.0f, static_cast<float>(qmax)));
}

// x_hat = s (q - z), evaluated as fma(s, q, -(s z)) (the GPU decoders' one
// FFMA per value, tile_codec.cuh). s: the stored FP16 scale, or that scale
// times a row factor (DecodeRow's row_scale: the token's decay folded in);
// z: the stored integer zero point. For a stored scale s z is exact (11 x 8
// significant bits), so this is s (q - z) with one rounding, as before; with
// a row factor s z is rounded once, an error of at most half an ulp of s z
// (about 1e-5 of a quantization step at z = 255).
SC_HD float AffineDecode(uint8_t q, float s, float z) {
  return Fma(s, static_cast<float>(q), -(s * z));
}

// ---- Symmetric int8 (damp-sr), FP32 s ---------------------------------------

inline constexpr float kSymI8Max = 127.0f;
inline constexpr float kMinGroupAbsMax = 1e-10f;

SC_HD float MakeSymScale(float group_absmax) {
  return (group_absmax > kMinGroupAbsMax ? group_absmax : kMinGroupAbsMax) / kSymI8Max;
}
SC_HD int8_t SymEncode(float x, float inv_s) {
  return static_cast<int8_t>(Clamp(AffineRound(x, inv_s), -kSymI8Max, kSymI8Max));
}
SC_HD float SymDecode(int8_t q, float s) { return s * static_cast<float>(q); }

// ---- FP8 E4M3, FP32 s per group ---------------------------------------------

SC_HD float MakeFp8Scale(float group_absmax) {
  return (group_absmax > kMinGroupAbsMax ? group_absmax : kMinGroupAbsMax) / kE4m3Max;
}
SC_HD uint8_t Fp8Encode(float x, float inv_s) {
  return FloatToE4m3(Clamp(x * inv_s, -kE4m3Max, kE4m3Max));
}
SC_HD float Fp8Decode(uint8_t q, float s) { return s * E4m3ToFloat(q); }

// ---- NVFP4: E2M1 codes, E4M3 block scale, FP32 global scale -----------------

// Global scale of a head from its absmax; 0 for an all-zero head.
SC_HD float MakeNvfp4GlobalScale(float head_absmax) {
  return head_absmax / (kE4m3Max * kE2m1Max);
}
// E4M3 block scale code for a block with the given absmax.
SC_HD uint8_t MakeNvfp4BlockScale(float block_absmax, float global_scale) {
  if (!(global_scale > 0.0f)) return 0;
  return FloatToE4m3(block_absmax / (kE2m1Max * global_scale));
}
// The multiplier of an E2M1 code in a block: s_b * s_g (0 for empty blocks).
SC_HD float Nvfp4BlockMultiplier(uint8_t block_scale, float global_scale) {
  return E4m3ToFloat(block_scale) * global_scale;
}
SC_HD uint8_t Nvfp4Encode(float x, float block_multiplier) {
  if (!(block_multiplier > 0.0f)) return 0;
  return FloatToE2m1(x / block_multiplier);
}
SC_HD float Nvfp4Decode(uint8_t q, float block_multiplier) {
  return E2m1ToFloat(q) * block_multiplier;
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_GROUP_QUANT_H_
