// MixedLoad: the decode-only workload of issue 33 - many workers, each on its
// own slot, sending one-token Updates layer after layer - and its check
// against a serial replay.
//
// unary_clients + stream_clients clients (one channel and thread each; the
// stream clients send their Updates over one UpdateStream, one round trip
// per message) each allocate one slot of one model and run `steps` decode
// steps (an Update per layer per step, inputs from MakeOpInputs(seed,
// client, 0, step, layer)). Afterwards every client's slot is exported; the
// serial replay runs the same Updates client by client on a fresh model and
// its exported bytes (and the digest of every o) must equal the concurrent
// run's bit for bit.
//
//   MixedLoadOptions o;  o.target = "127.0.0.1:50051";
//   ASSIGN_OR_RETURN(MixedLoadReport r, RunMixedLoad(o));
//   std::cout << r.Summary();
#ifndef STATECACHE_TESTS_LOAD_MIXED_LOAD_H_
#define STATECACHE_TESTS_LOAD_MIXED_LOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/statecache_client.h"
#include "tests/load/workload.h"

namespace statecache {

struct MixedLoadOptions {
  std::string target;
  StateCacheClient::Options client;
  // Geometry, format, model id and seed of the workload (turns, prefill and
  // stream settings are not used); slots are sized to the clients here.
  WorkloadSpec spec = DefaultSpec();
  int unary_clients = 48;
  int stream_clients = 16;
  int steps = 50;      // decode steps per client (each: one Update per layer)
  bool replay = true;  // serial replay on a fresh model, exported bytes compared

  // 2 layers, 2 key / 4 value heads of 128 x 128, damp:16: a 4.1 KiB request
  // and a 2 KiB response per Update.
  static WorkloadSpec DefaultSpec();
};

struct MixedLoadReport {
  int clients = 0;
  int64_t updates = 0;            // acknowledged Updates (load phase)
  WorkloadStats stats;            // every Update's latency; errors by code
  double seconds = 0;             // load phase wall time
  int64_t replayed = 0;           // clients replayed serially
  int64_t state_mismatches = -1;  // exported slot bytes differing from the replay; -1: no replay
  int64_t output_mismatches = -1;  // clients whose o digest differs from the replay
  int64_t slots_allocated_after = -1;

  double updates_per_second() const { return seconds > 0 ? updates / seconds : 0; }
  // Nothing failed, every state and output equals the replay, no slot left.
  bool ok() const;
  std::string Summary() const;
};

absl::StatusOr<MixedLoadReport> RunMixedLoad(const MixedLoadOptions& options);

}  // namespace statecache

#endif  // STATECACHE_TESTS_LOAD_MIXED_LOAD_H_
