// statecachectl serve-bench: seed 001's serving result at our scale (issue 6).
//
// The multi-turn workload of the demo (client/remote_store/multi_turn.h), in a
// seeded random interleaving of conversations, served once per state format
// under the SAME checkpoint-memory budget. A smaller format fits more
// checkpoints in the budget, so fewer previous-turn checkpoints are evicted
// before they are needed: more restores, fewer recomputed tokens, lower time
// to first output. Accuracy is measured against the same workload with FP32
// states in process.
//
//   statecachectl serve-bench                              # fp32, bf16, damp:16; 4 MiB
//   statecachectl serve-bench --budget_mib=8 --formats=fp32,damp:16 --markdown
//   statecachectl serve-bench --formats=damp:16 --host_checkpoint_mib=64 \
//       --checkpoint_format=int4-hadamard          # cold checkpoints in another format
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/ctl/ctl_command.h"
#include "client/ctl_calibration/cli_flags.h"
#include "client/remote_store/demo_support.h"
#include "client/remote_store/multi_turn.h"
#include "kernels/common/status_macros.h"
#include "kernels/formats/format.h"

namespace statecache {
namespace {

constexpr char kServeBenchHelp[] =
    "statecachectl serve-bench [flags]\n"
    "  The demo's multi-turn workload (random interleaving of conversations) served once per\n"
    "  format under one checkpoint-memory budget: checkpoint hits, restores, recomputed\n"
    "  tokens, time to first output (TTFT) per turn, accuracy vs FP32. Flags [defaults]:\n"
    "  --formats=LIST         comma-separated format specs [fp32,bf16,damp:16]\n"
    "  --budget_mib=X         checkpoint memory per format, MiB [4]\n"
    "  --conversations=N      conversations, one per held-out document (<= 6) [6]\n"
    "  --turns=N              turns per conversation [4]\n"
    "  --prompt_bytes=N       new bytes per turn, prefilled [96]\n"
    "  --reply_bytes=N        reply bytes per turn, decoded one step at a time [16]\n"
    "  --seed=N               interleaving seed [1]; --round_robin for a fixed rotation\n"
    "  --calibration_docs=N   DAMP calibration documents per domain [2]\n"
    "  --repeats=N            serve the workload N times per format; TTFT = median [3]\n"
    "  --markdown             also print the tables as Markdown\n"
    "  --host_checkpoint_mib=X  host checkpoint tier per format, MiB [0 = none]\n"
    "  --checkpoint_format=F  format of the checkpoints in the host tier [each format's own]\n"
    "  --server, --statecached, --backend, --model, --threads   as for demo\n";

struct FormatRow {
  std::string format;
  int64_t checkpoint_bytes = 0;  // one checkpoint (packed slot)
  int64_t capacity = 0;          // checkpoints the budget holds
  int later = 0, later_hit = 0, full_hit = 0;
  int64_t restores = 0, evictions = 0, recomputed = 0, prefilled = 0;
  std::vector<double> ttft;               // all turns
  std::map<int, std::vector<double>> ttft_by_turn;
  Accuracy accuracy;
  double wall = 0;
  // Cold tiers (--host_checkpoint_mib, --checkpoint_format).
  std::string cold_format;
  int64_t cold_bytes = 0, host_hits = 0, to_cold = 0, from_cold = 0;
};

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

// The flags of one serve-bench run.
struct ServeBenchOptions {
  WorkloadOptions wo;
  int64_t budget = 0;  // checkpoint bytes per format
  int calibration_docs = 2;
  int repeats = 3;
  int threads = 0;
  std::vector<FormatSpec> formats;
  int64_t host_bytes = 0;         // host checkpoint tier per model
  std::string checkpoint_format;  // "" = each format's own
};

absl::StatusOr<ServeBenchOptions> ParseServeBenchOptions(const CliFlags& f) {
  ServeBenchOptions o;
  WorkloadOptions& wo = o.wo;
  ASSIGN_OR_RETURN(wo.conversations, f.GetInt("conversations", 6));
  ASSIGN_OR_RETURN(wo.turns, f.GetInt("turns", 4));
  ASSIGN_OR_RETURN(wo.prompt_bytes, f.GetInt("prompt_bytes", 96));
  ASSIGN_OR_RETURN(wo.reply_bytes, f.GetInt("reply_bytes", 16));
  ASSIGN_OR_RETURN(const int seed, f.GetInt("seed", 1));
  wo.seed = static_cast<uint64_t>(seed);
  wo.shuffle = !f.Has("round_robin");
  ASSIGN_OR_RETURN(const double budget_mib, f.GetDouble("budget_mib", 4));
  if (!(budget_mib > 0)) return absl::InvalidArgumentError("--budget_mib: must be > 0");
  o.budget = static_cast<int64_t>(budget_mib * (1 << 20));
  ASSIGN_OR_RETURN(o.calibration_docs, f.GetInt("calibration_docs", 2));
  ASSIGN_OR_RETURN(o.repeats, f.GetInt("repeats", 3));
  if (o.repeats < 1) return absl::InvalidArgumentError("--repeats: must be >= 1");
  ASSIGN_OR_RETURN(o.threads, f.GetInt("threads", 0));
  for (absl::string_view s : absl::StrSplit(f.Get("formats", "fp32,bf16,damp:16"), ',')) {
    ASSIGN_OR_RETURN(FormatSpec spec, ParseFormatSpec(s));
    o.formats.push_back(spec);
  }
  ASSIGN_OR_RETURN(const double host_mib, f.GetDouble("host_checkpoint_mib", 0));
  if (!(host_mib >= 0)) return absl::InvalidArgumentError("--host_checkpoint_mib: must be >= 0");
  o.host_bytes = static_cast<int64_t>(host_mib * (1 << 20));
  o.checkpoint_format = f.Get("checkpoint_format", "");
  if (!o.checkpoint_format.empty()) {
    absl::StatusOr<FormatSpec> cf = ParseFormatSpec(o.checkpoint_format);
    if (!cf.ok()) return absl::InvalidArgumentError(absl::StrCat("--checkpoint_format: ", cf.status().message()));
  }
  return o;
}

// What every step of a run reads: the model and its data, the workload, the
// server.
struct ServeBenchRun {
  const ServeBenchOptions& o;
  const DemoData& data;
  const std::vector<Conversation>& convs;
  const std::vector<std::pair<int, int>>& schedule;
  ServerHandle& server;
};

// Layouts once per format (DAMP calibrated on the calibration corpus); names
// rows[i].format.
absl::StatusOr<std::vector<StateLayout>> FormatLayouts(const ServeBenchRun& r, std::FILE* out,
                                                       std::vector<FormatRow>& rows) {
  const LanguageModel& model = *r.data.model;
  const ModelGeometry geo = model.config().Geometry();
  std::vector<StateLayout> layouts;
  for (size_t i = 0; i < r.o.formats.size(); ++i) {
    const FormatSpec& spec = r.o.formats[i];
    rows[i].format = FormatSpecName(spec);
    std::string info;
    absl::StatusOr<StateLayout> layout =
        IsMixedFormat(spec.format)
            ? CalibrateLayout(model, r.data.calibration, r.o.calibration_docs, spec, &info)
            : StateLayout::Identity(geo, spec);
    RETURN_IF_ERROR(layout.status());
    if (IsMixedFormat(spec.format)) {
      absl::FPrintF(out, "  %s layout calibrated on %s\n", rows[i].format, info);
    }
    layouts.push_back(*std::move(layout));
  }
  return layouts;
}

// Serves the workload once with format i (registered under the budget,
// dropped again whatever happens): appends each turn's TTFT to ttft[turn]
// and, on the first repeat, fills row's counters and accuracy.
absl::Status ServeOnce(const ServeBenchRun& r, const StateLayout& layout, const WorkloadResult& ref,
                       bool first, FormatRow& row, std::vector<std::vector<double>>& ttft) {
  Registration reg;
  reg.slots = 1;
  reg.max_checkpoint_bytes = r.o.budget;
  reg.checkpoint_format = r.o.checkpoint_format;
  ASSIGN_OR_RETURN(v1::ModelInfo mi,
                   RegisterLayout(r.server.client.get(),
                                  absl::StrCat(r.data.model_name, "-bench"), layout, reg));
  const auto t = std::chrono::steady_clock::now();
  absl::StatusOr<WorkloadResult> run = RunRemoteWorkload(
      *r.data.model, r.server.client.get(), mi.model_id(), r.convs, r.schedule, {});
  absl::StatusOr<v1::GetStatsResponse> stats = r.server.client->GetStats(mi.model_id());
  // Free the budget for the next format whatever happened.
  RETURN_IF_ERROR(r.server.client->DropModel(mi.model_id(), /*force=*/true));
  RETURN_IF_ERROR(run.status());
  RETURN_IF_ERROR(stats.status());
  row.wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  ttft.resize(run->turns.size());
  for (size_t k = 0; k < run->turns.size(); ++k) ttft[k].push_back(run->turns[k].ttft_ms);
  if (!first) return absl::OkStatus();
  const v1::ModelStats& ms = stats->models(0).stats();
  row.checkpoint_bytes = mi.slot_bytes();
  row.capacity = ms.checkpoint_capacity();
  row.restores = ms.restores();
  row.evictions = ms.evictions();
  row.cold_format = mi.checkpoint_format();
  row.cold_bytes = mi.checkpoint_format_slot_bytes();
  row.to_cold = ms.checkpoint_transcodes_to_cold();
  row.from_cold = ms.checkpoint_transcodes_from_cold();
  for (const v1::CheckpointTierStats& t : ms.checkpoint_tiers()) {
    if (t.tier() == v1::CHECKPOINT_TIER_HOST) row.host_hits = t.hits();
  }
  for (const TurnStats& ts : run->turns) {
    row.recomputed += ts.recomputed_tokens;
    row.prefilled += ts.prefilled_tokens;
    if (ts.turn == 0) continue;
    ++row.later;
    row.later_hit += ts.restored_tokens > 0;
    row.full_hit += ts.restored_tokens == ts.context_tokens;
  }
  ASSIGN_OR_RETURN(row.accuracy, CompareRuns(*run, ref));
  return absl::OkStatus();
}

// Mean TTFT of the fp32 row (0 without one).
double Fp32Ttft(const std::vector<FormatRow>& rows) {
  for (const FormatRow& r : rows) {
    if (r.format == "fp32") return Mean(r.ttft);
  }
  return 0.0;
}

std::string VsFp32(const FormatRow& r, double fp32_ttft) {
  return fp32_ttft > 0 ? absl::StrFormat("%+.1f%%", 100 * (Mean(r.ttft) / fp32_ttft - 1))
                       : std::string("-");
}

// The serving table, the TTFT-by-turn table and their legend.
void PrintTables(std::FILE* out, const std::vector<FormatRow>& rows, int turns) {
  const double fp32_ttft = Fp32Ttft(rows);
  // Table 1: serving.
  absl::FPrintF(out, "\n%-10s %10s %6s %14s %8s %9s %10s %10s %10s %9s %8s %9s %9s\n", "format",
                "ckpt size", "ckpts", "hit (turns 2+)", "restores", "evictions", "recomputed",
                "prefilled", "TTFT mean", "TTFT p90", "vs fp32", "bits/byte", "agreement");
  for (const FormatRow& r : rows) {
    absl::FPrintF(out, "%-10s %10s %6d %8d/%-2d %3.0f%% %8d %9d %10s %10s %7.1f ms %6.1f ms %8s %9.4f %8.2f%%\n",
                  r.format, Bytes(r.checkpoint_bytes), r.capacity, r.later_hit, r.later,
                  r.later ? 100.0 * r.later_hit / r.later : 0.0, r.restores, r.evictions,
                  Thousands(r.recomputed), Thousands(r.prefilled), Mean(r.ttft),
                  Percentile(r.ttft, 90), VsFp32(r, fp32_ttft), r.accuracy.bits_per_byte,
                  100 * r.accuracy.agreement);
  }
  absl::FPrintF(out, "%-10s %10s %6s %14s %8s %9s %10s %10s %10s %9s %8s %9.4f %8.2f%%\n",
                "fp32 ref", "-", "-", "(in process)", "-", "-", "-", "-", "-", "-", "-",
                rows.empty() ? 0.0 : rows[0].accuracy.reference_bits_per_byte, 100.0);
  // Table 2: TTFT by turn.
  absl::FPrintF(out, "\nTime to first output by turn (mean ms; turn 1 is always a cold prefill)\n%-10s",
                "format");
  for (int t = 0; t < turns; ++t) absl::FPrintF(out, " %9s", absl::StrCat("turn ", t + 1));
  absl::FPrintF(out, "\n");
  for (const FormatRow& r : rows) {
    absl::FPrintF(out, "%-10s", r.format);
    for (int t = 0; t < turns; ++t) {
      auto it = r.ttft_by_turn.find(t);
      absl::FPrintF(out, " %9.1f", it == r.ttft_by_turn.end() ? 0.0 : Mean(it->second));
    }
    absl::FPrintF(out, "\n");
  }
  absl::FPrintF(out,
                "\nckpts: checkpoints the budget holds; hit: turns 2+ that restored a checkpoint "
                "of their conversation\n(a full hit resumes the previous turn; after an eviction "
                "the whole context is recomputed); recomputed:\ncontext tokens prefilled again; "
                "prefilled: all tokens prefilled; TTFT: lookup + restore + prefill until the\n"
                "first reply byte's logits (median of the repeats); bits/byte and agreement (same "
                "greedy byte)\nagainst FP32 states in process, over %s scored positions.\n",
                Thousands(rows.empty() ? 0 : rows[0].accuracy.predicted));
}

// Where the checkpoints went cold (--host_checkpoint_mib): their format and
// size there, the host tier's hits and the transcodes both ways.
void PrintColdTiers(std::FILE* out, const std::vector<FormatRow>& rows, bool markdown) {
  absl::FPrintF(out, markdown ? "\n| format | checkpoint format | checkpoint (device) | checkpoint "
                                "(host) | host hits | transcodes to / from cold | bits/byte | "
                                "greedy agreement |\n|---|---|---|---|---|---|---|---|\n"
                              : "\n%-10s %-14s %10s %10s %9s %17s %9s %9s\n",
                "format", "ckpt format", "device", "host", "host hits", "to/from cold",
                "bits/byte", "agreement");
  for (const FormatRow& r : rows) {
    absl::FPrintF(out, markdown ? "| %s | %s | %s | %s | %d | %d / %d | %.4f | %.2f%% |\n"
                                : "%-10s %-14s %10s %10s %9d %8d/%-8d %9.4f %8.2f%%\n",
                  r.format, r.cold_format, Bytes(r.checkpoint_bytes), Bytes(r.cold_bytes),
                  r.host_hits, r.to_cold, r.from_cold, r.accuracy.bits_per_byte,
                  100 * r.accuracy.agreement);
  }
}

// The same two tables as Markdown (--markdown).
void PrintMarkdown(std::FILE* out, const std::vector<FormatRow>& rows, int turns) {
  const double fp32_ttft = Fp32Ttft(rows);
  absl::FPrintF(out, "\n| format | checkpoint | checkpoints in budget | hit rate (turns 2+) | "
                "restores | recomputed tokens | prefilled tokens | TTFT mean | TTFT p90 | "
                "TTFT vs fp32 | bits/byte | greedy agreement |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const FormatRow& r : rows) {
    absl::FPrintF(out, "| %s | %s | %d | %d/%d (%.0f%%) | %d | %s | %s | %.1f ms | %.1f ms | %s | %.4f | %.2f%% |\n",
                  r.format, Bytes(r.checkpoint_bytes), r.capacity, r.later_hit, r.later,
                  r.later ? 100.0 * r.later_hit / r.later : 0.0, r.restores,
                  Thousands(r.recomputed), Thousands(r.prefilled), Mean(r.ttft),
                  Percentile(r.ttft, 90), VsFp32(r, fp32_ttft), r.accuracy.bits_per_byte,
                  100 * r.accuracy.agreement);
  }
  absl::FPrintF(out, "\n| format |");
  for (int t = 0; t < turns; ++t) absl::FPrintF(out, " turn %d |", t + 1);
  absl::FPrintF(out, "\n|---|");
  for (int t = 0; t < turns; ++t) absl::FPrintF(out, "---|");
  absl::FPrintF(out, "\n");
  for (const FormatRow& r : rows) {
    absl::FPrintF(out, "| %s |", r.format);
    for (int t = 0; t < turns; ++t) {
      auto it = r.ttft_by_turn.find(t);
      absl::FPrintF(out, " %.1f ms |", it == r.ttft_by_turn.end() ? 0.0 : Mean(it->second));
    }
    absl::FPrintF(out, "\n");
  }
}

absl::Status RunServeBench(CtlContext& ctx, const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = {"serve-bench"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(&a[0]);
  ASSIGN_OR_RETURN(
      CliFlags f,
      CliFlags::Parse(static_cast<int>(argv.size()), argv.data(),
                      {"server", "statecached", "backend", "model", "formats", "budget_mib",
                       "conversations", "turns", "prompt_bytes", "reply_bytes", "seed",
                       "calibration_docs", "threads", "repeats", "host_checkpoint_mib",
                       "checkpoint_format"},
                      {"help", "markdown", "round_robin"}));
  std::FILE* out = ctx.out();
  if (f.Has("help")) {
    absl::FPrintF(out, "%s", kServeBenchHelp);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const ServeBenchOptions o, ParseServeBenchOptions(f));
  const WorkloadOptions& wo = o.wo;
  const auto t0 = std::chrono::steady_clock::now();

  ASSIGN_OR_RETURN(DemoData data, LoadDemoData(f.Get("model", "gdn-tiny"), o.threads));
  const LanguageModel& model = *data.model;
  const ModelGeometry geo = model.config().Geometry();
  ASSIGN_OR_RETURN(std::vector<Conversation> convs, MakeConversations(data.heldout, wo));
  const auto schedule = MakeSchedule(convs, wo);
  ServerSetup setup;
  setup.server = f.Get("server", ctx.server());
  setup.statecached = f.Get("statecached", "");
  setup.backend = f.Get("backend", "cpu");
  setup.checkpoint_memory_bytes = o.budget;
  setup.host_checkpoint_bytes = o.host_bytes;
  ASSIGN_OR_RETURN(ServerHandle server, StartOrConnect(setup));

  absl::FPrintF(out, "statecache serve-bench: multi-turn prefix reuse under one checkpoint budget\n\n");
  absl::FPrintF(out, "  model      %s (%s, %d layers x %d value heads, %d x %d states)\n",
                data.model_name, geo.arch == Arch::kKda ? "KDA" : "GDN", geo.layers, geo.h_v,
                geo.d_k, geo.d_v);
  absl::FPrintF(out, "  server     %s\n", server.description);
  absl::FPrintF(out, "  budget     %s of checkpoint memory per format (max_checkpoint_bytes)\n",
                Bytes(o.budget));
  if (o.host_bytes > 0) {
    absl::FPrintF(out, "  host tier  %s per format; its checkpoints in %s\n", Bytes(o.host_bytes),
                  o.checkpoint_format.empty() ? "each format's own" : o.checkpoint_format);
  }
  absl::FPrintF(out,
                "  workload   %d conversations x %d turns (%d new bytes prefilled + %d decoded per "
                "turn), %s, %zu turns\n\n",
                wo.conversations, wo.turns, wo.prompt_bytes, wo.reply_bytes,
                wo.shuffle ? absl::StrCat("random interleaving (seed ", wo.seed, ")")
                           : std::string("round robin"),
                schedule.size());

  ASSIGN_OR_RETURN(WorkloadResult ref, RunFp32Reference(model, convs, schedule));
  const ServeBenchRun run{o, data, convs, schedule, server};
  std::vector<FormatRow> rows(o.formats.size());
  ASSIGN_OR_RETURN(const std::vector<StateLayout> layouts, FormatLayouts(run, out, rows));
  // Repeats interleave the formats so that machine noise hits all alike; the
  // cache behaviour is deterministic (same schedule, LRU), TTFT per turn is
  // the median over repeats.
  std::vector<std::vector<std::vector<double>>> ttft(o.formats.size());  // [format][turn][repeat]
  for (int rep = 0; rep < o.repeats; ++rep) {
    for (size_t i = 0; i < o.formats.size(); ++i) {
      RETURN_IF_ERROR(ServeOnce(run, layouts[i], ref, rep == 0, rows[i], ttft[i]));
    }
    absl::FPrintF(out, "  repeat %d/%d done\n", rep + 1, o.repeats);
  }
  for (size_t i = 0; i < o.formats.size(); ++i) {
    for (size_t k = 0; k < schedule.size(); ++k) {
      const double median = Percentile(ttft[i][k], 50);
      rows[i].ttft.push_back(median);
      rows[i].ttft_by_turn[schedule[k].second].push_back(median);
    }
  }

  PrintTables(out, rows, wo.turns);
  if (o.host_bytes > 0) PrintColdTiers(out, rows, false);
  if (f.Has("markdown")) PrintMarkdown(out, rows, wo.turns);
  if (f.Has("markdown") && o.host_bytes > 0) PrintColdTiers(out, rows, true);
  absl::FPrintF(out, "\nTotal %.1f s.\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return absl::OkStatus();
}

}  // namespace

Command ServeBenchCommand() {
  Command c{"serve-bench",
            "fp32 / bf16 / damp under one checkpoint budget: hits, restores, recompute, TTFT",
            "serve-bench [--budget_mib=4 --formats=fp32,bf16,damp:16 ...]   (serve-bench --help)",
            RunServeBench};
  c.own_flags = true;
  return c;
}

}  // namespace statecache
