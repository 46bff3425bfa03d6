#include "kernels/formats/group_quant.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "gtest/gtest.h"

namespace statecache {
namespace {

// The factor in front of the affine scale's FP16 rounding: at least
// (1 + 2^-11 + 2^-19) / qmax exactly (the bound MakeAffineParams's proof
// needs), and no larger than it has to be by much (the scale's precision).
TEST(AffineScaleFactor, CoversTheMarginOfTheProof) {
  for (const int qmax : {15, 255}) {
    const double c = AffineScaleFactor(qmax);
    EXPECT_GE(c * qmax, 1.0 + 0x1p-11 + 0x1p-19) << qmax;
    EXPECT_LT(c * qmax, 1.0 + 0x1p-10) << qmax;
  }
  EXPECT_EQ(static_cast<double>(kAffineScaleBias), std::ldexp(1.0, -25));
}

// AffineDecode runs as fma(s, q, -(s z)) (one FFMA per value on the GPU);
// with a stored scale (every finite positive FP16 value) and zero point
// (an integer <= 255) s z is exact, so it is s (q - z) rounded once: the
// double product of the exact difference, rounded to float.
TEST(AffineDecode, EqualsTheOnceRoundedProductForStoredScales) {
  uint64_t mismatches = 0;
  for (uint32_t bits = 1; bits < 0x7c00u; ++bits) {
    const float s = HalfBitsToFloat(static_cast<uint16_t>(bits));
    for (const int z : {0, 1, 15, 127, 128, 200, 255}) {
      for (int q = 0; q <= 255; ++q) {
        const float want = static_cast<float>(static_cast<double>(s) * (q - z));
        const float got = AffineDecode(static_cast<uint8_t>(q), s, static_cast<float>(z));
        if (FloatToBits(got) != FloatToBits(want) && !(got == 0.0f && want == 0.0f)) ++mismatches;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

// With a row factor folded in (the decode kernels' decay), s' z is rounded
// once: the result is within half an ulp of s' z plus the FMA's own rounding
// of the exact s' (q - z).
TEST(AffineDecode, WithARowFactorStaysWithinHalfAnUlpOfTheZeroPointProduct) {
  const float s = HalfBitsToFloat(FloatToHalfBits(0.0123f));
  for (const float a : {0.999f, 0.5f, 0.12345f, 1e-3f}) {
    const float sa = a * s;
    for (const int z : {0, 3, 77, 255}) {
      const double sz = static_cast<double>(sa) * z;
      const double ulp = std::nextafter(static_cast<float>(sz), 1e30f) - static_cast<float>(sz);
      for (int q = 0; q <= 255; ++q) {
        const double exact = static_cast<double>(sa) * (q - z);
        const float got = AffineDecode(static_cast<uint8_t>(q), sa, static_cast<float>(z));
        // The FMA's own rounding (half an ulp of the result) plus s' z's.
        const double bound = ulp / 2 + std::fabs(exact) * 0x1p-24 + 1e-45;
        EXPECT_LE(std::fabs(got - exact), bound) << "a " << a << " z " << z << " q " << q;
      }
    }
  }
}

// Host side of ReciprocalInRange is the division; the parameters it feeds
// must keep the documented convention: s is at least the range / qmax (by a
// margin of about an FP16 step), z = rint(-min / s), the range's low end
// codes to 0 and its high end to qmax or just below.
TEST(MakeAffineParams, RangeEndsEncodeToZeroAndTheTopCodes) {
  struct Case {
    float mn, mx;
    int qmax;
  };
  for (const Case c : {Case{-1.5f, 2.25f, 255}, Case{-1.0f, 3.0f, 255}, Case{0.0f, 1.0f, 255},
                       Case{-0.75f, 0.0f, 255}, Case{-1.5f, 2.25f, 15}, Case{-3e-3f, 7e-2f, 15}}) {
    const AffineParams p = MakeAffineParams(c.mn, c.mx, c.qmax);
    const double s = HalfBitsToFloat(p.s_bits);
    EXPECT_EQ(p.inv_s, 1.0f / static_cast<float>(s));
    EXPECT_GE(s, (static_cast<double>(c.mx) - c.mn) / c.qmax) << c.mn << " " << c.mx;
    EXPECT_EQ(p.z, std::nearbyint(-static_cast<double>(c.mn) * p.inv_s));
    EXPECT_EQ(p.z, HalfBitsToFloat(p.z_bits));
    EXPECT_EQ(AffineEncode(c.mn, p, c.qmax), 0);
    EXPECT_GE(AffineEncode(c.mx, p, c.qmax), c.qmax - 1) << c.mn << " " << c.mx;
  }
  // -1.5 .. 2.25 at 8 bits: s = RN(3.75 (1 + 2^-11 + 2^-18) / 255 + 2^-25) =
  // 1928 x 2^-17 (the exact quotient is 1927.53 x 2^-17), z = rint(1.5 / s) =
  // rint(101.98) = 102, 2.25 -> rint(152.96 + 102) = 255.
  const AffineParams p = MakeAffineParams(-1.5f, 2.25f, 255);
  EXPECT_EQ(HalfBitsToFloat(p.s_bits), 1928 * 0x1p-17f);
  EXPECT_EQ(p.z, 102.0f);
  EXPECT_EQ(AffineEncode(2.25f, p, 255), 255);
}

// QuotientBy127 (MakeSymScale's device form) is the IEEE quotient a / 127:
// every mantissa of [1, 2), of the binade holding kMinGroupAbsMax and of the
// top binade (a power of two scales each of its steps exactly in between).
TEST(MakeSymScale, QuotientBy127IsTheIeeeQuotient) {
  int64_t bad = 0;
  for (const uint32_t binade : {0x3f800000u, FloatToBits(kMinGroupAbsMax) & 0xff800000u,
                                0x7f000000u}) {
    for (uint32_t m = 0; m < (1u << 23); ++m) {
      const float a = BitsToFloat(binade | m);
      bad += FloatToBits(QuotientBy127(a)) != FloatToBits(a / kSymI8Max);
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(kRecip127, 1.0f / 127.0f);
  // The ends of the scale's range, and an infinite group (s = inf, 1 / s = 0).
  EXPECT_EQ(MakeSymScale(0.0f), kMinGroupAbsMax / kSymI8Max);
  EXPECT_EQ(MakeSymScale(3.0e38f), 3.0e38f / kSymI8Max);
  EXPECT_EQ(MakeSymScale(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(SymInverseScale(std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(SymInverseScale(MakeSymScale(2.54f)), 1.0f / (2.54f / 127.0f));
}

TEST(MakeAffineParams, DegenerateGroupsAreZero) {
  for (const float v : {0.0f, -0.0f}) {
    const AffineParams p = MakeAffineParams(v, v, 255);
    EXPECT_EQ(p.s_bits, 0);
    EXPECT_EQ(p.z_bits, 0);
    EXPECT_EQ(AffineEncode(v, p, 255), 0);
  }
  // A range below about 1e-12 still rounds to s = 0: all-zero codes.
  const AffineParams tiny = MakeAffineParams(-1e-30f, 3e-30f, 255);
  EXPECT_EQ(tiny.s_bits, 0);
  EXPECT_EQ(AffineEncode(3e-30f, tiny, 255), 0);
  // A small one gets at least the least FP16 step (2^-24) and keeps its shape.
  const AffineParams small = MakeAffineParams(-2e-7f, 1e-6f, 255);
  EXPECT_EQ(small.s_bits, 0x0001);
  EXPECT_EQ(AffineEncode(-2e-7f, small, 255), 0);
  EXPECT_EQ(small.z, 3.0f);                             // rint(2e-7 * 2^24 = 3.36)
  EXPECT_EQ(AffineEncode(1e-6f, small, 255), 20);       // rint(16.78 + 3)
}

// The CUDA encoders rely on two bounds of the shared parameters (see
// tile_codec.cuh): the symmetric int8 code never reaches SymEncode's clamp,
// and the affine codes never reach AffineEncode's clamp whenever the FP16
// scale did not saturate (the proof at MakeAffineParams). Both are checked
// here on a dense sweep of group ranges (every 61st positive finite float:
// all exponents, ~35 million ranges), in double, where the products are exact.
constexpr uint32_t kMaxFiniteBits = 0x7f7fffffu;
constexpr uint32_t kSweepStride = 61;

TEST(MakeSymScale, CodesNeverReachTheClamp) {
  uint64_t bad = 0;
  uint32_t first_bad = 0;
  for (uint64_t b = 1; b <= kMaxFiniteBits; b += kSweepStride) {
    const float absmax = BitsToFloat(static_cast<uint32_t>(b));
    const float inv_s = 1.0f / MakeSymScale(absmax);  // the kernel's reciprocal
    // |x| <= absmax for every x of the group; rint(x / s) stays in
    // [-127, 127] when |x * inv_s| < 127.5.
    if (!(static_cast<double>(absmax) * inv_s < 127.5) && bad++ == 0) first_bad = b;
  }
  EXPECT_EQ(bad, 0u) << "first absmax bits 0x" << std::hex << first_bad;
}

// The unclamped code of x, rint(x * inv_s + z) of the exact value, in double.
double UnclampedCode(float x, const AffineParams& p) {
  return std::nearbyint(static_cast<double>(x) * p.inv_s + p.z);
}

void ExpectAffineCodesNeedNoClamp(int qmax) {
  uint64_t bad = 0, saturated = 0, coarse = 0;
  float first_mn = 0, first_mx = 0;
  const auto check = [&](float mn, float mx) {
    const AffineParams p = MakeAffineParams(mn, mx, qmax);
    if (p.s_bits == kFp16MaxBits) {  // saturated: the exact encoder's case
      ++saturated;
      return;
    }
    // The margin costs s at most about 2^-11 plus half an FP16 step over the
    // exact range / qmax (the accuracy price of the dead clamp: < 0.2%).
    const double exact_s = (static_cast<double>(mx) - mn) / qmax;
    coarse += HalfBitsToFloat(p.s_bits) > exact_s * (1.0 + 0x1p-9) + 0x1p-24;
    // Codes are monotonic in x, so the range's ends bound every code.
    const double lo = UnclampedCode(mn, p), hi = UnclampedCode(mx, p);
    // The encoder's float formula is that rounding, with no clamp to apply.
    const bool ok = lo >= 0 && hi <= qmax && AffineRound(mn, p.inv_s, p.z) == lo &&
                    AffineRound(mx, p.inv_s, p.z) == hi;
    if (!ok && bad++ == 0) {
      first_mn = mn;
      first_mx = mx;
    }
  };
  for (uint64_t b = 1; b <= kMaxFiniteBits; b += kSweepStride) {
    const float d = BitsToFloat(static_cast<uint32_t>(b));
    // Ends of groups containing 0, in several proportions (the zero point's
    // rounding moves with the low end's fraction).
    check(0.0f, d);
    check(-d, 0.0f);
    check(-d / 3.0f, d);
    check(-d, d / 7.0f);
    check(-d * 0.4996f, d);
  }
  EXPECT_EQ(bad, 0u) << "qmax " << qmax << ", first range [" << first_mn << ", " << first_mx
                     << "]";
  EXPECT_GT(saturated, 0u) << "the sweep must reach saturated scales too";
  EXPECT_EQ(coarse, 0u) << "qmax " << qmax;
}

TEST(MakeAffineParams, CodesNeedNoClampUnlessTheScaleSaturated) {
  ExpectAffineCodesNeedNoClamp(255);
  ExpectAffineCodesNeedNoClamp(15);
}

}  // namespace
}  // namespace statecache
