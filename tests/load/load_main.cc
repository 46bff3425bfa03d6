// statecache_load: concurrent clients against a statecached, then a serial
// replay compared bit for bit. Exit status 0 only when everything matched.
//
// --workload=conversations (default): N clients run the multi-turn workload
// (tests/load/workload.h) for a fixed number of conversations; prints
// throughput, p50/p99 latency, errors by code, and whether the pool
// invariants hold.
// --workload=mixed (issue 33, tests/load/mixed_load.h): --unary_clients +
// --stream_clients workers on distinct slots send one-token Updates (2
// layers, 4 value heads of 128 x 128 by default) for --steps steps; prints
// updates/s and latency; every slot's final bytes must equal the replay's.
//
//   bazel run //tests/load:statecache_load -- --clients=16 --conversations=8
//   bazel run //tests/load:statecache_load -- --workload=mixed --backend=cuda
//   bazel run //tests/load:statecache_load -- --target=127.0.0.1:50051 --token=...
//
// Without --target it starts an in-process server (--backend, CPU by
// default; the compute and gRPC flags below configure it) on 127.0.0.1:0 and
// also checks the pool invariants directly (SlotPool /
// CheckpointStore::CheckInvariants). Loopback only: the tool refuses a
// non-loopback target unless --allow_remote.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "server/loopback.h"
#include "server/server.h"
#include "tests/load/load_runner.h"
#include "tests/load/mixed_load.h"

ABSL_FLAG(std::string, target, "", "Server address; empty = start an in-process server.");
ABSL_FLAG(bool, allow_remote, false, "Allow a non-loopback --target.");
ABSL_FLAG(int, clients, 8, "Concurrent clients (one channel and thread each).");
ABSL_FLAG(int, conversations, 4, "Conversations per client.");
ABSL_FLAG(int, turns, 3, "Turns per conversation.");
ABSL_FLAG(int, prefill_tokens, 8, "Prefill tokens per turn.");
ABSL_FLAG(int, decode_steps, 4, "Decode steps per turn (each: one Update per layer).");
ABSL_FLAG(bool, stream, true, "Decode over one UpdateStream per conversation (else unary).");
ABSL_FLAG(std::string, workload, "conversations", "conversations or mixed (see above).");
ABSL_FLAG(int, unary_clients, 48, "mixed: clients sending unary Updates.");
ABSL_FLAG(int, stream_clients, 16, "mixed: clients sending over one UpdateStream each.");
ABSL_FLAG(int, steps, 50, "mixed: decode steps per client (one Update per layer each).");
ABSL_FLAG(std::string, format, "",
          "Storage format of the workload model (default damp:8; mixed: damp:16).");
ABSL_FLAG(std::string, geometry, "",
          "arch:layers:h_qk:h_v:d_k:d_v (default gdn:2:1:2:32:32; mixed: gdn:2:2:4:128:128).");
ABSL_FLAG(std::string, backend, "cpu", "In-process server: cpu, cuda or auto.");
ABSL_FLAG(bool, coalesce_updates, false, "In-process server: merge concurrent Updates.");
ABSL_FLAG(int64_t, coalesce_max_delay_us, 0, "In-process server: --coalesce_updates wait.");
ABSL_FLAG(int, coalesce_max_batch, 256, "In-process server: slots per merged launch.");
ABSL_FLAG(int, grpc_threads, 0, "In-process server: gRPC threads kept ready (0 = default).");
ABSL_FLAG(int64_t, checkpoints, 64, "Checkpoints of the workload model (fewer forces evictions).");
ABSL_FLAG(int64_t, seed, 1, "Workload seed.");
ABSL_FLAG(std::string, token, "", "Bearer token.");
ABSL_FLAG(std::string, tls_ca_file, "", "PEM CA verifying the server (enables TLS).");
ABSL_FLAG(std::string, tls_cert_file, "", "Client certificate (mutual TLS).");
ABSL_FLAG(std::string, tls_key_file, "", "Client key (mutual TLS).");

