// SYNTHETIC accuracy ordering of STEPQuant on the CPU backend (calibrated on
// separate synthetic documents, replayed out of sample): the allocation beats
// the uniform ("spatial only") layout at the same bits, and both budgets beat
// int4 (5 bits/value). Regression guard for the numbers in docs/BENCHMARKS.md,
// which were measured with seed 002's allocation risk (kLifetime, H = 256):
// those options are pinned here; the defaults (kReadout, H = 16: they
// optimize each head's relative readout error, not this absolute state
// RRMSE) are checked with their own margins.
//
// One measured exception is pinned down too: KDA at 4 bits with the seed's
// risk gains nothing over the uniform layout on this synthetic spectrum
// (0.556 vs 0.540 state RRMSE); H = 16 recovers a gain (0.474), and so do
// the defaults (0.491).
#include <cstdio>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/eval/replay.h"
#include "kernels/stepquant/calibration.h"
#include "kernels/trajectory/synthetic.h"

namespace statecache {
namespace {

std::vector<Trajectory> Docs(const ModelGeometry& geo, std::vector<uint64_t> seeds, int tokens) {
  std::vector<Trajectory> out;
  for (uint64_t s : seeds) {
    SyntheticOptions o;
    o.geometry = geo;
    o.tokens = tokens;
    o.seed = s;
    out.push_back(*MakeSyntheticTrajectory(o));
  }
  return out;
}

double StateRrmse(Backend& backend, const StateLayout& layout, const std::vector<Trajectory>& eval) {
  absl::StatusOr<ReplayResult> r = ReplayAgainstFp32(backend, layout, eval, {});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->total.StateRrmse() : 1e9;
}

class OrderingTest : public ::testing::TestWithParam<Arch> {};

TEST_P(OrderingTest, AllocationBeatsUniformAndInt4) {
  const Arch arch = GetParam();
  const ModelGeometry geo{arch, 2, arch == Arch::kKda ? 4 : 2, 4, 64, 64};
  const std::vector<Trajectory> cal = Docs(geo, {1, 2}, 256);
  const std::vector<Trajectory> eval = Docs(geo, {101}, 512);
  auto backend = CpuBackend::Create({2});
  const double int4 = StateRrmse(*backend, *StateLayout::Identity(geo, {StateFormat::kInt4, 0}), eval);
  double calibrated[2];
  int i = 0;
  StepQuantOptions seed;
  seed.risk_weight = StepQuantOptions::RiskWeight::kLifetime;
  seed.horizon = 256;
  for (StateFormat f : {StateFormat::kStepQuant6, StateFormat::kStepQuant4}) {
    absl::StatusOr<StepQuantCalibration> c = CalibrateStepQuant(cal, {f, 0}, seed);
    ASSERT_TRUE(c.ok()) << c.status();
    absl::StatusOr<StepQuantCalibration> d = CalibrateStepQuant(cal, {f, 0}, {});
    ASSERT_TRUE(d.ok()) << d.status();
    const double uniform = StateRrmse(*backend, *StateLayout::Identity(geo, {f, 0}), eval);
    calibrated[i] = StateRrmse(*backend, c->layout, eval);
    const double defaults = StateRrmse(*backend, d->layout, eval);
    std::printf("%s %s: int4 %.4f uniform %.4f seed risk %.4f default risk %.4f\n", ArchName(arch),
                FormatName(f), int4, uniform, calibrated[i], defaults);
    const bool kda4 = arch == Arch::kKda && f == StateFormat::kStepQuant4;
    if (kda4) {
      StepQuantOptions short_horizon = seed;
      short_horizon.horizon = 16;
      absl::StatusOr<StepQuantCalibration> c16 = CalibrateStepQuant(cal, {f, 0}, short_horizon);
      ASSERT_TRUE(c16.ok()) << c16.status();
      EXPECT_LT(StateRrmse(*backend, c16->layout, eval), 0.95 * uniform);
    } else {
      EXPECT_LT(calibrated[i], 0.6 * uniform) << FormatName(f);
    }
    EXPECT_LT(defaults, (kda4 ? 0.95 : f == StateFormat::kStepQuant4 ? 0.7 : 0.6) * uniform) << FormatName(f);
    EXPECT_LT(calibrated[i], int4) << FormatName(f);
    EXPECT_LT(defaults, int4) << FormatName(f);
    EXPECT_GT(calibrated[i], 0.0);
    ++i;
  }
  EXPECT_LT(calibrated[0], 0.5 * calibrated[1]);
}

INSTANTIATE_TEST_SUITE_P(Archs, OrderingTest, ::testing::Values(Arch::kGdn, Arch::kKda),
                         [](const auto& info) { return std::string(ArchName(info.param)); });

}  // namespace
}  // namespace statecache
