// multi_worker_bench (issue 33; tagged "benchmark"): per-step time of one
// data-plane worker alone vs W workers at once, each on its own B slots of
// one model, every layer through SubmitUpdates (server/dataplane/bench/
// multi_worker.h). Default: the Qwen3.6-35B-A3B geometry (30 GDN layers,
// 16 key / 32 value heads, 128 x 128, damp), B = 256, W = 8.
//
//   multi_worker_bench --backend=cpu --geometry=gdn:2:1:2:32:32 --batch=4 --workers=3
//   multi_worker_bench --backend=cuda --server=spawn --statecached=PATH   # full size
//
// Lines (one per worker and phase, then the summary; see docs/BENCHMARKS.md):
//   MULTI phase=alone|together workers=W worker=i steps=N p50_ms p99_ms mean_ms
//   VERIFY phase=... o_compared o_mismatches slots_compared slot_mismatches result=OK|MISMATCH
//   MULTI_SUMMARY alone_p50_ms together_p50_ms_max together_p50_ms_min ratio fairness ...
// Exit 0 when every run and replay matched, 1 otherwise, 2 on bad flags.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"
#include "server/core/log.h"
#include "server/dataplane/bench/bench_common.h"
#include "server/dataplane/bench/multi_worker.h"

ABSL_FLAG(std::string, backend, "cpu", "cpu or cuda.");
ABSL_FLAG(std::string, geometry, "gdn:30:16:32:128:128", "arch:layers:h_qk:h_v:d_k:d_v");
ABSL_FLAG(std::string, format, "damp", "Storage format.");
ABSL_FLAG(int, batch, 256, "Slots per worker (B).");
ABSL_FLAG(int, workers, 8, "Concurrent workers of the 'together' phase.");
ABSL_FLAG(int, steps, 20, "Timed decode steps per worker.");
ABSL_FLAG(int, warmup, 3, "Untimed decode steps first.");
ABSL_FLAG(std::string, server, "inproc", "inproc (CPU only) or spawn.");
ABSL_FLAG(std::string, statecached, "", "statecached binary for --server=spawn.");
ABSL_FLAG(bool, verify, true, "Replay every worker serially and compare o and slot bytes.");
ABSL_FLAG(int, verify_slots, -1, "Slots per worker whose exported bytes are compared (-1: all).");
ABSL_FLAG(bool, layer_waits, false,
          "StreamWait after every layer's Submit (a worker consuming o between layers) "
          "instead of one wait per step.");
ABSL_FLAG(double, goal_ratio, 1.2, "Together vs alone p50 step time reported as met below this.");

