// LoadRunner: N concurrent clients running the multi-turn workload
// (workload.h) against one statecached, then a serial replay and the pool
// invariants. Used by the statecache_load tool and the load tests.
//
//   LoadOptions o;  o.target = "127.0.0.1:50051";  o.clients = 8;
//   ASSIGN_OR_RETURN(LoadReport r, RunLoad(o));
//   std::cout << r.Summary();
#ifndef STATECACHE_TESTS_LOAD_LOAD_RUNNER_H_
#define STATECACHE_TESTS_LOAD_LOAD_RUNNER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/statecache_client.h"
#include "tests/load/workload.h"

namespace statecache {

struct LoadOptions {
  std::string target;                // server address
  StateCacheClient::Options client;  // token, TLS
  WorkloadSpec spec;
  int clients = 8;  // concurrent clients, one channel each
  int conversations_per_client = 4;
  bool replay = true;  // serial replay on a fresh model, compared bit for bit
  // Extra checks after the run (e.g. in-process pool invariants); its error
  // is reported in LoadReport::invariants.
  std::function<absl::Status()> check_invariants;
};

struct LoadReport {
  int clients = 0;
  int64_t conversations = 0;
  int64_t conversations_failed = 0;
  WorkloadStats stats;             // merged over clients (load phase only)
  double seconds = 0;              // load phase wall time
  int64_t replayed = 0;            // completed conversations replayed serially
  int64_t replay_mismatches = -1;  // among them; -1: no replay
  int64_t slots_allocated_after = -1;
  absl::Status invariants;
  std::vector<uint64_t> digests;  // per conversation (load phase)

  double requests_per_second() const { return seconds > 0 ? stats.requests / seconds : 0; }
  // True when nothing failed, the replay matched and the invariants hold.
  bool ok() const;
  std::string Summary() const;
};

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options);

}  // namespace statecache

#endif  // STATECACHE_TESTS_LOAD_LOAD_RUNNER_H_
