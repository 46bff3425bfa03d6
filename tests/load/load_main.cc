// statecache_load: N concurrent clients run the multi-turn workload against a
// statecached for a fixed number of conversations, then the same
// conversations are replayed serially on a fresh model and compared bit for
// bit; prints throughput, p50/p99 latency, errors by code, and whether the
// pool invariants hold. Exit status 0 only when everything matched.
//
//   bazel run //tests/load:statecache_load -- --clients=16 --conversations=8
//   bazel run //tests/load:statecache_load -- --target=127.0.0.1:50051 --token=...
//
// Without --target it starts an in-process server (CPU backend) on
// 127.0.0.1:0 and also checks the pool invariants directly (SlotPool /
// CheckpointStore::CheckInvariants). Loopback only: the tool refuses a
// non-loopback target unless --allow_remote.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "server/server.h"
#include "tests/load/load_runner.h"

ABSL_FLAG(std::string, target, "", "Server address; empty = start an in-process server.");
ABSL_FLAG(bool, allow_remote, false, "Allow a non-loopback --target.");
ABSL_FLAG(int, clients, 8, "Concurrent clients (one channel and thread each).");
ABSL_FLAG(int, conversations, 4, "Conversations per client.");
ABSL_FLAG(int, turns, 3, "Turns per conversation.");
ABSL_FLAG(int, prefill_tokens, 8, "Prefill tokens per turn.");
ABSL_FLAG(int, decode_steps, 4, "Decode steps per turn (each: one Update per layer).");
ABSL_FLAG(bool, stream, true, "Decode over one UpdateStream per conversation (else unary).");
ABSL_FLAG(std::string, format, "damp:8", "Storage format of the workload model.");
ABSL_FLAG(std::string, geometry, "gdn:2:1:2:32:32", "arch:layers:h_qk:h_v:d_k:d_v.");
ABSL_FLAG(int64_t, checkpoints, 64, "Checkpoints of the workload model (fewer forces evictions).");
ABSL_FLAG(int64_t, seed, 1, "Workload seed.");
ABSL_FLAG(std::string, token, "", "Bearer token.");
ABSL_FLAG(std::string, tls_ca_file, "", "PEM CA verifying the server (enables TLS).");
ABSL_FLAG(std::string, tls_cert_file, "", "Client certificate (mutual TLS).");
ABSL_FLAG(std::string, tls_key_file, "", "Client key (mutual TLS).");

namespace statecache {
namespace {

int Main() {
  LoadOptions o;
  o.clients = absl::GetFlag(FLAGS_clients);
  o.conversations_per_client = absl::GetFlag(FLAGS_conversations);
  o.spec.turns = absl::GetFlag(FLAGS_turns);
  o.spec.prefill_tokens = absl::GetFlag(FLAGS_prefill_tokens);
  o.spec.decode_steps = absl::GetFlag(FLAGS_decode_steps);
  o.spec.use_stream = absl::GetFlag(FLAGS_stream);
  o.spec.format = absl::GetFlag(FLAGS_format);
  o.spec.checkpoints = absl::GetFlag(FLAGS_checkpoints);
  o.spec.slots = std::max<int64_t>(o.clients, 1) + 4;
  o.spec.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  absl::StatusOr<ModelGeometry> g = ParseGeometry(absl::GetFlag(FLAGS_geometry), "geometry");
  if (!g.ok()) {
    std::fprintf(stderr, "statecache_load: %s\n", g.status().ToString().c_str());
    return 2;
  }
  o.spec.geometry = *g;
  o.client.bearer_token = absl::GetFlag(FLAGS_token);
  if (!absl::GetFlag(FLAGS_tls_ca_file).empty()) {
    auto creds = StateCacheClient::TlsCredentials(absl::GetFlag(FLAGS_tls_ca_file),
                                                  absl::GetFlag(FLAGS_tls_cert_file),
                                                  absl::GetFlag(FLAGS_tls_key_file));
    if (!creds.ok()) {
      std::fprintf(stderr, "statecache_load: %s\n", creds.status().ToString().c_str());
      return 2;
    }
    o.client.credentials = *creds;
  }

  std::unique_ptr<StateCacheServer> server;
  o.target = absl::GetFlag(FLAGS_target);
  if (o.target.empty()) {
    StateCacheServer::Options so;
    so.sockets.listen = "127.0.0.1:0";
    so.memory.backend = "cpu";
    so.memory.state_memory_bytes = int64_t{1} << 30;
    so.memory.checkpoint_memory_bytes = int64_t{1} << 30;
    so.metrics.port = -1;
    absl::StatusOr<std::unique_ptr<StateCacheServer>> s = StateCacheServer::Create(std::move(so));
    if (!s.ok()) {
      std::fprintf(stderr, "statecache_load: %s\n", s.status().ToString().c_str());
      return 1;
    }
    server = std::move(*s);
    o.target = absl::StrCat("127.0.0.1:", server->port());
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
  return statecache::Main();
}
