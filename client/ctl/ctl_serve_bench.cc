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
// Setups (--setups) add rows for a host tier and several instances behind
// the client's hash ring, alone or sharing one Redis; --state_geometry=qwen3.6
// makes the checkpoints those of Qwen3.6-35B-A3B's states (a cache subject,
// serve_bench_cluster.h) while the shipped model supplies the tokens.
//
//   statecachectl serve-bench                              # fp32, bf16, damp:16; 4 MiB
//   statecachectl serve-bench --budget_mib=8 --formats=fp32,damp:16 --markdown
//   statecachectl serve-bench --state_geometry=qwen3.6 --setups=1,1+host,2,2+redis
//   statecachectl serve-bench --formats=damp:16 --setups=1+host --host_mib=64 \
//       --checkpoint_format=int4-hadamard          # cold checkpoints in another format
#include <unistd.h>

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
#include "client/ctl/serve_bench_cluster.h"
#include "client/ctl/serve_bench_routing.h"
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
    "  --server, --statecached, --backend, --model, --threads   as for demo\n"
    "  --budget_gib=X         the budget in GiB instead of --budget_mib\n"
    "  --setups=LIST          row groups, each N[+host][+redis]: N statecached children, with\n"
    "                         a host tier (--host_mib each), sharing one Redis [1]\n"
    "  --host_mib=X           host tier of each model in a +host setup, MiB [the budget]\n"
    "  --redis=HOST:PORT      the Redis of +redis setups [start --redis_server on a free port]\n"
    "  --redis_server=PATH    redis-server to start [redis-server from PATH]\n"
    "  --servers=A,B          running statecacheds instead of children (one setup)\n"
    "  --route=ring|round_robin  turns to instances: the conversation's owner on the hash\n"
    "                         ring (client/routing), or the next instance (no affinity) [ring]\n"
    "  --join_after=N         ring: the last instance joins after N turns [turns / 4]\n"
    "  --state_geometry=G     model: the served model's own states are the cache; qwen3.6:\n"
    "                         the cache subject is a Qwen3.6-35B-A3B-sized state (30 GDN layers,\n"
    "                         16 key / 32 value heads, 128 x 128) in the same format, one slot\n"
    "                         per instance, checkpointed with 30 x 48 KiB of conv windows; every\n"
    "                         turn it looks up / restores / snapshots on the routed instance and\n"
    "                         the served model restores exactly what it restored. Several\n"
    "                         instances use a subject of the model's geometry. [model]\n"
    "  --checkpoint_format=F  format of the checkpoints in the cold tiers (host, disk, Redis)\n"
    "                         [each format's own]\n";

struct FormatRow {
  std::string setup;  // ServeSetup::name
  std::string format;
  int64_t checkpoint_bytes = 0;  // one checkpoint (packed slot)
  int64_t capacity = 0;          // checkpoints the budget holds
  int later = 0, later_hit = 0, full_hit = 0;
  int64_t restores = 0, evictions = 0, recomputed = 0, prefilled = 0;
  int64_t cross = 0;  // restores of a checkpoint snapshotted on another instance
  std::vector<double> ttft;               // all turns
  std::map<int, std::vector<double>> ttft_by_turn;
  Accuracy accuracy;
  double wall = 0;
  // Cold tiers (--checkpoint_format; single-instance setups).
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
  std::vector<ServeSetup> setups;
  std::vector<std::string> servers;  // --servers / --server (empty: children)
  std::optional<ModelGeometry> state_geometry;
  RouteMode route = RouteMode::kRing;
  int join_after = -1;     // -1: a quarter of the schedule
  int64_t host_bytes = 0;  // per model, +host setups
  std::string redis, redis_server;
  std::string checkpoint_format;  // "" = each format's own
  // The cache is a subject registration (SubjectCache), not the served
  // model's own checkpoints.
  bool subject() const {
    if (state_geometry.has_value() || servers.size() > 1) return true;
    for (const ServeSetup& s : setups) {
      if (s.instances > 1) return true;
    }
    return false;
  }
};

