#include "client/ctl_calibration/calibration_commands.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/ctl_calibration/cli_flags.h"
#include "kernels/backend/backend.h"
#include "kernels/calibration/build_layout.h"
#include "kernels/calibration/calibrator.h"
#include "kernels/calibration/evaluation.h"
#include "kernels/common/status_macros.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/io/json.h"
#include "kernels/layout/layout_file.h"
#include "kernels/trajectory/trajectory_file.h"

namespace statecache {
namespace {

// Seed 000, table 5 (appendix C.1).
constexpr struct {
  const char* arch;
  double common, overlap, spearman;
} kSeedTable5[] = {{"kda", 14.72, 0.920, 0.990}, {"gdn", 14.91, 0.932, 0.986}};

constexpr char kCommonHelp[] = R"(calibration set (one of):
  --trajectories=PATHS     comma-separated trajectory files / directories of
                           *.safetensors (kernels/trajectory/TRAJECTORY_FORMAT.md)
  --synthetic=SPEC         SYNTHETIC documents instead of model data, e.g.
                           arch=gdn,layers=4,h_qk=4,h_v=8,d_k=128,d_v=128,docs=16,
                           tokens=256,domains=4,seed=1,model_seed=7 (keys optional)
calibration options:
  --sample_every=8         state sample period in tokens (seed 000: 8)
  --horizon=256            H of the seed 001 horizon score
  --tau=1e-4               persistence cap of seed 000 eq. 9
  --threads=0              worker threads (0 = all cores)
  --prefetch=2             trajectories loaded (or generated) concurrently ahead;
                           0 = synchronously (compute time then excludes loading)
  --no_progress            never draw the progress bar (drawn on a TTY only)
  --json=PATH              machine-readable report ('-' = stdout instead of tables)
)";

// A one-line progress bar on stderr, drawn only when stderr is a TTY.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled && isatty(STDERR_FILENO)) {}
  ~ProgressBar() { Finish(); }
  void Update(const std::string& label, int done, int total) {
    if (!enabled_ || total <= 0) return;
    constexpr int kWidth = 30;
    const int fill = done * kWidth / total;
    std::fprintf(stderr, "\r%-28s [%s%s] %d/%d", label.c_str(), std::string(fill, '#').c_str(),
                 std::string(kWidth - fill, ' ').c_str(), done, total);
    std::fflush(stderr);
    drawn_ = true;
  }
  void Finish() {
    if (drawn_) std::fprintf(stderr, "\r%80s\r", "");
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
};

std::string Num(double x) {
  if (!std::isfinite(x)) return "null";
  return absl::StrFormat("%.6g", x);
}
std::string Str(absl::string_view s) {
  std::string out;
  AppendJsonString(s, &out);
  return out;
}

struct CalibrationInput {
  TrajectorySource source;
  std::string description;  // for reports and layout provenance
  bool synthetic = false;
  SyntheticSpec spec;
};

absl::StatusOr<CalibrationInput> MakeCalibrationInput(const CliFlags& f) {
  CalibrationInput in;
  if (f.Has("trajectories") == f.Has("synthetic")) {
    return absl::InvalidArgumentError("give exactly one of --trajectories or --synthetic");
  }
  if (f.Has("trajectories")) {
    ASSIGN_OR_RETURN(std::vector<std::string> paths,
                     ExpandTrajectoryPaths(f.Get("trajectories", "")));
    in.description = absl::StrCat(paths.size(), " trajectory files from ", f.Get("trajectories", ""));
    in.source = TrajectoriesFromFiles(std::move(paths));
    return in;
  }
  ASSIGN_OR_RETURN(in.spec, ParseSyntheticSpec(f.Get("synthetic", "")));
  in.synthetic = true;
  in.description = absl::StrCat("SYNTHETIC ", in.spec.text);
  SyntheticSpec spec = in.spec;
  in.source.count = spec.docs;
  in.source.load = [spec](int i) -> absl::StatusOr<std::shared_ptr<const Trajectory>> {
    ASSIGN_OR_RETURN(Trajectory t, MakeSyntheticDocument(spec, i));
    return std::make_shared<const Trajectory>(std::move(t));
  };
  return in;
}

absl::StatusOr<CalibrationOptions> MakeCalibrationOptions(const CliFlags& f, ProgressBar* bar) {
  CalibrationOptions o;
  ASSIGN_OR_RETURN(o.sample_every, f.GetInt("sample_every", 8));
  ASSIGN_OR_RETURN(o.horizon, f.GetInt("horizon", 256));
  ASSIGN_OR_RETURN(o.threads, f.GetInt("threads", 0));
  ASSIGN_OR_RETURN(o.prefetch, f.GetInt("prefetch", 2));
  o.progress = [bar](const CalibrationProgress& p) {
    bar->Update(absl::StrCat("calibrate pass ", p.pass, "/", p.passes), p.done, p.total);
  };
  return o;
}

void PrintTiming(const CalibrationStats& st, const std::string& description) {
  const ModelGeometry& g = st.geometry;
  std::printf("calibration set: %s\n", description.c_str());
  std::printf("  geometry %s; %d trajectories, %zu domains, %lld tokens/layer, %lld state "
              "samples per head\n",
              g.DebugString().c_str(), st.trajectories, st.domains.size(),
              static_cast<long long>(st.tokens), static_cast<long long>(st.samples));
  std::printf("  time: %.2f s compute + %.2f s waiting for trajectories (%d threads, %s)\n",
              st.compute_seconds, st.load_seconds, st.threads,
              st.num_sr_candidates() > 0 ? "2 passes: damp + damp-sr" : "1 pass: damp");
}

void PrintStability(const StabilityReport& r, const ModelGeometry& g, const std::string& what) {
  std::printf("\nstability (%s): two disjoint domain-balanced halves, top-%d per layer/head\n",
              what.c_str(), r.top);
  std::printf("  %-8s %8s %9s %9s\n", "layer", "common", "overlap", "spearman");
  for (const StabilityRow& row : r.layers) {
    std::printf("  %-8d %8.2f %8.1f%% %9.3f\n", row.layer, row.common, 100 * row.overlap,
                row.spearman);
  }
  std::printf("  %-8s %8.2f %8.1f%% %9.3f\n", "all", r.overall.common, 100 * r.overall.overlap,
              r.overall.spearman);
  for (const auto& s : kSeedTable5) {
    std::printf("  seed 000 table 5 %-4s %6.2f %8.1f%% %9.3f%s\n", s.arch, s.common,
                100 * s.overlap, s.spearman, s.arch == std::string(ArchName(g.arch)) ? "  <- same arch" : "");
  }
  std::printf("  random selection   %6.2f %8.1f%%         -\n", r.random_common,
              100 * r.random_common / r.top);
}

std::string StabilityJson(const StabilityReport& r) {
  std::vector<std::string> layers;
  for (const StabilityRow& row : r.layers) {
    layers.push_back(absl::StrCat("{\"layer\":", row.layer, ",\"common\":", Num(row.common),
                                  ",\"overlap\":", Num(row.overlap), ",\"spearman\":",
                                  Num(row.spearman), "}"));
  }
  return absl::StrCat("{\"top\":", r.top, ",\"random_common\":", Num(r.random_common),
                      ",\"overall\":{\"common\":", Num(r.overall.common), ",\"overlap\":",
                      Num(r.overall.overlap), ",\"spearman\":", Num(r.overall.spearman),
                      "},\"layers\":[", absl::StrJoin(layers, ","), "]}");
}

std::string TimingJson(const CalibrationStats& st, const std::string& description) {
  return absl::StrCat("{\"source\":", Str(description), ",\"geometry\":",
                      Str(st.geometry.DebugString()), ",\"trajectories\":", st.trajectories,
                      ",\"domains\":", st.domains.size(), ",\"tokens_per_layer\":", st.tokens,
                      ",\"samples_per_head\":", st.samples, ",\"compute_seconds\":",
                      Num(st.compute_seconds), ",\"load_seconds\":", Num(st.load_seconds),
                      ",\"threads\":", st.threads, ",\"damp_sr\":",
                      st.num_sr_candidates() > 0 ? "true" : "false", "}");
}

absl::Status WriteJson(const std::string& path, const std::string& json) {
  if (path == "-") {
    std::printf("%s\n", json.c_str());
    return absl::OkStatus();
  }
  std::ofstream out(path);
  out << json << "\n";
  if (!out) return absl::InternalError(absl::StrCat("--json: cannot write ", path));
  return absl::OkStatus();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

std::string SrChoiceText(const CalibrationStats& st, const BuiltLayout& b) {
  std::vector<std::string> parts;
  for (int c = 0; c < st.num_sr_candidates(); ++c) {
    parts.push_back(absl::StrCat(st.sr_candidate_names[c], ": ", b.sr_choice_count[c]));
  }
  return absl::StrJoin(parts, ", ");
}

// ---- calibrate ---------------------------------------------------------------

constexpr char kCalibrateHelp[] = R"(statecachectl calibrate: trajectories -> DAMP layout file
output:
  --format=damp:16         damp:K or damp-sr:K (other formats need no calibration)
  --selector=NAME          random | energy | e | p | ep | horizon | epq
                           (default: ep for damp, horizon for damp-sr)
  --out=PATH               layout file to write (safetensors, versioned, checksummed)
  --save_synthetic=DIR     also write the --synthetic documents as trajectory files
  --no_stability           skip the split-half stability report
)";

absl::Status Calibrate(const CliFlags& f, int* exit_code) {
  ASSIGN_OR_RETURN(CalibrationInput input, MakeCalibrationInput(f));
  ASSIGN_OR_RETURN(FormatSpec spec, ParseFormatSpec(f.Get("format", "damp:16")));
  if (!IsMixedFormat(spec.format)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format: ", FormatSpecName(spec), " has no calibrated layout (use damp:K or damp-sr:K)"));
  }
  Selector selector = DefaultSelector(spec.format);
  if (f.Has("selector")) {
    ASSIGN_OR_RETURN(selector, ParseSelector(f.Get("selector", "")));
  }
  ProgressBar bar(!f.Has("no_progress"));
  ASSIGN_OR_RETURN(CalibrationOptions opts, MakeCalibrationOptions(f, &bar));
  opts.damp_sr = spec.format == StateFormat::kDampSr;
  if (input.synthetic && f.Has("save_synthetic")) {
    for (int i = 0; i < input.spec.docs; ++i) {
      ASSIGN_OR_RETURN(Trajectory t, MakeSyntheticDocument(input.spec, i));
      RETURN_IF_ERROR(WriteTrajectoryFile(
          t, absl::StrFormat("%s/synthetic-%04d.safetensors", f.Get("save_synthetic", ""), i)));
    }
  }
  ASSIGN_OR_RETURN(CalibrationStats st, Calibrate(input.source, opts));
  bar.Finish();
  LayoutRequest req;
  req.format = spec;
  req.selector = selector;
  ASSIGN_OR_RETURN(double tau, f.GetDouble("tau", 1e-4));
  req.tau = tau;
  ASSIGN_OR_RETURN(BuiltLayout built, BuildLayout(st, req));
  if (f.Has("out")) {
    std::map<std::string, std::string> info = {
        {"selector", SelectorName(selector)},
        {"calibration", input.description},
        {"samples_per_head", absl::StrCat(st.samples)},
        {"sample_every", absl::StrCat(opts.sample_every)},
        {"horizon", absl::StrCat(opts.horizon)},
        {"tau", absl::StrCat(tau)},
        {"domains", absl::StrJoin(st.domains, ",")},
        {"tool", "statecachectl calibrate"},
    };
    if (!built.sr_choice.empty()) info["sr_candidates"] = SrChoiceText(st, built);
    RETURN_IF_ERROR(WriteLayoutFile(built.layout, info, built.scores, f.Get("out", "")));
  }
  absl::StatusOr<StabilityReport> stab = absl::FailedPreconditionError("skipped");
  if (!f.Has("no_stability")) stab = ComputeStability(st, req, 16);
  const bool json_only = f.Get("json", "") == "-";
  if (!json_only) {
    PrintTiming(st, input.description);
    std::printf("layout: %s, selector %s, fingerprint %016llx%s\n", FormatSpecName(spec).c_str(),
                SelectorName(selector), static_cast<unsigned long long>(built.layout.Fingerprint()),
                f.Has("out") ? absl::StrCat(", written to ", f.Get("out", "")).c_str() : "");
    if (!built.sr_choice.empty()) {
      std::printf("damp-sr value maps chosen per head: %s\n", SrChoiceText(st, built).c_str());
    }
    if (stab.ok()) {
      PrintStability(*stab, st.geometry, absl::StrCat(FormatSpecName(spec), "/", SelectorName(selector)));
    } else if (!f.Has("no_stability")) {
      std::printf("%s\n", std::string(stab.status().message()).c_str());
    }
  }
  if (f.Has("json")) {
    std::string json = absl::StrCat(
        "{\"command\":\"calibrate\",\"calibration\":", TimingJson(st, input.description),
        ",\"format\":", Str(FormatSpecName(spec)), ",\"selector\":", Str(SelectorName(selector)),
        ",\"fingerprint\":", Str(absl::StrFormat("%016x", built.layout.Fingerprint())),
        ",\"out\":", f.Has("out") ? Str(f.Get("out", "")) : "null",
        ",\"stability\":", stab.ok() ? StabilityJson(*stab) : "null", "}");
    RETURN_IF_ERROR(WriteJson(f.Get("json", ""), json));
  }
  *exit_code = 0;
  return absl::OkStatus();
}

// ---- evaluate ----------------------------------------------------------------

constexpr char kEvaluateHelp[] = R"(statecachectl evaluate: held-out accuracy of every format and layout
held-out set (one of; with --synthetic the default is 4 fresh documents of the same model):
  --heldout=PATHS          trajectory files / directories
  --heldout_docs=4         number of SYNTHETIC held-out documents
evaluation:
  --sections=formats,selectors,k_sweep   which tables to produce
  --only=CASES             keep only these cases of the sections, e.g. damp:16/ep,int8-hadamard
  --layout=PATHS           also evaluate these layout files (comma-separated)
  --no_sr                  skip damp-sr (one FP32 calibration pass instead of two)
  --backend=cpu            cpu | cuda | auto
  --per_layer              print per-layer output RRMSE tables (always in --json)
)";

