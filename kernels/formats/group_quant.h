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
//    point z is an integer in [0, 2^b - 1] (exact in FP16). s is
//    (max - min) / (2^b - 1) with a margin of about 2^-11 and half the least
//    FP16 step added, rounded to FP16 (saturating at 65504) *before*
//    encoding, so that it is never below the range / (2^b - 1); codes use
//    the FP32 reciprocal of that rounded s: z = rint(-min * (1/s)) and
//    q = clamp(rint(x * (1/s) + z), 0, 2^b - 1), where each rint rounds the
//    exact value (one fused multiply-add with the 1.5 * 2^23 rounding
//    constant, z folded into it), so a kernel encodes a value with a single
//    FMA. The margin makes the clamp dead whenever s did not saturate (proof
//    at MakeAffineParams), so kernels skip it.
//    A group whose FP16 s is 0 (all zero, or a range below about 1e-12)
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

// s = RN_fp16(fma(range, AffineScaleFactor(qmax), kAffineScaleBias)): the
// factor is at least (1 + 2^-11 + 2^-19) / qmax (group_quant_test checks it
// in double precision; 2^-11 is the largest relative half-step of FP16) and
// the bias is half the least FP16 step, so that neither the FP32 nor the FP16
// rounding can leave s below the range / qmax (proof at MakeAffineParams). A
// zero range gives exactly the bias, a tie that rounds to s = 0.
SC_HD float AffineScaleFactor(int qmax) {
  constexpr float kMargin = 1.0f + 0x1p-11f + 0x1p-18f;
  return qmax == 255 ? (1.0f / 255.0f) * kMargin : (1.0f / 15.0f) * kMargin;
}
inline constexpr float kAffineScaleBias = 0x1p-25f;

// 1 / s, correctly rounded, for a positive normal s below 2^126 (every
// positive FP16 value as float, and every symmetric scale: SymInverseScale).
// On CUDA: the instruction sequence of the compiler's rcp.rn fast path
// (MUFU.RCP, then one Newton step), which that instruction takes for exactly
// these inputs (biased exponent 1 to 252), without its range check and
// slow-path call; elsewhere a division.
SC_HD float ReciprocalInRange(float s) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  return Fma(r, Fma(-s, r, 1.0f), r);
#else
  return 1.0f / s;
#endif
}

// fma(x, inv_s, M + c) - M with M = 1.5 * 2^23 and an integer 0 <= c <= 255
// (M + c exact) is rint(x * inv_s + c) of the exact value for |x * inv_s + c|
// < 2^22 (ties to even); beyond that it is a value of the same sign and size,
// which the clamps below map to 0 or qmax as rint would.
inline constexpr float kRoundMagic = 12582912.0f;

SC_HD float AffineRound(float x, float inv_s, float c = 0.0f) {
  return Fma(x, inv_s, kRoundMagic + c) - kRoundMagic;
}

