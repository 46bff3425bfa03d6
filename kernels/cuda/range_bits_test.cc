#include "kernels/cuda/internal/range_bits.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/formats/group_quant.h"
#include "kernels/formats/numeric.h"

namespace statecache {
namespace cuda_internal {
namespace {

// The float definition MakeAffineParams sees: min(min x, 0), max(max x, 0).
float ClampedMin(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = x[i] < m ? x[i] : m;
  return m;
}
float ClampedMax(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// A lane pair's halves of a 32-value group, combined as the kernels do.
void ExpectGroupRange(const std::vector<float>& g) {
  ASSERT_EQ(g.size(), 32u);
  const RangeBits r = MaxRange(LaneRangeBits<16>(g.data()), LaneRangeBits<16>(g.data() + 16));
  const float want_min = ClampedMin(g.data(), 32), want_max = ClampedMax(g.data(), 32);
  // Bitwise (a -0.0 minimum clamps to +0.0 in both definitions' use:
  // MakeAffineParams tests < 0).
  EXPECT_EQ(FloatToBits(RangeMin(r) == 0.0f ? 0.0f : RangeMin(r)),
            FloatToBits(want_min == 0.0f ? 0.0f : want_min));
  EXPECT_EQ(FloatToBits(RangeMax(r)), FloatToBits(want_max));
  // And the parameters (hence the bytes) are the same.
  for (int qmax : {15, 255}) {
    const AffineParams a = MakeAffineParams(RangeMin(r), RangeMax(r), qmax);
    const AffineParams b = MakeAffineParams(want_min, want_max, qmax);
    EXPECT_EQ(a.s_bits, b.s_bits);
    EXPECT_EQ(a.z_bits, b.z_bits);
  }
}

TEST(LaneRangeBits, EqualsTheClampedFloatRangeOnRandomGroups) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-140, 120);
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<float> g(32);
    const float scale = std::ldexp(1.0f, exponent(rng));
    const int mode = trial % 4;  // mixed signs, all positive, all negative, mostly zero
    for (float& x : g) {
      x = normal(rng) * scale;
      if (mode == 1) x = std::fabs(x);
      if (mode == 2) x = -std::fabs(x);
      if (mode == 3 && (rng() & 3) != 0) x = (rng() & 1) ? 0.0f : -0.0f;
    }
    ExpectGroupRange(g);
  }
}

TEST(LaneRangeBits, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float denorm = std::numeric_limits<float>::denorm_min();
  const float big = std::numeric_limits<float>::max();
  std::vector<std::vector<float>> cases;
  cases.push_back(std::vector<float>(32, 0.0f));
  cases.push_back(std::vector<float>(32, -0.0f));
  std::vector<float> g(32, 1.0f);
  g[7] = -inf;
  cases.push_back(g);
  g.assign(32, -1.0f);
  g[20] = inf;
  cases.push_back(g);
  g.assign(32, denorm);
  g[3] = -denorm;
  cases.push_back(g);
  g.assign(32, -big);
  g[31] = big;
  cases.push_back(g);
  g.assign(32, -0.0f);
  g[16] = 3.0f;  // the maximum in the second lane's half
  cases.push_back(g);
  for (const auto& c : cases) ExpectGroupRange(c);
}

}  // namespace
}  // namespace cuda_internal
}  // namespace statecache
