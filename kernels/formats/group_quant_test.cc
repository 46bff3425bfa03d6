#include "kernels/formats/group_quant.h"

#include <cstdint>

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

// Host side of ReciprocalOfHalf is the division; the parameters it feeds
// must keep the documented convention (codes of the range's ends).
TEST(MakeAffineParams, EndsOfTheRangeEncodeToZeroAndQmax) {
  const AffineParams p = MakeAffineParams(-1.5f, 2.25f, 255);
  EXPECT_EQ(p.inv_s, 1.0f / HalfBitsToFloat(p.s_bits));
  EXPECT_EQ(AffineEncode(-1.5f, p, 255), 0);
  EXPECT_EQ(AffineEncode(2.25f, p, 255), 255);
  EXPECT_EQ(p.z, HalfBitsToFloat(p.z_bits));
}

}  // namespace
}  // namespace statecache