constexpr char kServeBenchValueFlags[][20] = {
    "server", "statecached", "backend", "model", "formats", "budget_mib", "conversations",
    "turns", "prompt_bytes", "reply_bytes", "seed", "calibration_docs", "threads", "repeats",
    "budget_gib", "setups", "host_mib", "redis", "redis_server", "servers", "route",
    "join_after", "state_geometry", "checkpoint_format"};

absl::Status ParseClusterOptions(const CliFlags& f, ServeBenchOptions& o) {
  ASSIGN_OR_RETURN(o.setups, ParseServeSetups(f.Get("setups", "1")));
  for (absl::string_view s : absl::StrSplit(f.Get("servers", ""), ',', absl::SkipEmpty())) {
    o.servers.emplace_back(s);
  }
  if (!o.servers.empty() && f.Has("server")) {
    return absl::InvalidArgumentError("--servers: give --server or --servers, not both");
  }
  if (!o.servers.empty() && f.Has("setups")) {
    return absl::InvalidArgumentError("--setups: not with --servers (running servers are one setup)");
  }
  if (!o.servers.empty()) {
    o.setups = {ServeSetup{static_cast<int>(o.servers.size()), false, false,
                           absl::StrCat(o.servers.size(), " given")}};
  }
  ASSIGN_OR_RETURN(o.state_geometry, ParseStateGeometry(f.Get("state_geometry", "model")));
  const std::string route = f.Get("route", "ring");
  if (route == "round_robin") {
    o.route = RouteMode::kRoundRobin;
  } else if (route != "ring") {
    return absl::InvalidArgumentError(
        absl::StrCat("--route: '", route, "' (want ring or round_robin)"));
  }
  ASSIGN_OR_RETURN(o.join_after, f.GetInt("join_after", -1));
  if (f.Has("join_after") && o.join_after < 0) {
    return absl::InvalidArgumentError("--join_after: must be >= 0");
  }
  ASSIGN_OR_RETURN(const double host_mib, f.GetDouble("host_mib", o.budget / double(1 << 20)));
  if (!(host_mib > 0)) return absl::InvalidArgumentError("--host_mib: must be > 0");
  o.host_bytes = static_cast<int64_t>(host_mib * (1 << 20));
  o.redis = f.Get("redis", "");
  if (!o.redis.empty()) {
    std::string host;
    int port = 0;
    RETURN_IF_ERROR(ParseHostPort(o.redis, "--redis", &host, &port));
  }
  o.redis_server = f.Get("redis_server", "redis-server");
  o.checkpoint_format = f.Get("checkpoint_format", "");
  if (!o.checkpoint_format.empty()) {
    absl::StatusOr<FormatSpec> cf = ParseFormatSpec(o.checkpoint_format);
    if (!cf.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--checkpoint_format: ", cf.status().message()));
    }
  }
  return absl::OkStatus();
}

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
  if (f.Has("budget_mib") && f.Has("budget_gib")) {
    return absl::InvalidArgumentError("--budget_gib: give --budget_mib or --budget_gib, not both");
  }
  ASSIGN_OR_RETURN(const double budget_gib, f.GetDouble("budget_gib", 0));
  ASSIGN_OR_RETURN(const double budget_mib, f.GetDouble("budget_mib", 4));
  if (f.Has("budget_gib")) {
    if (!(budget_gib > 0)) return absl::InvalidArgumentError("--budget_gib: must be > 0");
    o.budget = static_cast<int64_t>(budget_gib * (int64_t{1} << 30));
  } else {
    if (!(budget_mib > 0)) return absl::InvalidArgumentError("--budget_mib: must be > 0");
    o.budget = static_cast<int64_t>(budget_mib * (1 << 20));
  }
  ASSIGN_OR_RETURN(o.calibration_docs, f.GetInt("calibration_docs", 2));
  ASSIGN_OR_RETURN(o.repeats, f.GetInt("repeats", 3));
  if (o.repeats < 1) return absl::InvalidArgumentError("--repeats: must be >= 1");
  ASSIGN_OR_RETURN(o.threads, f.GetInt("threads", 0));
  for (absl::string_view s : absl::StrSplit(f.Get("formats", "fp32,bf16,damp:16"), ',')) {
    ASSIGN_OR_RETURN(FormatSpec spec, ParseFormatSpec(s));
    o.formats.push_back(spec);
  }
  RETURN_IF_ERROR(ParseClusterOptions(f, o));
  return o;
}