void PrintEvalTable(const std::vector<EvalRow>& rows, const std::string& section,
                    const std::string& title, double ref_out) {
  std::printf("\n%s\n", title.c_str());
  std::printf("  %-22s %9s %12s %12s %10s %8s\n", "case", "bits/val", "state RRMSE",
              "output RRMSE", "out/int8H", "time s");
  for (const EvalRow& r : rows) {
    if (r.spec.section != section) continue;
    const double out = r.result.total.OutputRrmse();
    std::printf("  %-22s %9.3f %12.3e %12.3e %10s %8.1f\n", CaseName(r.spec).c_str(),
                r.bits_per_value, r.result.total.StateRrmse(), out,
                ref_out > 0 ? absl::StrFormat("%.3f", out / ref_out).c_str() : "-", r.seconds);
  }
}

void PrintPerLayer(const std::vector<EvalRow>& rows, const std::string& section, int layers) {
  std::printf("\n  per-layer output RRMSE (%s)\n  %-22s", section.c_str(), "case");
  for (int l = 0; l < layers; ++l) std::printf(" %9s", absl::StrCat("L", l).c_str());
  std::printf("\n");
  for (const EvalRow& r : rows) {
    if (r.spec.section != section) continue;
    std::printf("  %-22s", CaseName(r.spec).c_str());
    for (int l = 0; l < layers; ++l) std::printf(" %9.2e", r.result.layers[l].OutputRrmse());
    std::printf("\n");
  }
}

