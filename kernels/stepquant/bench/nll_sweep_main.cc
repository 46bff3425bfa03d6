// Excess NLL / greedy agreement of STEPQuant calibration variants on a shipped
// model (issue 9): calibrates one stepquant layout per --variants entry from
// recorded trajectories and runs the model's held-out format sweep
// (client/model/format_sweep.h, CPU backend) on all of them against one FP32
// reference, so variants are compared without recomputing the reference or
// writing layout files. Same numbers as `worker sweep --layouts=<file>`.
//
// A variant is risk[:c1/c2/...][:hH][:pF]: the allocation's risk weight
// (StepQuantOptions::RiskWeight: lifetime = seed 002, head-relative,
// readout), optional candidate widths, horizon H and pivot fraction F.
//
//   bazel-bin/kernels/stepquant/bench/nll_sweep_main --model=kda-tiny
//       --calibration=/tmp/sq/kda-tiny-calibration --format=stepquant-4
//       --variants=lifetime,readout,readout:3/4/5/6
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/model/corpus.h"
#include "client/model/format_sweep.h"
#include "client/model/model.h"
#include "kernels/common/status_macros.h"
#include "kernels/common/tool_main.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/io/test_data.h"
#include "kernels/stepquant/calibration.h"
#include "kernels/trajectory/trajectory_file.h"

ABSL_FLAG(std::string, model, "kda-tiny", "shipped model (under shared/models/)");
ABSL_FLAG(std::string, calibration, "", "folder of calibration trajectory files (worker record)");
ABSL_FLAG(std::string, format, "stepquant-4", "stepquant-6 or stepquant-4");
ABSL_FLAG(std::string, variants, "lifetime", "comma-separated risk[:c1/c2..][:hH][:pF]");
ABSL_FLAG(int, threads, 2, "CPU threads (model and backend)");
ABSL_FLAG(int, max_docs, 0, "use the first N held-out documents (0 = all)");

namespace statecache {
namespace {

struct Variant {
  std::string name;
  StepQuantOptions options;
};

absl::StatusOr<Variant> ParseVariant(const std::string& text) {
  Variant v{text, {}};
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  ASSIGN_OR_RETURN(v.options.risk_weight, ParseRiskWeight(parts[0]));
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    bool ok = true;
    if (!p.empty() && p[0] == 'h') {
      ok = absl::SimpleAtoi(p.substr(1), &v.options.horizon);
    } else if (!p.empty() && p[0] == 'p') {
      ok = absl::SimpleAtod(p.substr(1), &v.options.pivot_fraction);
    } else {
      for (absl::string_view b : absl::StrSplit(p, '/')) {
        int w = 0;
        ok = ok && absl::SimpleAtoi(b, &w);
        v.options.candidates.push_back(w);
      }
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("variants: bad part '", p, "' in ", text));
  }
  return v;
}

absl::StatusOr<std::vector<Trajectory>> ReadTrajectories(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat("calibration: ", dir, ": ", ec.message()));
  std::sort(paths.begin(), paths.end());
  std::vector<Trajectory> out;
  for (const std::string& p : paths) {
    ASSIGN_OR_RETURN(Trajectory t, ReadTrajectoryFile(p));
    out.push_back(std::move(t));
  }
  if (out.empty()) return absl::NotFoundError(absl::StrCat("calibration: ", dir, ": no trajectories"));
  return out;
}

absl::Status Run() {
  ASSIGN_OR_RETURN(const FormatSpec spec, ParseFormatSpec(absl::GetFlag(FLAGS_format)));
  if (!IsStepQuantFormat(spec.format)) return absl::InvalidArgumentError("format: not stepquant-*");
  std::vector<Variant> variants;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_variants), ',')) {
    ASSIGN_OR_RETURN(Variant v, ParseVariant(std::string(t)));
    variants.push_back(std::move(v));
  }
  ASSIGN_OR_RETURN(std::vector<Trajectory> cal, ReadTrajectories(absl::GetFlag(FLAGS_calibration)));
  std::vector<StateLayout> layouts;
  for (const Variant& v : variants) {
    ASSIGN_OR_RETURN(StepQuantCalibration c, CalibrateStepQuant(cal, spec, v.options));
    int hist[17] = {};
    for (int b : c.unit_bits) ++hist[b];
    std::string h;
    for (int b = 16; b >= 2; --b) {
      if (hist[b] > 0) absl::StrAppend(&h, h.empty() ? "" : ", ", b == 16 ? "fp16" : absl::StrCat(b, "b"), ": ", hist[b]);
    }
    std::printf("variant %s: %s, payload %.4f bits/value\n", v.name.c_str(), h.c_str(),
                c.layout.PayloadBitsPerValue());
    std::fflush(stdout);
    layouts.push_back(c.layout);
  }
  ASSIGN_OR_RETURN(std::string dir, SharedDataPath("models/" + absl::GetFlag(FLAGS_model)));
  LanguageModel::Options mo;
  mo.threads = absl::GetFlag(FLAGS_threads);
  ASSIGN_OR_RETURN(auto model, LanguageModel::Load(dir, mo));
  if (model->config().Geometry() != cal[0].geometry) {
    return absl::InvalidArgumentError("calibration: trajectories are not of --model's geometry");
  }
  ASSIGN_OR_RETURN(std::string corpus, SharedDataPath("corpus/heldout.jsonl"));
  ASSIGN_OR_RETURN(std::vector<Document> docs, ReadCorpus(corpus));
  const int max_docs = absl::GetFlag(FLAGS_max_docs);
  if (max_docs > 0 && static_cast<int>(docs.size()) > max_docs) docs.resize(max_docs);
  auto backend = CpuBackend::Create({absl::GetFlag(FLAGS_threads)});
  // RunFormatSweep asks the provider once per spec, in order: the same spec
  // once per variant, answered with that variant's layout.
  size_t next = 0;
  SweepOptions opts;
  opts.layouts = [&](const ModelGeometry&, const FormatSpec&) -> absl::StatusOr<StateLayout> {
    if (next >= layouts.size()) return absl::InternalError("layouts: asked too often");
    return layouts[next++];
  };
  const auto start = std::chrono::steady_clock::now();
  opts.progress = [&](const std::string& row) {
    std::fprintf(stderr, "  done %s (%.0f s)\n", row.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  };
  ASSIGN_OR_RETURN(std::vector<SweepRow> rows,
                   RunFormatSweep(*model, backend.get(), docs,
                                  std::vector<FormatSpec>(variants.size(), spec), opts));
  std::printf("\nmodel %s, held-out %zu documents\n\n", absl::GetFlag(FLAGS_model).c_str(),
              docs.size());
  std::printf("| variant | payload bits/value | decode excess / agreement | prefill+decode excess / agreement |\n");
  std::printf("|---|---|---|---|\n");
  for (size_t i = 1; i < rows.size(); ++i) {
    const SweepRow& r = rows[i];
    std::printf("| %s %s | %.4f | %+.5f / %.2f%% | %+.5f / %.2f%% |\n", r.format.c_str(),
                variants[i - 1].name.c_str(), layouts[i - 1].PayloadBitsPerValue(),
                r.decode.excess, 100 * r.decode.agreement, r.prefill_decode.excess,
                100 * r.prefill_decode.agreement);
  }
  std::printf("(FP32 reference: decode %.5f, prefill+decode %.5f bits/byte)\n",
              rows[0].decode.bits_per_byte, rows[0].prefill_decode.bits_per_byte);
  return absl::OkStatus();
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) { return statecache::ToolMain(argc, argv, statecache::Run); }
