#include "kernels/formats/numeric.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace statecache {
namespace {

TEST(HalfTest, ExactValuesRoundTrip) {
  for (float x : {0.0f, 1.0f, -2.5f, 0.099975586f, 65504.0f, -65504.0f, 6.1035156e-05f,
                  5.9604645e-08f}) {
    EXPECT_EQ(HalfBitsToFloat(FloatToHalfBits(x)), x) << x;
  }
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xc000);
}

TEST(HalfTest, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9: rounds up.
  EXPECT_EQ(FloatToHalfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalfBits(1.0f + 1.1f * std::ldexp(1.0f, -11)), 0x3c01);
}

TEST(HalfTest, SaturatesInsteadOfOverflowing) {
  EXPECT_EQ(FloatToHalfBits(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(1e30f), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(-1e30f), 0xfbff);
}

TEST(HalfTest, SubnormalsAndUnderflow) {
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(FloatToHalfBits(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: ties to even
  EXPECT_EQ(HalfBitsToFloat(0x03ff), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToHalfBits(1e-40f), 0x0000);
}

TEST(HalfTest, AllHalfValuesRoundTripExactly) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / nan are never stored
    const float f = HalfBitsToFloat(static_cast<uint16_t>(h));
    const uint16_t back = FloatToHalfBits(f);
    if (h == 0x8000) {
      EXPECT_EQ(back, 0x8000);
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

// The portable conversions (what CUDA device code runs) and the ones the
// host uses (F16C where available) give identical bits.
TEST(HalfTest, PortableAndHostConversionsAgree) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(FloatToBits(HalfBitsToFloat(h)), FloatToBits(HalfBitsToFloatPortable(h))) << h;
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t bits = rng();
    const float f = BitsToFloat(bits);
    if (!std::isfinite(f)) continue;
    ASSERT_EQ(FloatToHalfBits(f), FloatToHalfBitsPortable(f)) << std::hex << bits;
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 1e9f, -1e9f, 6.1035156e-05f, 2.98e-8f, 2.99e-8f}) {
    EXPECT_EQ(FloatToHalfBits(f), FloatToHalfBitsPortable(f)) << f;
  }
}

TEST(Bf16Test, RoundsAndSaturates) {
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(Bf16BitsToFloat(FloatToBf16Bits(3.140625f)), 3.140625f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even.
  EXPECT_EQ(FloatToBf16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::max()), 0x7f7f);
}

TEST(E4m3Test, GridAndSaturation) {
  EXPECT_EQ(E4m3ToFloat(FloatToE4m3(448.0f)), 448.0f);
  EXPECT_EQ(E4m3ToFloat(FloatToE4m3(1000.0f)), 448.0f);
  EXPECT_EQ(E4m3ToFloat(FloatToE4m3(-1000.0f)), -448.0f);
  EXPECT_EQ(E4m3ToFloat(FloatToE4m3(1.0f)), 1.0f);
  EXPECT_EQ(E4m3ToFloat(FloatToE4m3(0.001953125f)), 0.001953125f);  // smallest subnormal
  EXPECT_EQ(E4m3ToFloat(FloatToE4m3(0.0009765625f)), 0.0f);           // half of it: ties to 0
  EXPECT_EQ(E4m3ToFloat(FloatToE4m3(1.0625f)), 1.0f);                 // tie -> even mantissa
  EXPECT_EQ(E4m3ToFloat(FloatToE4m3(1.1875f)), 1.25f);                // tie -> even mantissa
  // Every code except NaN decodes and re-encodes to itself.
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float f = E4m3ToFloat(static_cast<uint8_t>(c));
    if (c == 0x80) continue;  // -0
    EXPECT_EQ(FloatToE4m3(f), c) << c;
  }
}

TEST(E2m1Test, GridTiesAndSaturation) {
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(E2m1ToFloat(static_cast<uint8_t>(c)), grid[c]);
    EXPECT_EQ(E2m1ToFloat(static_cast<uint8_t>(c | 8)), -grid[c]);
    EXPECT_EQ(FloatToE2m1(grid[c]), c);
  }
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(0.25f)), 0.0f);
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(0.75f)), 1.0f);
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(2.5f)), 2.0f);
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(5.0f)), 4.0f);
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(100.0f)), 6.0f);
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(-2.9f)), -3.0f);
}

}  // namespace
}  // namespace statecache
