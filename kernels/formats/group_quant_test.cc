#include "kernels/formats/group_quant.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "gtest/gtest.h"

namespace statecache {
namespace {

// The affine scale's quotient (mx - mn) / qmax runs as a multiply and one
// FMA correction; it must equal IEEE division bit for bit on every input the
// quantizer can give it: all non-negative floats, infinity and NaN.
void ExpectQuotientMatchesDivision(int d) {
  uint64_t mismatches = 0;
  uint32_t first_bad = 0;
  for (uint64_t b = 0; b <= 0x7fffffffu; ++b) {
    const uint32_t u = static_cast<uint32_t>(b);
    const float x = BitsToFloat(u);
    const float want = x / static_cast<float>(d);
    const float got = QuotientByReciprocal(x, d);
    const bool same = FloatToBits(got) == FloatToBits(want) || (want != want && got != got);
    if (!same && mismatches++ == 0) first_bad = u;
  }
  EXPECT_EQ(mismatches, 0u) << "d = " << d << ", first input bits 0x" << std::hex << first_bad;
}

TEST(QuotientByReciprocal, EqualsDivisionByInt8QmaxForAllNonNegativeFloats) {
  ExpectQuotientMatchesDivision(255);
}

TEST(QuotientByReciprocal, EqualsDivisionByInt4QmaxForAllNonNegativeFloats) {
  ExpectQuotientMatchesDivision(15);
}

TEST(QuotientByReciprocal, SpecialValues) {
  const float inf = 1.0f / 0.0f;
  EXPECT_EQ(QuotientByReciprocal(inf, 255), inf);
  EXPECT_EQ(QuotientByReciprocal(0.0f, 255), 0.0f);
  EXPECT_EQ(QuotientByReciprocal(255.0f, 255), 1.0f);
  EXPECT_EQ(QuotientByReciprocal(3.0f, 15), 0.2f);
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

// Host side of ReciprocalOfHalf is the division; the parameters it feeds
// must keep the documented convention (codes of the range's ends).
TEST(MakeAffineParams, EndsOfTheRangeEncodeToZeroAndQmax) {
  const AffineParams p = MakeAffineParams(-1.5f, 2.25f, 255);
  EXPECT_EQ(p.inv_s, 1.0f / HalfBitsToFloat(p.s_bits));
  EXPECT_EQ(AffineEncode(-1.5f, p, 255), 0);
  EXPECT_EQ(AffineEncode(2.25f, p, 255), 255);
  EXPECT_EQ(p.z, HalfBitsToFloat(p.z_bits));
}

// The CUDA encoders rely on two bounds of the shared parameters (see
// tile_codec.cuh): the symmetric int8 code never reaches SymEncode's clamp,
// and the affine fast encoder's 16-bit arithmetic is exact (|x / s| < 2^14)
// whenever the FP16 scale did not saturate. Both are checked here on a dense
// sweep of group ranges (every 61st positive finite float: all exponents,
// ~35 million ranges), in double, where the products are exact.
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

void ExpectAffineFastPathBound(int qmax) {
  uint64_t bad = 0, saturated = 0;
  float first_mn = 0, first_mx = 0;
  for (uint64_t b = 1; b <= kMaxFiniteBits; b += kSweepStride) {
    const float d = BitsToFloat(static_cast<uint32_t>(b));
    // The group's widest value is at an end of [mn, mx] (which contains 0).
    for (const auto& [mn, mx] :
         {std::pair<float, float>{0.0f, d}, {-d, 0.0f}, {-d / 3.0f, d}, {-d, d / 7.0f}}) {
      const AffineParams p = MakeAffineParams(mn, mx, qmax);
      if (p.s_bits == kFp16MaxBits) {  // saturated: the exact encoder's case
        ++saturated;
        continue;
      }
      const double widest = std::max(-static_cast<double>(mn), static_cast<double>(mx));
      if (!(widest * p.inv_s < 16384.0) && bad++ == 0) {
        first_mn = mn;
        first_mx = mx;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "qmax " << qmax << ", first range [" << first_mn << ", " << first_mx
                     << "]";
  EXPECT_GT(saturated, 0u) << "the sweep must reach saturated scales too";
}

TEST(MakeAffineParams, FastEncoderIsExactUnlessTheScaleSaturated) {
  ExpectAffineFastPathBound(255);
  ExpectAffineFastPathBound(15);
}

}  // namespace
}  // namespace statecache