// What every step of a run reads: the model and its data, the workload, the
// servers of the setup (instance 0 runs the served model), the router and
// the Redis it flushes between runs (subject runs).
struct ServeBenchRun {
  const ServeBenchOptions& o;
  const DemoData& data;
  const std::vector<Conversation>& convs;
  const std::vector<std::pair<int, int>>& schedule;
  std::vector<ServerHandle>& servers;
  const ConversationRouter* router = nullptr;  // subject runs
  const RedisProcess* redis = nullptr;         // owned Redis of a +redis setup
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

// Hit counters of `run` into `row`.
void CountTurns(const WorkloadResult& run, FormatRow& row) {
  for (const TurnStats& ts : run.turns) {
    row.recomputed += ts.recomputed_tokens;
    row.prefilled += ts.prefilled_tokens;
    if (ts.turn == 0) continue;
    ++row.later;
    row.later_hit += ts.restored_tokens > 0;
    row.full_hit += ts.restored_tokens == ts.context_tokens;
  }
}

// Appends each turn's TTFT of `run` to ttft[turn].
void AddTtft(const WorkloadResult& run, std::vector<std::vector<double>>& ttft) {
  ttft.resize(run.turns.size());
  for (size_t k = 0; k < run.turns.size(); ++k) ttft[k].push_back(run.turns[k].ttft_ms);
}

// Serves the workload once with format i (registered under the budget,
// dropped again whatever happens): appends each turn's TTFT to ttft[turn]
// and, on the first repeat, fills row's counters and accuracy.
absl::Status ServeOnce(const ServeBenchRun& r, const StateLayout& layout, const WorkloadResult& ref,
                       bool first, FormatRow& row, std::vector<std::vector<double>>& ttft) {
  StateCacheClient* client = r.servers[0].client.get();
  Registration reg;
  reg.slots = 1;
  reg.max_checkpoint_bytes = r.o.budget;
  reg.checkpoint_format = r.o.checkpoint_format;
  ASSIGN_OR_RETURN(v1::ModelInfo mi,
                   RegisterLayout(client, absl::StrCat(r.data.model_name, "-bench"), layout, reg));
  const auto t = std::chrono::steady_clock::now();
  absl::StatusOr<WorkloadResult> run =
      RunRemoteWorkload(*r.data.model, client, mi.model_id(), r.convs, r.schedule, {});
  absl::StatusOr<v1::GetStatsResponse> stats = client->GetStats(mi.model_id());
  // Free the budget for the next format whatever happened.
  RETURN_IF_ERROR(client->DropModel(mi.model_id(), /*force=*/true));
  RETURN_IF_ERROR(run.status());
  RETURN_IF_ERROR(stats.status());
  row.wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  AddTtft(*run, ttft);
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
  CountTurns(*run, row);
  ASSIGN_OR_RETURN(row.accuracy, CompareRuns(*run, ref));
  return absl::OkStatus();
}

// The subject's checkpoint counters summed over the instances, then every
// registration dropped and an owned Redis flushed (first error wins).
absl::Status CloseSubjectRun(const ServeBenchRun& r, const std::string& subject_id,
                             const std::string& served_id, FormatRow* row) {
  absl::Status status;
  int64_t restores = 0, evictions = 0, capacity = 0;
  for (ServerHandle& s : r.servers) {
    absl::StatusOr<v1::GetStatsResponse> stats = s.client->GetStats(subject_id);
    if (stats.ok() && stats->models_size() == 1) {
      restores += stats->models(0).stats().restores();
      evictions += stats->models(0).stats().evictions();
      if (capacity == 0) capacity = stats->models(0).stats().checkpoint_capacity();
    } else if (status.ok()) {
      status = stats.ok() ? absl::InternalError("GetStats: no subject model") : stats.status();
    }
    status.Update(s.client->DropModel(subject_id, /*force=*/true));
  }
  status.Update(r.servers[0].client->DropModel(served_id, /*force=*/true));
  if (r.redis != nullptr) {
    status.Update(RedisCommand("127.0.0.1", r.redis->port(), {"FLUSHALL"}).status());
  }
  if (row != nullptr) {
    row->restores = restores;
    row->evictions = evictions;
    row->capacity = capacity;
  }
  return status;
}

// ServeOnce with a cache subject (serve_bench_cluster.h): `subject_layout`
// registered on every instance under the budget, the served model (`layout`)
// on instance 0 with the rest of its memory.
absl::Status ServeSubjectOnce(const ServeBenchRun& r, const StateLayout& layout,
                              const StateLayout& subject_layout, const WorkloadResult& ref,
                              bool first, FormatRow& row,
                              std::vector<std::vector<double>>& ttft) {
  // A fresh subject id per run: a shared Redis never serves an earlier run's
  // checkpoints (its key tags name the model).
  static int runs = 0;
  const std::string base = absl::StrCat("serve-bench-subject-", getpid(), "-", ++runs);
  Registration sreg;
  sreg.slots = 1;
  sreg.max_checkpoint_bytes = r.o.budget;
  sreg.checkpoint_format = r.o.checkpoint_format;
  std::vector<StateCacheClient*> clients;
  v1::ModelInfo subject_info;
  for (ServerHandle& s : r.servers) {
    ASSIGN_OR_RETURN(subject_info, RegisterLayout(s.client.get(), base, subject_layout, sreg));
    if (subject_info.model_id() != base) {
      return absl::AlreadyExistsError(absl::StrCat("model_id: ", base, " is taken on ",
                                                   s.description, "; drop it"));
    }
    clients.push_back(s.client.get());
  }
  Registration reg;
  reg.slots = 1;
  ASSIGN_OR_RETURN(v1::ModelInfo mi,
                   RegisterLayout(clients[0], absl::StrCat(r.data.model_name, "-served"), layout,
                                  reg));
  const auto t = std::chrono::steady_clock::now();
  absl::StatusOr<WorkloadResult> run;
  SubjectCache::Counts counts;
  {
    absl::StatusOr<std::unique_ptr<SubjectCache>> cache =
        SubjectCache::Create(clients, base, r.router);
    run = cache.ok() ? RunRemoteWorkload(*r.data.model, clients[0], mi.model_id(), r.convs,
                                         r.schedule, {}, cache->get())
                     : absl::StatusOr<WorkloadResult>(cache.status());
    if (cache.ok()) counts = (*cache)->counts();
  }  // the subject's slots are released here
  RETURN_IF_ERROR(CloseSubjectRun(r, base, mi.model_id(), first ? &row : nullptr));
  RETURN_IF_ERROR(run.status());
  row.wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  AddTtft(*run, ttft);
  if (!first) return absl::OkStatus();
  row.checkpoint_bytes = subject_info.slot_bytes();
  row.cross = counts.cross_instance_hits;
  CountTurns(*run, row);
  ASSIGN_OR_RETURN(row.accuracy, CompareRuns(*run, ref));
  return absl::OkStatus();
}

// "+12.3%": mean TTFT of `r` against its setup's fp32 row ("-" without one).
std::string VsFp32(const std::vector<FormatRow>& rows, const FormatRow& r) {
  for (const FormatRow& f : rows) {
    if (f.setup == r.setup && f.format == "fp32" && Mean(f.ttft) > 0) {
      return absl::StrFormat("%+.1f%%", 100 * (Mean(r.ttft) / Mean(f.ttft) - 1));
    }
  }
  return "-";
}

// The serving table, the TTFT-by-turn table and their legend.
void PrintTables(std::FILE* out, const std::vector<FormatRow>& rows, int turns) {
  // Table 1: serving.
  absl::FPrintF(out, "\n%-12s %-10s %10s %6s %14s %8s %9s %10s %10s %7s %10s %9s %8s %9s %9s\n",
                "setup", "format", "ckpt size", "ckpts", "hit (turns 2+)", "restores",
                "evictions", "recomputed", "prefilled", "x-inst", "TTFT mean", "TTFT p90",
                "vs fp32", "bits/byte", "agreement");
  for (const FormatRow& r : rows) {
    absl::FPrintF(out, "%-12s %-10s %10s %6d %8d/%-2d %3.0f%% %8d %9d %10s %10s %7d %7.1f ms %6.1f ms %8s %9.4f %8.2f%%\n",
                  r.setup, r.format, Bytes(r.checkpoint_bytes), r.capacity, r.later_hit, r.later,
                  r.later ? 100.0 * r.later_hit / r.later : 0.0, r.restores, r.evictions,
                  Thousands(r.recomputed), Thousands(r.prefilled), r.cross, Mean(r.ttft),
                  Percentile(r.ttft, 90), VsFp32(rows, r), r.accuracy.bits_per_byte,
                  100 * r.accuracy.agreement);
  }
  absl::FPrintF(out, "%-12s %-10s %10s %6s %14s %8s %9s %10s %10s %7s %10s %9s %8s %9.4f %8.2f%%\n",
                "-", "fp32 ref", "-", "-", "(in process)", "-", "-", "-", "-", "-", "-", "-", "-",
                rows.empty() ? 0.0 : rows[0].accuracy.reference_bits_per_byte, 100.0);
  // Table 2: TTFT by turn.
  absl::FPrintF(out, "\nTime to first output by turn (mean ms; turn 1 is always a cold prefill)\n%-12s %-10s",
                "setup", "format");
  for (int t = 0; t < turns; ++t) absl::FPrintF(out, " %9s", absl::StrCat("turn ", t + 1));
  absl::FPrintF(out, "\n");
  for (const FormatRow& r : rows) {
    absl::FPrintF(out, "%-12s %-10s", r.setup, r.format);
    for (int t = 0; t < turns; ++t) {
      auto it = r.ttft_by_turn.find(t);
      absl::FPrintF(out, " %9.1f", it == r.ttft_by_turn.end() ? 0.0 : Mean(it->second));
    }
    absl::FPrintF(out, "\n");
  }
  absl::FPrintF(out,
                "\nckpts: checkpoints the budget holds (one instance); hit: turns 2+ that restored a "
                "checkpoint of their conversation\n(x-inst: one snapshotted on another instance; a full hit resumes the previous turn; after an eviction "
                "the whole context is recomputed); recomputed:\ncontext tokens prefilled again; "
                "prefilled: all tokens prefilled; TTFT: lookup + restore + prefill until the\n"
                "first reply byte's logits (median of the repeats); bits/byte and agreement (same "
                "greedy byte)\nagainst FP32 states in process, over %s scored positions.\n",
                Thousands(rows.empty() ? 0 : rows[0].accuracy.predicted));
}

// Where the checkpoints went cold (--checkpoint_format): their format and
// size there, the host tier's hits and the transcodes both ways.
void PrintColdTiers(std::FILE* out, const std::vector<FormatRow>& rows, bool markdown) {
  absl::FPrintF(out, markdown ? "\n| setup | format | checkpoint format | checkpoint (device) | "
                                "checkpoint (cold) | host hits | transcodes to / from cold | "
                                "bits/byte | greedy agreement |\n|---|---|---|---|---|---|---|---|---|\n"
                              : "\n%-8s %-10s %-14s %10s %10s %9s %17s %9s %9s\n",
                "setup", "format", "ckpt format", "device", "cold", "host hits", "to/from cold",
                "bits/byte", "agreement");
  for (const FormatRow& r : rows) {
    absl::FPrintF(out, markdown ? "| %s | %s | %s | %s | %s | %d | %d / %d | %.4f | %.2f%% |\n"
                                : "%-8s %-10s %-14s %10s %10s %9d %8d/%-8d %9.4f %8.2f%%\n",
                  r.setup, r.format, r.cold_format, Bytes(r.checkpoint_bytes), Bytes(r.cold_bytes),
                  r.host_hits, r.to_cold, r.from_cold, r.accuracy.bits_per_byte,
                  100 * r.accuracy.agreement);
  }
}

// The same two tables as Markdown (--markdown).
void PrintMarkdown(std::FILE* out, const std::vector<FormatRow>& rows, int turns) {
  absl::FPrintF(out, "\n| setup | format | checkpoint | checkpoints in budget | hit rate (turns 2+) | "
                "restores | recomputed tokens | prefilled tokens | cross-instance restores | TTFT mean | "
                "TTFT p90 | TTFT vs fp32 | bits/byte | greedy agreement |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const FormatRow& r : rows) {
    absl::FPrintF(out, "| %s | %s | %s | %d | %d/%d (%.0f%%) | %d | %s | %s | %d | %.1f ms | %.1f ms | %s | %.4f | %.2f%% |\n",
                  r.setup, r.format, Bytes(r.checkpoint_bytes), r.capacity, r.later_hit, r.later,
                  r.later ? 100.0 * r.later_hit / r.later : 0.0, r.restores,
                  Thousands(r.recomputed), Thousands(r.prefilled), r.cross, Mean(r.ttft),
                  Percentile(r.ttft, 90), VsFp32(rows, r), r.accuracy.bits_per_byte,
                  100 * r.accuracy.agreement);
  }
  absl::FPrintF(out, "\n| setup | format |");
  for (int t = 0; t < turns; ++t) absl::FPrintF(out, " turn %d |", t + 1);
  absl::FPrintF(out, "\n|---|---|");
  for (int t = 0; t < turns; ++t) absl::FPrintF(out, "---|");
  absl::FPrintF(out, "\n");
  for (const FormatRow& r : rows) {
    absl::FPrintF(out, "| %s | %s |", r.setup, r.format);
    for (int t = 0; t < turns; ++t) {
      auto it = r.ttft_by_turn.find(t);
      absl::FPrintF(out, " %.1f ms |", it == r.ttft_by_turn.end() ? 0.0 : Mean(it->second));
    }
    absl::FPrintF(out, "\n");
  }
}

// The servers of `setup`: the given ones (--server / --servers), or
// children with the budget (plus room for the served model in subject runs)
// and the setup's tiers.
absl::StatusOr<std::vector<ServerHandle>> SetupServers(const ServeBenchOptions& o,
                                                       const ServeSetup& setup,
                                                       const std::string& server,
                                                       const std::string& statecached,
                                                       const std::string& backend,
                                                       const std::string& redis,
                                                       int64_t extra_state, int64_t extra_ckpt) {
  std::vector<ServerHandle> out;
  if (!o.servers.empty()) {
    for (const std::string& address : o.servers) {
      ServerSetup ss;
      ss.server = address;
      ASSIGN_OR_RETURN(ServerHandle h, StartOrConnect(ss));
      out.push_back(std::move(h));
    }
    return out;
  }
  for (int i = 0; i < setup.instances; ++i) {
    ServerSetup ss;
    ss.server = server;
    ss.statecached = statecached;
    ss.backend = backend;
    ss.state_memory_bytes += extra_state;
    ss.checkpoint_memory_bytes = o.budget + extra_ckpt;
    if (setup.host) {
      ss.extra_args.push_back(absl::StrCat("--host_checkpoint_bytes=", o.host_bytes));
    }
    if (setup.redis) {
      ss.extra_args.push_back(absl::StrCat("--redis_checkpoint_address=", redis));
      ss.extra_args.push_back("--redis_checkpoint_ttl_s=900");
    }
    ASSIGN_OR_RETURN(ServerHandle h, StartOrConnect(ss));
    out.push_back(std::move(h));
  }
  return out;
}

// The header lines before the tables.
void PrintHeader(std::FILE* out, const ServeBenchOptions& o, const DemoData& data,
                 const std::vector<StateLayout>& subject_layouts, size_t turns) {
  const WorkloadOptions& wo = o.wo;
  const ModelGeometry geo = data.model->config().Geometry();
  absl::FPrintF(out, "statecache serve-bench: multi-turn prefix reuse under one checkpoint budget\n\n");
  absl::FPrintF(out, "  model      %s (%s, %d layers x %d value heads, %d x %d states)\n",
                data.model_name, geo.arch == Arch::kKda ? "KDA" : "GDN", geo.layers, geo.h_v,
                geo.d_k, geo.d_v);
  if (o.subject() && !subject_layouts.empty()) {
    const ModelGeometry& g = subject_layouts[0].geometry();
    absl::FPrintF(out,
                  "  cache      subject of %s geometry (%d layers x %d key / %d value heads, %d x "
                  "%d states: %s of fp32 per sequence) + %s of conv windows per checkpoint;\n"
                  "             the served model restores what the subject restores\n",
                  o.state_geometry.has_value() ? "Qwen3.6-35B-A3B" : "the model's", g.layers,
                  g.h_qk, g.h_v, g.d_k, g.d_v, Bytes(4.0 * StateElements(g)),
                  Bytes(double(ConvWindowBytesPerLayer(g)) * g.layers));
  }
  absl::FPrintF(out, "  budget     %s of checkpoint memory per format and instance (max_checkpoint_bytes)\n",
                Bytes(o.budget));
  absl::FPrintF(out,
                "  workload   %d conversations x %d turns (%d new bytes prefilled + %d decoded per "
                "turn), %s, %zu turns\n",
                wo.conversations, wo.turns, wo.prompt_bytes, wo.reply_bytes,
                wo.shuffle ? absl::StrCat("random interleaving (seed ", wo.seed, ")")
                           : std::string("round robin"),
                turns);
}

// Runs every format and repeat on one setup's servers; appends its rows.
absl::Status RunSetup(const ServeBenchRun& run, const ServeSetup& setup,
                      const std::vector<StateLayout>& layouts,
                      const std::vector<StateLayout>& subject_layouts, const WorkloadResult& ref,
                      std::FILE* out, std::vector<FormatRow>& all_rows) {
  const ServeBenchOptions& o = run.o;
  std::vector<FormatRow> rows(o.formats.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].setup = setup.name;
    rows[i].format = FormatSpecName(o.formats[i]);
  }
  // Repeats interleave the formats so that machine noise hits all alike; the
  // cache behaviour is deterministic (same schedule, LRU), TTFT per turn is
  // the median over repeats.
  std::vector<std::vector<std::vector<double>>> ttft(o.formats.size());  // [format][turn][repeat]
  for (int rep = 0; rep < o.repeats; ++rep) {
    for (size_t i = 0; i < o.formats.size(); ++i) {
      RETURN_IF_ERROR(o.subject() ? ServeSubjectOnce(run, layouts[i], subject_layouts[i], ref,
                                                     rep == 0, rows[i], ttft[i])
                                  : ServeOnce(run, layouts[i], ref, rep == 0, rows[i], ttft[i]));
    }
    absl::FPrintF(out, "  setup %s: repeat %d/%d done\n", setup.name, rep + 1, o.repeats);
  }
  for (size_t i = 0; i < o.formats.size(); ++i) {
    for (size_t k = 0; k < run.schedule.size(); ++k) {
      const double median = Percentile(ttft[i][k], 50);
      rows[i].ttft.push_back(median);
      rows[i].ttft_by_turn[run.schedule[k].second].push_back(median);
    }
  }
  all_rows.insert(all_rows.end(), rows.begin(), rows.end());
  return absl::OkStatus();
}

