#include "kernels/calibration/scores.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

using ::testing::ElementsAre;

// Two key channels, computed by hand:
//   channel 0: E = 4,  a_eff = 0.5 -> P = 1 / (1 - 0.25) = 4/3,  C = 16/3
//   channel 1: E = 1,  a_eff = 0.9 -> P = 1 / (1 - 0.81) = 1/0.19, C = 5.263...
// so E, energy and E*P prefer channel 0 (16/3 = 5.333 > 5.263) while P
// prefers channel 1; the horizon score is taken as given.
struct TwoChannels {
  double energy[2] = {10.0, 20.0};
  double error[2] = {4.0, 1.0};
  double horizon[2] = {5.0, 7.0};
  double log_a[2] = {std::log(0.5), std::log(0.9)};
  double q2[2] = {0.5, 0.25};
  ChannelStatsView View() const { return {energy, error, horizon, log_a, q2, 2}; }
};

TEST(ScoresTest, HandComputedTwoChannelExample) {
  const TwoChannels t;
  const ScoreOptions o;  // tau = 1e-4
  EXPECT_THAT(ChannelScores(Selector::kEnergy, t.View(), o), ElementsAre(10.0, 20.0));
  EXPECT_THAT(ChannelScores(Selector::kError, t.View(), o), ElementsAre(4.0, 1.0));
  const std::vector<double> p = ChannelScores(Selector::kPersistence, t.View(), o);
  EXPECT_NEAR(p[0], 4.0 / 3.0, 1e-12);
  EXPECT_NEAR(p[1], 1.0 / 0.19, 1e-9);
  const std::vector<double> c = ChannelScores(Selector::kErrorPersistence, t.View(), o);
  EXPECT_NEAR(c[0], 16.0 / 3.0, 1e-12);
  EXPECT_NEAR(c[1], 1.0 / 0.19, 1e-9);
  EXPECT_THAT(ChannelScores(Selector::kHorizon, t.View(), o), ElementsAre(5.0, 7.0));
  // Readout-weighted: 16/3 * 0.5 = 2.667 vs 5.263 * 0.25 = 1.316.
  const std::vector<double> r = ChannelScores(Selector::kReadout, t.View(), o);
  EXPECT_NEAR(r[0], 8.0 / 3.0, 1e-12);
  EXPECT_NEAR(r[1], 0.25 / 0.19, 1e-9);
  EXPECT_THAT(TopK(c, 1), ElementsAre(0));
  EXPECT_THAT(TopK(p, 1), ElementsAre(1));
  EXPECT_THAT(TopK(ChannelScores(Selector::kEnergy, t.View(), o), 1), ElementsAre(1));
}

TEST(ScoresTest, PersistenceIsCappedByTau) {
  EXPECT_DOUBLE_EQ(Persistence(1.0, 1e-4), 1e4);
  EXPECT_DOUBLE_EQ(Persistence(0.99999, 1e-4), 1e4);  // 1 - a^2 = 2e-5 < tau
  EXPECT_DOUBLE_EQ(Persistence(0.0, 1e-4), 1.0);
  EXPECT_NEAR(Persistence(0.99, 1e-4), 1.0 / (1.0 - 0.9801), 1e-9);
}

TEST(ScoresTest, RandomSelectorIsSeededAndSeedSensitive) {
  const TwoChannels t;
  ScoreOptions a, b;
  a.random_seed = 1;
  b.random_seed = 2;
  EXPECT_EQ(ChannelScores(Selector::kRandom, t.View(), a),
            ChannelScores(Selector::kRandom, t.View(), a));
  EXPECT_NE(ChannelScores(Selector::kRandom, t.View(), a),
            ChannelScores(Selector::kRandom, t.View(), b));
}

TEST(ScoresTest, TopKOrdersByScoreThenIndex) {
  EXPECT_THAT(TopK({1.0, 3.0, 3.0, 2.0, 5.0}, 3), ElementsAre(4, 1, 2));
  EXPECT_THAT(TopK({1.0, 2.0}, 0), ElementsAre());
  EXPECT_THAT(TopK({1.0, 2.0}, 5), ElementsAre(1, 0));
}

TEST(ScoresTest, PermutationIsAStablePartition) {
  // Selected {6, 1, 4} (in score order) -> hi part in increasing order, then
  // the rest in increasing order.
  EXPECT_THAT(StablePartitionPermutation(8, {6, 1, 4}), ElementsAre(1, 4, 6, 0, 2, 3, 5, 7));
  EXPECT_THAT(StablePartitionPermutation(4, {}), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(StablePartitionPermutation(3, {0, 1, 2}), ElementsAre(0, 1, 2));
  // Property check on a larger case: a permutation, selected first, both
  // parts increasing.
  std::vector<int32_t> sel = {100, 3, 77, 64, 5, 127, 0, 31};
  std::vector<int32_t> perm = StablePartitionPermutation(128, sel);
  std::vector<bool> seen(128, false);
  for (int r = 0; r < 128; ++r) {
    ASSERT_FALSE(seen[perm[r]]);
    seen[perm[r]] = true;
    const bool in_sel = std::find(sel.begin(), sel.end(), perm[r]) != sel.end();
    EXPECT_EQ(in_sel, r < 8) << r;
    if (r != 0 && r != 8) {
      EXPECT_LT(perm[r - 1], perm[r]) << r;
    }
  }
}

TEST(ScoresTest, SpearmanWithTies) {
  EXPECT_DOUBLE_EQ(SpearmanCorrelation({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(SpearmanCorrelation({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  // Ranks a: 0,1,2,3 ; b with a tie: 0, 1.5, 1.5, 3 -> r = 4.5 / sqrt(5 * 4.5).
  EXPECT_NEAR(SpearmanCorrelation({1, 2, 3, 4}, {1, 2, 2, 4}), 4.5 / std::sqrt(5 * 4.5), 1e-12);
  EXPECT_DOUBLE_EQ(SpearmanCorrelation({1, 1, 1}, {1, 2, 3}), 0.0);
  EXPECT_EQ(Intersection({1, 2, 3}, {3, 4, 1}), 2);
}

TEST(ScoresTest, ParseSelector) {
  for (Selector s : AllSelectors()) EXPECT_EQ(*ParseSelector(SelectorName(s)), s);
  EXPECT_EQ(ParseSelector("EP").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace statecache