std::string RowJson(const EvalRow& r) {
  std::vector<std::string> layers;
  for (size_t l = 0; l < r.result.layers.size(); ++l) {
    layers.push_back(absl::StrCat("{\"layer\":", l, ",\"state_rrmse\":",
                                  Num(r.result.layers[l].StateRrmse()), ",\"output_rrmse\":",
                                  Num(r.result.layers[l].OutputRrmse()), "}"));
  }
  return absl::StrCat(
      "{\"section\":", Str(r.spec.section), ",\"case\":", Str(CaseName(r.spec)),
      ",\"format\":", Str(FormatSpecName(r.spec.format)), ",\"k_hi\":", r.spec.format.k_hi,
      ",\"selector\":",
      IsMixedFormat(r.spec.format.format) ? Str(SelectorName(r.spec.selector)) : "null",
      ",\"bits_per_value\":", Num(r.bits_per_value), ",\"state_rrmse\":",
      Num(r.result.total.StateRrmse()), ",\"output_rrmse\":", Num(r.result.total.OutputRrmse()),
      ",\"fingerprint\":", Str(absl::StrFormat("%016x", r.fingerprint)), ",\"seconds\":",
      Num(r.seconds), ",\"layers\":[", absl::StrJoin(layers, ","), "]}");
}