namespace statecache {
namespace bench {
namespace {

// Prints one phase; returns false when its replay mismatched.
bool Print(const char* phase, const MultiWorkerReport& r, int layers, int batch) {
  int64_t steps = 0;
  for (size_t w = 0; w < r.workers.size(); ++w) {
    const std::vector<double>& ms = r.workers[w].step_ms;
    double sum = 0;
    for (double x : ms) sum += x;
    steps += r.workers[w].steps_run;
    std::printf("MULTI phase=%s workers=%zu worker=%zu steps=%zu p50_ms=%.3f p99_ms=%.3f "
                "mean_ms=%.3f\n",
                phase, r.workers.size(), w, ms.size(), Percentile(ms, 50), Percentile(ms, 99),
                ms.empty() ? 0 : sum / ms.size());
  }
  std::printf("MULTI phase=%s workers=%zu wall_ms=%.1f slot_updates_per_s=%.0f\n", phase,
              r.workers.size(), r.wall_ms,
              r.wall_ms > 0 ? steps * layers * batch / (r.wall_ms / 1000) : 0);
  if (!absl::GetFlag(FLAGS_verify)) return true;
  const bool ok = r.o_mismatches == 0 && r.slot_mismatches == 0 &&
                  (r.workers.size() < 2 || r.workers_distinct);
  std::printf("VERIFY phase=%s o_compared=%lld o_mismatches=%lld slots_compared=%lld "
              "slot_mismatches=%lld workers_distinct=%s result=%s\n",
              phase, static_cast<long long>(r.o_compared),
              static_cast<long long>(r.o_mismatches), static_cast<long long>(r.slots_compared),
              static_cast<long long>(r.slot_mismatches), r.workers_distinct ? "yes" : "no",
              ok ? "OK" : "MISMATCH");
  return ok;
}

int Main() {
  SetLoggingEnabled(false);  // an in-process statecached's event lines
  absl::StatusOr<ModelGeometry> geo = ParseGeometry(absl::GetFlag(FLAGS_geometry), "geometry");
  absl::StatusOr<FormatSpec> spec = ParseFormatSpec(absl::GetFlag(FLAGS_format));
  if (!geo.ok() || !spec.ok()) {
    std::fprintf(stderr, "multi_worker_bench: %s\n",
                 (!geo.ok() ? geo.status() : spec.status()).ToString().c_str());
    return 2;
  }
  absl::StatusOr<StateLayout> layout = StateLayout::Identity(*geo, *spec);
  if (!layout.ok()) {
    std::fprintf(stderr, "multi_worker_bench: %s\n", layout.status().ToString().c_str());
    return 2;
  }
  const int workers = absl::GetFlag(FLAGS_workers), batch = absl::GetFlag(FLAGS_batch);
  ServerSpec ss;
  ss.listen = absl::StrCat("unix:/tmp/sc_multi_worker_", getpid(), ".sock");
  ss.backend = absl::GetFlag(FLAGS_backend);
  ss.spawn = absl::GetFlag(FLAGS_server) != "inproc";
  ss.statecached = absl::GetFlag(FLAGS_statecached);
  ss.state_bytes = int64_t{workers + 1} * batch * layout->slot_bytes() + (int64_t{64} << 20);
  absl::StatusOr<std::unique_ptr<ServerHandle>> server = ServerHandle::Start(ss);
  if (!server.ok()) {
    std::fprintf(stderr, "multi_worker_bench: %s\n", server.status().ToString().c_str());
    return 1;
  }
  MultiWorkerOptions o;
  o.target = (*server)->target();
  o.geometry = *geo;
  o.format = absl::GetFlag(FLAGS_format);
  o.batch = batch;
  o.steps = absl::GetFlag(FLAGS_steps);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.verify = absl::GetFlag(FLAGS_verify);
  o.verify_slots = absl::GetFlag(FLAGS_verify_slots);
  o.cuda_streams = ss.backend == "cuda";
  o.layer_waits = absl::GetFlag(FLAGS_layer_waits);
  std::printf("# multi_worker_bench backend=%s geometry=%s format=%s B=%d workers=%d steps=%d "
              "warmup=%d layer_waits=%d slot_bytes=%lld\n",
              ss.backend.c_str(), geo->DebugString().c_str(), FormatSpecName(*spec).c_str(),
              batch, workers, o.steps, o.warmup, o.layer_waits ? 1 : 0,
              static_cast<long long>(layout->slot_bytes()));
  std::fflush(stdout);
  absl::StatusOr<MultiWorkerReport> alone = RunMultiWorker(o, 1);
  if (!alone.ok()) {
    std::printf("MULTI phase=alone error=\"%s\"\n", alone.status().ToString().c_str());
    return 1;
  }
  bool ok = Print("alone", *alone, geo->layers, batch);
  std::fflush(stdout);
  absl::StatusOr<MultiWorkerReport> together = RunMultiWorker(o, workers);
  if (!together.ok()) {
    std::printf("MULTI phase=together error=\"%s\"\n", together.status().ToString().c_str());
    return 1;
  }
  ok = Print("together", *together, geo->layers, batch) && ok;
  const double base = Percentile(alone->workers[0].step_ms, 50);
  double hi = 0, lo = 1e300;
  for (const WorkerSteps& w : together->workers) {
    const double p = Percentile(w.step_ms, 50);
    hi = std::max(hi, p);
    lo = std::min(lo, p);
  }
  const double ratio = base > 0 ? hi / base : 0;
  std::printf("MULTI_SUMMARY alone_p50_ms=%.3f together_p50_ms_max=%.3f together_p50_ms_min=%.3f "
              "ratio=%.2f fairness=%.2f goal_ratio=%.2f goal=%s result=%s\n",
              base, hi, lo, ratio, lo > 0 ? hi / lo : 0, absl::GetFlag(FLAGS_goal_ratio),
              ratio <= absl::GetFlag(FLAGS_goal_ratio) ? "met" : "not_met",
              ok ? "OK" : "MISMATCH");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace bench
}  // namespace statecache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return statecache::bench::Main();
}