namespace statecache {
namespace {

int Main() {
  const std::string workload = absl::GetFlag(FLAGS_workload);
  if (workload != "conversations" && workload != "mixed") {
    std::fprintf(stderr, "statecache_load: --workload must be conversations or mixed\n");
    return 2;
  }
  const bool mixed = workload == "mixed";
  LoadOptions o;
  o.clients = absl::GetFlag(FLAGS_clients);
  o.conversations_per_client = absl::GetFlag(FLAGS_conversations);
  if (mixed) o.spec = MixedLoadOptions::DefaultSpec();
  o.spec.turns = absl::GetFlag(FLAGS_turns);
  o.spec.prefill_tokens = absl::GetFlag(FLAGS_prefill_tokens);
  o.spec.decode_steps = absl::GetFlag(FLAGS_decode_steps);
  o.spec.use_stream = absl::GetFlag(FLAGS_stream);
  if (!absl::GetFlag(FLAGS_format).empty()) o.spec.format = absl::GetFlag(FLAGS_format);
  o.spec.checkpoints = absl::GetFlag(FLAGS_checkpoints);
  o.spec.slots = std::max<int64_t>(o.clients, 1) + 4;
  o.spec.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  if (!absl::GetFlag(FLAGS_geometry).empty()) {
    absl::StatusOr<ModelGeometry> g = ParseGeometry(absl::GetFlag(FLAGS_geometry), "geometry");
    if (!g.ok()) {
      std::fprintf(stderr, "statecache_load: %s\n", g.status().ToString().c_str());
      return 2;
    }
    o.spec.geometry = *g;
  }
  std::unique_ptr<StateCacheServer> server;
  o.target = absl::GetFlag(FLAGS_target);
  if (o.target.empty()) {
    StateCacheServer::Options so = LoopbackOptions(int64_t{1} << 30, int64_t{1} << 30, absl::GetFlag(FLAGS_backend));
    so.compute.coalesce_updates = absl::GetFlag(FLAGS_coalesce_updates);
    so.compute.coalescer.max_delay = absl::Microseconds(absl::GetFlag(FLAGS_coalesce_max_delay_us));
    so.compute.coalescer.max_batch = absl::GetFlag(FLAGS_coalesce_max_batch);
    so.sockets.grpc_threads = absl::GetFlag(FLAGS_grpc_threads);
    absl::StatusOr<std::unique_ptr<StateCacheServer>> s = StateCacheServer::Create(std::move(so));
    if (!s.ok()) {
      std::fprintf(stderr, "statecache_load: %s\n", s.status().ToString().c_str());
      return 1;
    }
    server = std::move(*s);
    o.target = LoopbackTarget(*server);
    StateCacheServer* srv = server.get();
    o.check_invariants = [srv]() -> absl::Status {
      for (const auto& m : srv->registry().List()) {
        absl::Status s = m->slots->CheckInvariants();
        if (s.ok() && m->checkpoints) s = m->checkpoints->CheckInvariants();
        if (!s.ok()) return absl::InternalError(absl::StrCat(m->id, ": ", s.message()));
      }
      return absl::OkStatus();
    };
  } else if (!IsLoopbackAddress(o.target) && !absl::GetFlag(FLAGS_allow_remote)) {
    std::fprintf(stderr, "statecache_load: --target %s is not loopback (--allow_remote)\n",
                 o.target.c_str());
    return 2;
  }
  if (mixed) {
    MixedLoadOptions m;
    m.target = o.target;
    m.client = o.client;
    m.spec = o.spec;
    m.spec.checkpoints = 1;  // the mixed workload takes no snapshots
    m.unary_clients = absl::GetFlag(FLAGS_unary_clients);
    m.stream_clients = absl::GetFlag(FLAGS_stream_clients);
    m.steps = absl::GetFlag(FLAGS_steps);
    absl::StatusOr<MixedLoadReport> r = RunMixedLoad(m);
    if (!r.ok()) {
      std::fprintf(stderr, "statecache_load: %s\n", r.status().ToString().c_str());
      return 1;
    }
    absl::Status inv = o.check_invariants ? o.check_invariants() : absl::OkStatus();
    std::cout << "target=" << o.target << " workload=mixed backend="
              << (server ? server->backend().name() : "remote")
              << " unary_clients=" << m.unary_clients << " stream_clients=" << m.stream_clients
              << " steps=" << m.steps << " format=" << m.spec.format
              << " coalesce_updates=" << (absl::GetFlag(FLAGS_coalesce_updates) ? 1 : 0) << "\n"
              << r->Summary() << "invariants=" << inv.ToString() << "\n";
    return r->ok() && inv.ok() ? 0 : 1;
  }
  absl::StatusOr<LoadReport> r = RunLoad(o);
  if (!r.ok()) {
    std::fprintf(stderr, "statecache_load: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::cout << "target=" << o.target << " stream=" << (o.spec.use_stream ? "true" : "false")
            << " format=" << o.spec.format << " geometry=" << absl::GetFlag(FLAGS_geometry)
            << " turns=" << o.spec.turns << " prefill_tokens=" << o.spec.prefill_tokens
            << " decode_steps=" << o.spec.decode_steps << "\n"
            << r->Summary();
  return r->ok() ? 0 : 1;
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("statecache_load: concurrent multi-turn load + serial replay");
  absl::ParseCommandLine(argc, argv);
  // As statecached: no lock-order graph check per lock (Debian's Abseil).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return statecache::Main();
}
