// STEPQuant accuracy report (issue 9): state and output RRMSE against FP32
// states (DESIGN.md section 5) of stepquant-6 / stepquant-4 next to fp32,
// int8-hadamard, int4 and damp:16, on the CPU backend. Every token is one
// decode step that requantizes the state.
//
// Calibration (STEPQuant bit maps / pivots / row impact, and damp's key rows
// by int8-hadamard error energy) uses the --calibration trajectories; the
// rows are measured on the --heldout trajectories (and the model's golden
// inputs with --golden), i.e. out of sample. --synthetic=gdn|kda replaces both
// with SYNTHETIC trajectories (kernels/trajectory/synthetic.h: seeds 1-4 for
// calibration, 101-102 for evaluation).
//
//   bazel-bin/client/worker/worker record --model=kda-tiny --corpus=calibration.jsonl --out=/tmp/cal
//   bazel-bin/client/worker/worker record --model=kda-tiny --corpus=heldout.jsonl --out=/tmp/ho
//   bazel-bin/kernels/stepquant/accuracy_main --calibration=/tmp/cal --heldout=/tmp/ho \
//       --golden=kda-tiny
//   bazel-bin/kernels/stepquant/accuracy_main --synthetic=gdn
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kernels/common/status_macros.h"
#include "kernels/common/tool_main.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/eval/format_report.h"
#include "kernels/eval/replay.h"
#include "kernels/layout/layout_file.h"
#include "kernels/stepquant/calibration.h"
#include "kernels/trajectory/golden.h"
#include "kernels/trajectory/synthetic.h"
#include "kernels/trajectory/trajectory_file.h"

ABSL_FLAG(std::string, calibration, "", "folder of calibration trajectory files");
ABSL_FLAG(std::string, heldout, "", "folder of held-out trajectory files");
ABSL_FLAG(std::string, golden, "", "also evaluate this shipped model's golden inputs (gdn-tiny, kda-tiny)");
ABSL_FLAG(std::string, synthetic, "", "gdn or kda: SYNTHETIC calibration and evaluation");
ABSL_FLAG(int, max_eval_tokens, 0, "truncate each evaluation trajectory (0 = all)");
ABSL_FLAG(int, synthetic_tokens, 2048, "tokens of each synthetic evaluation trajectory");
ABSL_FLAG(std::string, write_layouts, "", "write the calibrated layouts to <prefix>-stepquant-N.layout");
ABSL_FLAG(int, threads, 2, "CPU backend threads");
ABSL_FLAG(int, horizon, 16, "STEPQuant lifetime horizon H (seed 002: 256)");
ABSL_FLAG(std::string, risk_weight, "readout", "STEPQuant allocation risk: readout, head-relative, lifetime (seed 002)");
ABSL_FLAG(std::string, candidates4, "", "stepquant-4 candidate widths, e.g. 3,4,5,6 (default {3,4,6,8})");
ABSL_FLAG(bool, stepquant_only, false, "only the calibrated STEPQuant rows (for sweeps of --horizon)");

