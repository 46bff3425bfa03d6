#include "kernels/stepquant/calibration.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/layout/layout_file.h"
#include "kernels/trajectory/synthetic.h"

namespace statecache {
namespace {

AllocationProblem Problem(std::vector<std::vector<double>> weighted, std::vector<double> risk,
                          int nominal, int pivots) {
  AllocationProblem p;
  p.candidates = {4, 6, 8};
  p.unit_values.assign(weighted.size(), 128);
  p.weighted = std::move(weighted);
  p.risk = std::move(risk);
  p.nominal_bits = nominal;
  p.num_pivots = pivots;
  return p;
}

TEST(AllocateBitsTest, SpendsBitsWhereTheyBuyMostDistortion) {
  absl::StatusOr<std::vector<int>> bits =
      AllocateBits(Problem({{100, 10, 1}, {1, 0.1, 0.01}}, {0, 0}, 6, 0));
  ASSERT_TRUE(bits.ok()) << bits.status();
  EXPECT_EQ(*bits, (std::vector<int>{8, 4}));
}

TEST(AllocateBitsTest, PivotsAreTheHighestRiskUnitsAndCountAsEightBits) {
  // Budget 6 * 3 - 8 = 10 units of 128 values for two units from 4 bits: one
  // upgrade to 6 fits, the more valuable one.
  absl::StatusOr<std::vector<int>> bits =
      AllocateBits(Problem({{5, 1, 0}, {9, 1, 0}, {7, 1, 0}}, {1, 5, 2}, 6, 1));
  ASSERT_TRUE(bits.ok()) << bits.status();
  EXPECT_EQ(*bits, (std::vector<int>{4, 16, 6}));
}

TEST(AllocateBitsTest, SkipsNonConvexPointsAndIsDeterministicOnTies) {
  // Unit 0: 6 bits buys nothing over 4, 8 bits buys a lot: the hull jumps 4->8.
  absl::StatusOr<std::vector<int>> bits =
      AllocateBits(Problem({{10, 10, 0}, {10, 10, 0}}, {0, 0}, 6, 0));
  ASSERT_TRUE(bits.ok());
  EXPECT_EQ(*bits, (std::vector<int>{8, 4}));  // equal gains: lower index first
}

TEST(AllocateBitsTest, BadProblemsAreInvalidArgument) {
  AllocationProblem p = Problem({{1, 1, 1}}, {0}, 6, 0);
  p.candidates = {6, 4, 8};
  EXPECT_EQ(AllocateBits(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Problem({{1, 1}}, {0}, 6, 0);
  EXPECT_EQ(AllocateBits(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Problem({{1, 1, 1}}, {0, 1}, 6, 0);
  EXPECT_EQ(AllocateBits(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Problem({{1, 1, 1}}, {0}, 3, 0);  // 3 bits cannot hold a 4-bit unit
  const absl::Status s = AllocateBits(p).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("budget"), absl::string_view::npos);
  p = Problem({{1, 1, 1}}, {0}, 6, 2);
  EXPECT_EQ(AllocateBits(p).status().code(), absl::StatusCode::kInvalidArgument);
}

std::vector<Trajectory> Synthetic(Arch arch, int docs, int tokens) {
  std::vector<Trajectory> out;
  for (int d = 0; d < docs; ++d) {
    SyntheticOptions o;
    o.geometry = ModelGeometry{arch, 2, 2, arch == Arch::kKda ? 2 : 4, 64, 64};
    o.tokens = tokens;
    o.seed = 100 + d;
    out.push_back(*MakeSyntheticTrajectory(o));
  }
  return out;
}

TEST(CalibrateStepQuantTest, GdnHeadsGetOneWidthAndBeatUniformAllocation) {
  const std::vector<Trajectory> trajs = Synthetic(Arch::kGdn, 2, 256);
  StepQuantOptions opts;
  opts.pivot_fraction = 0;
  absl::StatusOr<StepQuantCalibration> cal = CalibrateStepQuant(trajs, {StateFormat::kStepQuant4, 0}, opts);
  ASSERT_TRUE(cal.ok()) << cal.status();
  const StateLayout& l = cal->layout;
  ASSERT_EQ(cal->unit_bits.size(), 8u);
  EXPECT_TRUE(l.identity_key_perm());
  EXPECT_EQ(cal->state_samples, 2 * 256 / 8);
  for (int layer = 0; layer < 2; ++layer) {
    for (int h = 0; h < 4; ++h) {
      const int8_t* b = l.row_bits(layer, h);
      for (int r = 0; r < 64; ++r) ASSERT_EQ(b[r], cal->unit_bits[layer * 4 + h]);
    }
  }
  EXPECT_LE(cal->nominal_code_bits, 4.0 + 1e-12);
  // The allocation's weighted distortion is no worse than all-4-bit.
  double alloc = 0, uniform = 0;
  for (size_t u = 0; u < 8; ++u) {
    const auto& c = cal->candidates;
    const size_t i = std::find(c.begin(), c.end(), cal->unit_bits[u]) - c.begin();
    alloc += cal->lifetime_weight[u] * cal->distortion[u][i];
    uniform += cal->lifetime_weight[u] * cal->distortion[u][1];
  }
  EXPECT_LE(alloc, uniform);
  // Distortion falls with width; lifetime weights lie in [1, H].
  for (size_t u = 0; u < 8; ++u) {
    EXPECT_GT(cal->distortion[u][0], cal->distortion[u][3]);
    EXPECT_GE(cal->lifetime_weight[u], 1.0);
    EXPECT_LE(cal->lifetime_weight[u], 256.0);
    EXPECT_LE(cal->mean_log_retention[u], 0.0);
  }
  // Provenance for the layout file.
  EXPECT_EQ(cal->Info().at("stepquant.candidates"), "3,4,6,8");
}

TEST(CalibrateStepQuantTest, KdaRowsArePermutedByWidthWithPivotsFirst) {
  const std::vector<Trajectory> trajs = Synthetic(Arch::kKda, 1, 256);
  StepQuantOptions opts;
  opts.pivot_fraction = 4.0 / 256;  // 4 of 2 x 2 x 64 rows
  absl::StatusOr<StepQuantCalibration> cal = CalibrateStepQuant(trajs, {StateFormat::kStepQuant6, 0}, opts);
  ASSERT_TRUE(cal.ok()) << cal.status();
  EXPECT_EQ(cal->num_pivots, 4);
  const StateLayout& l = cal->layout;
  int pivots = 0;
  for (int layer = 0; layer < 2; ++layer) {
    for (int h = 0; h < 2; ++h) {
      const int8_t* b = l.row_bits(layer, h);
      const int32_t* perm = l.key_perm(layer, h);
      float max_w = 0;
      for (int r = 0; r < 64; ++r) {
        EXPECT_EQ(b[r], cal->unit_bits[(layer * 2 + h) * 64 + perm[r]]);
        if (r > 0) {
          EXPECT_LE(b[r], b[r - 1]);
        }
        pivots += b[r] == 16;
        const float w = l.row_impact(layer, h)[r];
        EXPECT_GT(w, 0.0f);
        EXPECT_LE(w, 1.0f);
        max_w = std::max(max_w, w);
      }
      EXPECT_EQ(max_w, 1.0f);
    }
  }
  EXPECT_EQ(pivots, 4);
  EXPECT_LE(cal->nominal_code_bits, 6.0 + 1e-12);
  EXPECT_GT(cal->nominal_code_bits, 5.9);
  // Row impact scores omega are positive where keys and queries live.
  double sum = 0;
  for (double w : cal->row_impact_score) sum += w;
  EXPECT_GT(sum, 0.0);
  // The calibrated layout survives a layout file.
  absl::StatusOr<std::string> image = SerializeLayout(l, cal->Info(), {});
  ASSERT_TRUE(image.ok()) << image.status();
  absl::StatusOr<LayoutFile> back = ParseLayout(*image, &trajs[0].geometry, nullptr);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->layout.Fingerprint(), l.Fingerprint());
  EXPECT_EQ(back->info.at("stepquant.pivots"), "4");
}

// The readout-relative risks compare each head's error with its own readout
// energy: scaling one head's values by 64 (exact in FP32 and FP16) scales its
// state, readout and distortion by exact powers of two, so those allocations
// do not move, while the seed's absolute lifetime risk shifts bits to the
// scaled head.
TEST(CalibrateStepQuantTest, HeadRelativeRisksIgnoreAHeadsScale) {
  const std::vector<Trajectory> trajs = Synthetic(Arch::kKda, 1, 128);
  std::vector<Trajectory> scaled = trajs;
  const ModelGeometry& g = trajs[0].geometry;
  for (LayerInputs& in : scaled[0].layers) {
    for (int t = 0; t < scaled[0].tokens; ++t) {
      for (int j = 0; j < g.d_v; ++j) in.v[(int64_t{t} * g.h_v + 0) * g.d_v + j] *= 64.0f;
    }
  }
  using W = StepQuantOptions::RiskWeight;
  for (W w : {W::kLifetime, W::kHeadRelative, W::kReadout}) {
    StepQuantOptions opts;
    opts.risk_weight = w;
    absl::StatusOr<StepQuantCalibration> a = CalibrateStepQuant(trajs, {StateFormat::kStepQuant4, 0}, opts);
    absl::StatusOr<StepQuantCalibration> b = CalibrateStepQuant(scaled, {StateFormat::kStepQuant4, 0}, opts);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_LE(a->nominal_code_bits, 4.0 + 1e-12);
    // Bits given to head 0 of each layer (KDA units: [layer][head][row]).
    auto head0_bits = [&](const StepQuantCalibration& c) {
      int64_t sum = 0;
      for (int layer = 0; layer < g.layers; ++layer) {
        for (int r = 0; r < g.d_k; ++r) sum += c.unit_bits[int64_t{layer} * g.h_v * g.d_k + r];
      }
      return sum;
    };
    if (w == W::kLifetime) {
      EXPECT_GT(head0_bits(*b), head0_bits(*a));
    } else {
      EXPECT_EQ(a->unit_bits, b->unit_bits) << static_cast<int>(w);
    }
  }
  EXPECT_EQ(*ParseRiskWeight("readout"), W::kReadout);
  EXPECT_EQ(*ParseRiskWeight("head-relative"), W::kHeadRelative);
  EXPECT_EQ(*ParseRiskWeight("lifetime"), W::kLifetime);
  EXPECT_EQ(ParseRiskWeight("omega").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CalibrateStepQuantTest, AblationsAndBadInput) {
  const std::vector<Trajectory> trajs = Synthetic(Arch::kKda, 1, 64);
  StepQuantOptions opts;
  opts.allocate = false;
  opts.use_row_impact = false;
  absl::StatusOr<StepQuantCalibration> cal = CalibrateStepQuant(trajs, {StateFormat::kStepQuant4, 0}, opts);
  ASSERT_TRUE(cal.ok()) << cal.status();
  EXPECT_EQ(cal->layout.Fingerprint(),
            StateLayout::Identity(trajs[0].geometry, {StateFormat::kStepQuant4, 0})->Fingerprint());

  EXPECT_EQ(CalibrateStepQuant(trajs, {StateFormat::kDamp, 16}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CalibrateStepQuant({}, {StateFormat::kStepQuant4, 0}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<Trajectory> mixed = trajs;
  mixed.push_back(Synthetic(Arch::kGdn, 1, 64)[0]);
  EXPECT_EQ(CalibrateStepQuant(mixed, {StateFormat::kStepQuant4, 0}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  StepQuantOptions bad;
  bad.horizon = 0;
  EXPECT_EQ(CalibrateStepQuant(trajs, {StateFormat::kStepQuant4, 0}, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = StepQuantOptions{};
  bad.sample_every = 1000;  // no sample in 64 tokens
  EXPECT_EQ(CalibrateStepQuant(trajs, {StateFormat::kStepQuant4, 0}, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace statecache