// From the group's min and max (any order of reduction gives the same values);
// qmax is 15 (uint4) or 255 (uint8).
// The clamp of AffineEncode never binds when s is neither 0 nor saturated
// (s_bits != kFp16MaxBits), for every group without NaN. With D = RN(mx - mn),
// c = AffineScaleFactor(qmax) >= (1 + 2^-11 + 2^-19) / qmax and
// t = RN32(D c + 2^-25):
//  - s >= D (1 + 2^-20) / qmax. A normal FP16 s is within half an FP16 step,
//    at most 2^-11 t, of t: s >= t (1 - 2^-11) >= D c (1 - 2^-24) (1 - 2^-11)
//    >= D (1 + 2^-20) / qmax. A subnormal s != 0 is >= 2^-24 and >= t - 2^-25
//    >= D c (1 - 2^-24) - 2^-49, which covers D (1 + 2^-20) / qmax either way
//    (the first when D / qmax >= 2^-37, the second otherwise).
//  - Let y(x) = x * inv_s (exact), inv_s = RN(1 / s) <= (1 + 2^-24) / s.
//  - Low end: z = rint(-y(mn)) = -rint(y(mn)) (0 <= z <= qmax by the high-end
//    bound), so y(mn) + z lies in [-1/2, 1/2] and rounds to 0; every x >= mn
//    codes to >= 0 (rint is monotonic).
//  - High end: y(mx) + z <= (mx - mn) inv_s + 1/2 and (mx - mn) inv_s <=
//    D (1 + 2^-24)^2 / s <= qmax (1 + 2^-24)^2 / (1 + 2^-20) < qmax, so
//    y(x) + z < qmax + 1/2 rounds to <= qmax.
// group_quant_test checks both ends on a dense sweep of ranges.
// MakeAffineParamsOfWidened: the same from the widened range itself,
// mn = min(group_min, 0) <= 0 <= mx = max(group_max, 0) (the kernels' range
// reduction yields it directly: range_bits.h).
// Branch-free: the reciprocal and the zero point are computed for every s and
// selected (for s == 0, or a NaN range, they are inf / NaN and dropped), so a
// kernel's lane pairs derive parameters without a divergent region (no
// reconvergence barrier, and the lane-pair shuffles that follow need no
// convergence check).
SC_HD AffineParams MakeAffineParamsOfWidened(float mn, float mx, int qmax) {
  const uint16_t s_bits =
      FloatToHalfBits(Fma(mx - mn, AffineScaleFactor(qmax), kAffineScaleBias));
  const float s = HalfBitsToFloat(s_bits);
  const bool nonzero = s > 0.0f;
  const float inv_s = ReciprocalInRange(s);
  const float z = Clamp(AffineRound(-mn, inv_s), 0.0f, static_cast<float>(qmax));
  AffineParams p;
  p.s_bits = nonzero ? s_bits : uint16_t{0};
  p.inv_s = nonzero ? inv_s : 0.0f;
  p.z = nonzero ? z : 0.0f;
  p.z_bits = FloatToHalfBits(p.z);
  return p;
}

SC_HD AffineParams MakeAffineParams(float group_min, float group_max, int qmax) {
  return MakeAffineParamsOfWidened(group_min < 0.0f ? group_min : 0.0f,
                                   group_max > 0.0f ? group_max : 0.0f, qmax);
}

SC_HD uint8_t AffineEncode(float x, const AffineParams& p, int qmax) {
  return static_cast<uint8_t>(Clamp(AffineRound(x, p.inv_s, p.z), 0.0f, static_cast<float>(qmax)));
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

// a / 127 for a positive finite a, as CUDA's div.rn computes it when its
// range check passes: the quotient by RN(1/127) (0x3c010204, which one
// Newton step from the compiler's seed leaves unchanged), then one FMA
// correction. group_quant_test checks it against the IEEE quotient for
// every mantissa of three binades; a power of two scales every step of it
// exactly, so that covers every a from kMinGroupAbsMax to the largest float.
inline constexpr float kRecip127 = 0.0078740157186985015869f;  // RN(1 / 127)
SC_HD float QuotientBy127(float a) {
  const float q0 = a * kRecip127;
  return Fma(kRecip127, Fma(q0, -kSymI8Max, a), q0);
}

// s = max(absmax, 1e-10) / 127 (IEEE division). On CUDA through
// QuotientBy127, without the division's range check and slow-path call
// (an infinite absmax keeps s = inf, as the division gives).
SC_HD float MakeSymScale(float group_absmax) {
  const float a = group_absmax > kMinGroupAbsMax ? group_absmax : kMinGroupAbsMax;
#if defined(__CUDA_ARCH__)
  return a <= 0x1.fffffep127f ? QuotientBy127(a) : a;
#else
  return a / kSymI8Max;
#endif
}
// 1 / s for a MakeSymScale s (s >= 1e-10 / 127 > 2^-41): ReciprocalInRange
// below 2^126 (every finite s), 0 for s = inf (as the division gives).
SC_HD float SymInverseScale(float s) {
  return s < 0x1p126f ? ReciprocalInRange(s) : 0.0f;
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