absl::Status Evaluate(const CliFlags& f, int* exit_code) {
  ASSIGN_OR_RETURN(CalibrationInput input, MakeCalibrationInput(f));
  ProgressBar bar(!f.Has("no_progress"));
  ASSIGN_OR_RETURN(CalibrationOptions opts, MakeCalibrationOptions(f, &bar));
  opts.damp_sr = !f.Has("no_sr");
  // Held-out set, fully in memory (the replay needs it per case).
  std::vector<Trajectory> heldout;
  std::string heldout_desc;
  if (f.Has("heldout")) {
    ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandTrajectoryPaths(f.Get("heldout", "")));
    for (const std::string& p : paths) {
      ASSIGN_OR_RETURN(Trajectory t, ReadTrajectoryFile(p));
      heldout.push_back(std::move(t));
    }
    heldout_desc = absl::StrCat(paths.size(), " trajectory files from ", f.Get("heldout", ""));
  } else if (input.synthetic) {
    ASSIGN_OR_RETURN(int docs, f.GetInt("heldout_docs", 4));
    const SyntheticSpec h = HeldOutSpec(input.spec, docs);
    for (int i = 0; i < docs; ++i) {
      ASSIGN_OR_RETURN(Trajectory t, MakeSyntheticDocument(h, i));
      heldout.push_back(std::move(t));
    }
    heldout_desc = absl::StrCat("SYNTHETIC ", h.text);
  } else {
    return absl::InvalidArgumentError("--heldout is required with --trajectories");
  }
  ASSIGN_OR_RETURN(CalibrationStats st, Calibrate(input.source, opts));
  bar.Finish();
  ASSIGN_OR_RETURN(double tau, f.GetDouble("tau", 1e-4));
  if (tau != 1e-4) {
    return absl::InvalidArgumentError("--tau: evaluate uses the seed's tau = 1e-4");
  }
  const std::vector<std::string> sections =
      absl::StrSplit(f.Get("sections", "formats,selectors,k_sweep"), ',', absl::SkipEmpty());
  for (const std::string& s : sections) {
    if (s != "formats" && s != "selectors" && s != "k_sweep") {
      return absl::InvalidArgumentError(absl::StrCat("--sections: unknown section '", s, "'"));
    }
  }
  std::vector<EvalCase> plan = StandardEvalPlan(st.geometry, sections, opts.damp_sr);
  if (f.Has("only")) {
    const std::vector<std::string> only = absl::StrSplit(f.Get("only", ""), ',', absl::SkipEmpty());
    std::vector<EvalCase> kept;
    for (const EvalCase& c : plan) {
      if (std::count(only.begin(), only.end(), CaseName(c)) > 0) kept.push_back(c);
    }
    plan = std::move(kept);
  }
  std::vector<std::unique_ptr<LayoutFile>> files;
  if (f.Has("layout")) {
    for (absl::string_view p : absl::StrSplit(f.Get("layout", ""), ',', absl::SkipEmpty())) {
      ASSIGN_OR_RETURN(LayoutFile lf, ReadLayoutFile(std::string(p), &st.geometry, nullptr));
      files.push_back(std::make_unique<LayoutFile>(std::move(lf)));
      EvalCase c;
      c.section = "layout_file";
      c.format = files.back()->layout.format();
      c.layout = &files.back()->layout;
      c.label = absl::StrCat(FormatSpecName(c.format), " file ", p);
      plan.push_back(c);
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(f.Get("backend", "cpu")));
  ReplayOptions replay;
  replay.state_sample_every = opts.sample_every;
  ASSIGN_OR_RETURN(std::vector<EvalRow> rows,
                   RunEvaluation(*backend, st, plan, heldout, replay, [&](int i, int n) {
                     bar.Update("evaluate", i, n);
                   }));
  bar.Finish();
  double ref_out = 0;
  for (const EvalRow& r : rows) {
    if (r.spec.format.format == StateFormat::kInt8Hadamard) ref_out = r.result.total.OutputRrmse();
  }
  if (ref_out == 0) {
    // Without the formats section: replay the int8-hadamard reference once.
    ASSIGN_OR_RETURN(StateLayout ref, StateLayout::Identity(st.geometry, {StateFormat::kInt8Hadamard, 0}));
    ASSIGN_OR_RETURN(ReplayResult rr, ReplayAgainstFp32(*backend, ref, heldout, replay));
    ref_out = rr.total.OutputRrmse();
  }
  std::vector<std::pair<std::string, StabilityReport>> stability;
  for (StateFormat fmt : {StateFormat::kDamp, StateFormat::kDampSr}) {
    if (fmt == StateFormat::kDampSr && !opts.damp_sr) continue;
    LayoutRequest req;
    req.format = FormatSpec{fmt, std::min(kDefaultKHi, st.geometry.d_k)};
    req.selector = DefaultSelector(fmt);
    absl::StatusOr<StabilityReport> r = ComputeStability(st, req, 16);
    if (r.ok()) {
      stability.emplace_back(absl::StrCat(FormatSpecName(req.format), "/", SelectorName(req.selector)), *r);
    }
  }
  const bool json_only = f.Get("json", "") == "-";
  if (!json_only) {
    PrintTiming(st, input.description);
    std::printf("held-out set: %s; backend %s\n", heldout_desc.c_str(), backend->name());
    std::printf("RRMSE = sqrt(sum_t ||Y_hat_t - Y_t||^2 / sum_t ||Y_t||^2) vs the FP32 replay; "
                "states every %d tokens, outputs every token; out/int8H = output RRMSE / "
                "int8-hadamard's\n", replay.state_sample_every);
    const bool per_layer = f.Has("per_layer");
    if (std::count(sections.begin(), sections.end(), "formats")) {
      PrintEvalTable(rows, "formats", "formats (damp: E*P selector, damp-sr: horizon selector)", ref_out);
      if (per_layer) PrintPerLayer(rows, "formats", st.geometry.layers);
    }
    if (std::count(sections.begin(), sections.end(), "selectors")) {
      PrintEvalTable(rows, "selectors", "selector ablation at matched budget (K_hi = 16)", ref_out);
      if (per_layer) PrintPerLayer(rows, "selectors", st.geometry.layers);
    }
    if (std::count(sections.begin(), sections.end(), "k_sweep")) {
      PrintEvalTable(rows, "k_sweep", "K_hi sweep", ref_out);
    }
    if (!files.empty()) PrintEvalTable(rows, "layout_file", "layout files", ref_out);
    for (const auto& [name, r] : stability) PrintStability(r, st.geometry, name);
  }
  if (f.Has("json")) {
    std::vector<std::string> row_json, stab_json;
    for (const EvalRow& r : rows) row_json.push_back(RowJson(r));
    for (const auto& [name, r] : stability) {
      stab_json.push_back(absl::StrCat("{\"layout\":", Str(name), ",\"report\":", StabilityJson(r), "}"));
    }
    std::string json = absl::StrCat(
        "{\"command\":\"evaluate\",\"calibration\":", TimingJson(st, input.description),
        ",\"heldout\":", Str(heldout_desc), ",\"backend\":", Str(backend->name()),
        ",\"int8_hadamard_output_rrmse\":", Num(ref_out), ",\"rows\":[",
        absl::StrJoin(row_json, ","), "],\"stability\":[", absl::StrJoin(stab_json, ","), "]}");
    RETURN_IF_ERROR(WriteJson(f.Get("json", ""), json));
  }
  *exit_code = 0;
  return absl::OkStatus();
}

