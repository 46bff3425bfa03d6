// GlibcExpf (glibc_expf.h) against the host's std::exp(float): bit-identical
// over the gate range and the edges, where a plain (float)exp(double) is not.
#include "kernels/cuda/glibc_expf.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace statecache {
namespace {

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

TEST(GlibcExpfTest, MatchesStdExpOnRandomGates) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> wide(-110.0f, 90.0f);
  std::uniform_real_distribution<float> gate(0.0f, 1.0f);
  int64_t mismatches = 0, double_route_mismatches = 0;
  constexpr int kSamples = 2000000;
  for (int i = 0; i < kSamples; ++i) {
    const float x = (i % 2) ? wide(rng) : std::log(0.5f + 0.5f * gate(rng));
    const float want = std::exp(x);
    mismatches += !SameBits(GlibcExpf(x), want);
    double_route_mismatches += !SameBits(static_cast<float>(std::exp(static_cast<double>(x))), want);
  }
  EXPECT_EQ(mismatches, 0);
  // The reason this file exists: the double route is not glibc's rounding.
  EXPECT_GT(double_route_mismatches, 0);
}

TEST(GlibcExpfTest, MatchesStdExpOnEveryFloatNearZeroAndAtTheEdges) {
  // Every float in [-1, 0] with a stride, and the overflow / underflow edges.
  int64_t mismatches = 0;
  for (uint32_t u = 0x80000000u; u <= 0xbf800000u; u += 97) {
    float x;
    std::memcpy(&x, &u, 4);
    mismatches += !SameBits(GlibcExpf(x), std::exp(x));
  }
  for (float x : {0.0f, -0.0f, 1.0f, -1.0f, 88.7f, 0x1.62e42ep6f, 89.0f, -87.0f, -100.0f,
                  -0x1.9fe368p6f, -104.0f, -1e30f, -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::infinity()}) {
    EXPECT_TRUE(SameBits(GlibcExpf(x), std::exp(x))) << x;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_TRUE(std::isnan(GlibcExpf(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace statecache