absl::Status RunServeBench(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  for (const char* name : kServeBenchValueFlags) spec.value_flags.insert(name);
  spec.bool_flags = {"markdown", "round_robin"};
  ASSIGN_OR_RETURN(CliFlags f, ParseCommandFlags(args, spec));
  std::FILE* out = ctx.out();
  if (f.Has("help")) {
    absl::FPrintF(out, "%s", kServeBenchHelp);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const ServeBenchOptions o, ParseServeBenchOptions(f));
  const std::string server = f.Get("server", ctx.server());
  for (const ServeSetup& setup : o.setups) {
    if (!server.empty() && (setup.instances > 1 || setup.host || setup.redis)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--setups: '", setup.name, "' starts its own statecacheds; not with --server"));
    }
  }
  const auto t0 = std::chrono::steady_clock::now();

  ASSIGN_OR_RETURN(DemoData data, LoadDemoData(f.Get("model", "gdn-tiny"), o.threads));
  const LanguageModel& model = *data.model;
  ASSIGN_OR_RETURN(std::vector<Conversation> convs, MakeConversations(data.heldout, o.wo));
  const auto schedule = MakeSchedule(convs, o.wo);
  std::vector<FormatRow> names(o.formats.size());
  std::vector<ServerHandle> none;
  ASSIGN_OR_RETURN(const std::vector<StateLayout> layouts,
                   FormatLayouts(ServeBenchRun{o, data, convs, schedule, none}, out, names));
  std::vector<StateLayout> subject_layouts;
  if (o.subject()) {
    for (size_t i = 0; i < o.formats.size(); ++i) {
      if (!o.state_geometry.has_value()) {
        subject_layouts.push_back(layouts[i]);
        continue;
      }
      ASSIGN_OR_RETURN(StateLayout l, StateLayout::Identity(*o.state_geometry, o.formats[i]));
      subject_layouts.push_back(std::move(l));
    }
  }
  PrintHeader(out, o, data, subject_layouts, schedule.size());
  ASSIGN_OR_RETURN(WorkloadResult ref, RunFp32Reference(model, convs, schedule));

  // Subject runs: room for one fp32 subject slot and every served checkpoint.
  int64_t extra_state = 0, extra_ckpt = 0;
  if (o.subject()) {
    const ModelGeometry sg = subject_layouts[0].geometry();
    extra_state = 4 * StateElements(sg);
    extra_ckpt = static_cast<int64_t>(schedule.size()) *
                     (4 * StateElements(model.config().Geometry()) + (64 << 10)) +
                 (16 << 20);
  }
  std::vector<std::string> keys;
  for (const Conversation& c : convs) keys.push_back(c.name);
  std::unique_ptr<RedisProcess> redis;
  std::vector<FormatRow> rows;
  for (const ServeSetup& setup : o.setups) {
    std::string redis_address = o.redis;
    if (setup.redis && redis_address.empty()) {
      if (redis == nullptr) {
        ASSIGN_OR_RETURN(redis, RedisProcess::Start(o.redis_server));
      }
      redis_address = redis->address();
    }
    ASSIGN_OR_RETURN(std::vector<ServerHandle> servers,
                     SetupServers(o, setup, server,
                                  f.Get("statecached", ""), f.Get("backend", "cpu"),
                                  redis_address, extra_state, extra_ckpt));
    RouterOptions ro;
    ro.instances = static_cast<int>(servers.size());
    ro.mode = o.route;
    ro.join_after = o.join_after >= 0 ? o.join_after : static_cast<int>(schedule.size() / 4);
    ASSIGN_OR_RETURN(const ConversationRouter router, ConversationRouter::Create(keys, ro));
    absl::FPrintF(out, "  setup %-8s %s; %s%s\n", setup.name, router.Describe(),
                  servers[0].description, servers.size() > 1 ? ", ..." : "");
    const ServeBenchRun run{o,       data,    convs,
                            schedule, servers, &router,
                            setup.redis && o.redis.empty() ? redis.get() : nullptr};
    RETURN_IF_ERROR(RunSetup(run, setup, layouts, subject_layouts, ref, out, rows));
  }

  PrintTables(out, rows, o.wo.turns);
  const bool cold = !o.checkpoint_format.empty() && !o.subject();
  if (cold) PrintColdTiers(out, rows, false);
  if (f.Has("markdown")) PrintMarkdown(out, rows, o.wo.turns);
  if (f.Has("markdown") && cold) PrintColdTiers(out, rows, true);
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