int RunCommand(int argc, char** argv, const char* help, std::set<std::string> value_flags,
               std::set<std::string> bool_flags,
               absl::Status (*body)(const CliFlags&, int*)) {
  for (const char* v : {"trajectories", "synthetic", "sample_every", "horizon", "tau", "threads", "prefetch", "json"}) {
    value_flags.insert(v);
  }
  bool_flags.insert({"no_progress", "help"});
  absl::StatusOr<CliFlags> f = CliFlags::Parse(argc, argv, value_flags, bool_flags);
  if (!f.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(f.status().message()).c_str());
    return 2;
  }
  if (f->Has("help")) {
    std::printf("%s%s", help, kCommonHelp);
    return 0;
  }
  int code = 1;
  absl::Status s = body(*f, &code);
  if (!s.ok()) return Fail(s);
  return code;
}

}  // namespace

int RunCalibrateCommand(int argc, char** argv) {
  return RunCommand(argc, argv, kCalibrateHelp, {"format", "selector", "out", "save_synthetic"},
                    {"no_stability"}, &Calibrate);
}

int RunEvaluateCommand(int argc, char** argv) {
  return RunCommand(argc, argv, kEvaluateHelp,
                    {"heldout", "heldout_docs", "sections", "only", "layout", "backend"},
                    {"no_sr", "per_layer"}, &Evaluate);
}

}  // namespace statecache
