// On a 2,048-step SYNTHETIC trajectory (kernels/trajectory/synthetic.h: decay
// spectrum p10/p50/p90 = 0.376/0.967/0.9996, 4 outlier key channels with 6x
// keys and 4 outlier value channels with 8x values per head), with a DAMP
// layout protecting the 16 rows of largest int8-hadamard error energy, the
// state RRMSE orders fp16 < damp < int8-hadamard < int8, and int4 / nvfp4 are
// far worse. Prints the table.
#include <cstdio>
#include <map>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/eval/format_report.h"
#include "kernels/trajectory/synthetic.h"

namespace statecache {
namespace {

TEST(FormatOrderingTest, SyntheticOutlierTrajectory) {
  SyntheticOptions opt;
  opt.geometry = ModelGeometry{Arch::kGdn, 1, 1, 2, 128, 128};
  opt.tokens = 2048;
  opt.seed = 1;
  Trajectory traj = *MakeSyntheticTrajectory(opt);
  // Calibrate on a different document of the same synthetic "model".
  opt.seed = 2;
  opt.tokens = 512;
  Trajectory calib = *MakeSyntheticTrajectory(opt);
  auto backend = CpuBackend::Create({.threads = 2});
  absl::StatusOr<std::vector<int32_t>> perm = ErrorEnergyKeyPerm(*backend, {calib}, 16);
  ASSERT_TRUE(perm.ok()) << perm.status();
  absl::StatusOr<std::vector<AccuracyRow>> rows =
      AccuracyTable(*backend, {traj}, 16, *perm, ReplayOptions{});
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::printf("SYNTHETIC trajectory, 2048 decode steps, gdn 2 heads 128x128\n%s",
              FormatAccuracyTable(*rows).c_str());
  std::map<std::string, double> rrmse;
  for (const AccuracyRow& r : *rows) rrmse[FormatName(r.spec.format)] = r.state_rrmse;
  EXPECT_EQ(rrmse["fp32"], 0.0);
  EXPECT_LT(rrmse["fp16"], rrmse["damp"]);
  EXPECT_LT(rrmse["damp"], rrmse["int8-hadamard"]);
  EXPECT_LT(rrmse["int8-hadamard"], rrmse["int8"]);
  EXPECT_GT(rrmse["int4"], 5 * rrmse["int8"]);
  EXPECT_GT(rrmse["nvfp4"], 5 * rrmse["int8"]);
}

}  // namespace
}  // namespace statecache