namespace statecache {
namespace {

absl::StatusOr<std::vector<Trajectory>> ReadFolder(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  std::sort(paths.begin(), paths.end());
  std::vector<Trajectory> out;
  for (const std::string& p : paths) {
    ASSIGN_OR_RETURN(Trajectory t, ReadTrajectoryFile(p));
    out.push_back(std::move(t));
  }
  if (out.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no .safetensors trajectories"));
  return out;
}

Trajectory Truncate(const Trajectory& t, int tokens) {
  if (tokens <= 0 || tokens >= t.tokens) return t;
  Trajectory out = t;
  out.tokens = tokens;
  const ModelGeometry& g = t.geometry;
  for (LayerInputs& in : out.layers) {
    in.q.resize(int64_t{tokens} * g.h_qk * g.d_k);
    in.k.resize(int64_t{tokens} * g.h_qk * g.d_k);
    in.v.resize(int64_t{tokens} * g.h_v * g.d_v);
    in.g.resize(int64_t{tokens} * g.h_v * g.GateWidth());
    in.beta.resize(int64_t{tokens} * g.h_v);
  }
  return out;
}

struct Row {
  std::string name;
  StateLayout layout;
};

absl::Status Report(const std::vector<Trajectory>& cal, const std::vector<std::vector<Trajectory>>& evals,
                    const std::vector<std::string>& eval_names) {
  const ModelGeometry geo = cal[0].geometry;
  auto backend = CpuBackend::Create({absl::GetFlag(FLAGS_threads)});
  std::vector<Row> rows;
  auto add = [&](std::string name, absl::StatusOr<StateLayout> l) -> absl::Status {
    RETURN_IF_ERROR(l.status());
    rows.push_back(Row{std::move(name), *std::move(l)});
    return absl::OkStatus();
  };
  const bool all = !absl::GetFlag(FLAGS_stepquant_only);
  StepQuantOptions opts;
  opts.horizon = absl::GetFlag(FLAGS_horizon);
  ASSIGN_OR_RETURN(opts.risk_weight, ParseRiskWeight(absl::GetFlag(FLAGS_risk_weight)));
  if (all) {
    RETURN_IF_ERROR(add("fp32", StateLayout::Identity(geo, {StateFormat::kFp32, 0})));
    RETURN_IF_ERROR(add("int8-hadamard", StateLayout::Identity(geo, {StateFormat::kInt8Hadamard, 0})));
    RETURN_IF_ERROR(add("int4", StateLayout::Identity(geo, {StateFormat::kInt4, 0})));
    ASSIGN_OR_RETURN(std::vector<int32_t> damp_perm, ErrorEnergyKeyPerm(*backend, cal, 16));
    RETURN_IF_ERROR(add("damp:16 (E-only rows)",
                        StateLayout::Create(geo, {StateFormat::kDamp, 16}, damp_perm, {}, {})));
  }
  for (StateFormat f : {StateFormat::kStepQuant6, StateFormat::kStepQuant4}) {
    const std::string n = FormatName(f);
    if (all) {
      RETURN_IF_ERROR(add(n + " uniform (spatial only)", StateLayout::Identity(geo, {f, 0})));
      StepQuantOptions no_impact = opts;
      no_impact.use_row_impact = false;
      ASSIGN_OR_RETURN(StepQuantCalibration c0, CalibrateStepQuant(cal, {f, 0}, no_impact));
      RETURN_IF_ERROR(add(n + " allocation + pivots, w=1", c0.layout));
    }
    const auto start = std::chrono::steady_clock::now();
    StepQuantOptions fopts = opts;
    if (f == StateFormat::kStepQuant4 && !absl::GetFlag(FLAGS_candidates4).empty()) {
      for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_candidates4), ',')) {
        int v = 0;
        if (!absl::SimpleAtoi(b, &v)) return absl::InvalidArgumentError("--candidates4: not a list of widths");
        fopts.candidates.push_back(v);
      }
    }
    ASSIGN_OR_RETURN(StepQuantCalibration c, CalibrateStepQuant(cal, {f, 0}, fopts));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int hist[17] = {};
    for (int b : c.unit_bits) ++hist[b];
    std::string h;
    for (int b = 16; b >= 2; --b) {
      if (hist[b] > 0) absl::StrAppend(&h, h.empty() ? "" : ", ", b == 16 ? "fp16" : absl::StrCat(b, "b"), ": ", hist[b]);
    }
    std::printf("calibrated %s in %.1f s: %zu units (%s), nominal code bits %.4f, payload %.4f bits/value\n",
                n.c_str(), secs, c.unit_bits.size(), h.c_str(), c.nominal_code_bits,
                c.layout.PayloadBitsPerValue());
    if (!absl::GetFlag(FLAGS_write_layouts).empty()) {
      const std::string path = absl::StrCat(absl::GetFlag(FLAGS_write_layouts), "-", n, ".layout");
      RETURN_IF_ERROR(WriteLayoutFile(c.layout, c.Info(), {}, path));
      std::printf("wrote %s\n", path.c_str());
    }
    RETURN_IF_ERROR(add(absl::StrCat(n, " (STEPQuant, ", absl::GetFlag(FLAGS_risk_weight), ", H=", opts.horizon, ")"), c.layout));
  }
  for (size_t e = 0; e < evals.size(); ++e) {
    int64_t tokens = 0;
    for (const Trajectory& t : evals[e]) tokens += t.tokens;
    std::printf("\n%s: %s, %zu trajectories, %lld tokens\n\n", eval_names[e].c_str(),
                geo.DebugString().c_str(), evals[e].size(), static_cast<long long>(tokens));
    // "layer mean": the output RRMSE of each layer on its own, averaged over
    // layers (the model normalizes every head's readout, so an error in a
    // small layer matters more than its share of the pooled RRMSE).
    std::printf("| format | bits/value | state RRMSE | output RRMSE | output RRMSE, layer mean |\n"
                "|---|---|---|---|---|\n");
    for (const Row& r : rows) {
      ASSIGN_OR_RETURN(ReplayResult res, ReplayAgainstFp32(*backend, r.layout, evals[e], {}));
      double layer_mean = 0;
      for (const ErrorSums& l : res.layers) layer_mean += l.OutputRrmse() / res.layers.size();
      std::printf("| %s | %.3f | %.3e | %.3e | %.3e |\n", r.name.c_str(),
                  r.layout.PayloadBitsPerValue(), res.total.StateRrmse(), res.total.OutputRrmse(),
                  layer_mean);
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

absl::Status Run() {
  const int max_tokens = absl::GetFlag(FLAGS_max_eval_tokens);
  const std::string synth = absl::GetFlag(FLAGS_synthetic);
  if (!synth.empty()) {
    if (synth != "gdn" && synth != "kda") return absl::InvalidArgumentError("--synthetic: gdn or kda");
    const bool kda = synth == "kda";
    SyntheticOptions o;
    o.geometry = ModelGeometry{kda ? Arch::kKda : Arch::kGdn, 2, kda ? 4 : 2, 4, 128, 128};
    std::vector<Trajectory> cal, eval;
    for (uint64_t s : {1, 2, 3, 4}) {
      o.seed = s;
      o.tokens = 512;
      ASSIGN_OR_RETURN(Trajectory t, MakeSyntheticTrajectory(o));
      cal.push_back(std::move(t));
    }
    for (uint64_t s : {101, 102}) {
      o.seed = s;
      o.tokens = absl::GetFlag(FLAGS_synthetic_tokens);
      ASSIGN_OR_RETURN(Trajectory t, MakeSyntheticTrajectory(o));
      eval.push_back(Truncate(t, max_tokens));
    }
    return Report(cal, {eval}, {absl::StrCat("SYNTHETIC ", synth, " (seeds 101, 102)")});
  }
  ASSIGN_OR_RETURN(std::vector<Trajectory> cal, ReadFolder(absl::GetFlag(FLAGS_calibration)));
  std::vector<std::vector<Trajectory>> evals;
  std::vector<std::string> names;
  if (!absl::GetFlag(FLAGS_heldout).empty()) {
    ASSIGN_OR_RETURN(std::vector<Trajectory> ho, ReadFolder(absl::GetFlag(FLAGS_heldout)));
    for (Trajectory& t : ho) t = Truncate(t, max_tokens);
    evals.push_back(std::move(ho));
    names.push_back(absl::StrCat("held-out recorded (", cal[0].source, ")"));
  }
  if (!absl::GetFlag(FLAGS_golden).empty()) {
    ASSIGN_OR_RETURN(Trajectory g, GoldenTrajectory(absl::GetFlag(FLAGS_golden), cal[0].geometry));
    evals.push_back({std::move(g)});
    names.push_back(absl::StrCat(absl::GetFlag(FLAGS_golden), " golden.safetensors inputs"));
  }
  if (evals.empty()) return absl::InvalidArgumentError("--heldout or --golden: nothing to evaluate");
  return Report(cal, evals, names);
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) { return statecache::ToolMain(argc, argv, statecache::Run); }
