// statecache format report: the storage table of every state format, then a
// replay of decode trajectories through every format on the CPU backend with
// the error of each against FP32 states. Trajectories: the recorded inputs of
// the shipped gdn-tiny model (golden.safetensors, 64 tokens, 4 layers) and a
// SYNTHETIC outlier trajectory.
//
//   bazel run //kernels/eval:format_report_main -- --tokens=2048
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend/backend.h"
#include "kernels/common/status_macros.h"
#include "kernels/common/tool_main.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/eval/format_report.h"
#include "kernels/trajectory/golden.h"
#include "kernels/trajectory/synthetic.h"

ABSL_FLAG(int, tokens, 1024, "Decode steps of the SYNTHETIC trajectory.");
ABSL_FLAG(int, k_hi, 16, "FP16 key rows of damp / damp-sr (0..d_k).");
ABSL_FLAG(std::string, backend, "cpu", "Backend: cpu, cuda or auto.");

namespace statecache {
namespace {

absl::Status Run() {
  const int k_hi = absl::GetFlag(FLAGS_k_hi);
  ASSIGN_OR_RETURN(auto backend, CreateBackend(absl::GetFlag(FLAGS_backend)));
  std::printf("backend: %s\n\n", backend->Describe().c_str());
  std::printf("== Storage per 128x128 head ==\n%s\n",
              FormatStorageTable(StorageTable(128, 128, k_hi),
                                 ModelGeometry{Arch::kGdn, 30, 16, 32, 128, 128})
                  .c_str());

  ASSIGN_OR_RETURN(Trajectory golden,
                   GoldenTrajectory("gdn-tiny", ModelGeometry{Arch::kGdn, 4, 2, 4, 128, 128}));
  ASSIGN_OR_RETURN(std::vector<int32_t> golden_perm, ErrorEnergyKeyPerm(*backend, {golden}, k_hi));
  ASSIGN_OR_RETURN(std::vector<AccuracyRow> golden_rows,
                   AccuracyTable(*backend, {golden}, k_hi, golden_perm, ReplayOptions{}));
  std::printf("== gdn-tiny recorded inputs (64 tokens, 4 layers x 4 heads), every token a decode step ==\n"
              "(damp rows chosen by int8-hadamard error energy on the same 64 tokens: in-sample)\n%s\n",
              FormatAccuracyTable(golden_rows).c_str());

  SyntheticOptions opt;
  opt.geometry = ModelGeometry{Arch::kGdn, 1, 2, 4, 128, 128};
  opt.tokens = 512;
  opt.seed = 100;
  ASSIGN_OR_RETURN(Trajectory calib, MakeSyntheticTrajectory(opt));
  opt.tokens = absl::GetFlag(FLAGS_tokens);
  opt.seed = 1;
  ASSIGN_OR_RETURN(Trajectory held_out, MakeSyntheticTrajectory(opt));
  ASSIGN_OR_RETURN(std::vector<int32_t> perm, ErrorEnergyKeyPerm(*backend, {calib}, k_hi));
  ASSIGN_OR_RETURN(std::vector<AccuracyRow> rows,
                   AccuracyTable(*backend, {held_out}, k_hi, perm, ReplayOptions{}));
  std::printf("== SYNTHETIC outlier trajectory (%d decode steps, gdn 4 heads; damp rows from a\n"
              "   separate 512-token synthetic calibration document) ==\n%s",
              opt.tokens, FormatAccuracyTable(rows).c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  return statecache::ToolMain(
      argc, argv, statecache::Run,
      "Prints the storage table of every statecache state format and the error of each\n"
      "format on recorded (gdn-tiny) and SYNTHETIC decode trajectories against FP32 states.");
}
