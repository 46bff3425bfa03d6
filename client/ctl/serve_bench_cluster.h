// The server side of serve-bench's multi-instance runs: a redis-server
// child (RedisProcess), and the cache subject (SubjectCache) that mirrors the
// served model's checkpoints on the instance each turn is routed to.
//
// The cache subject: a model registered under the same id and layout on
// every instance, with the checkpoint budget (one slot per instance). Each
// turn the subject's slot on the routed instance looks up and restores the
// longest checkpoint of the turn's context, and snapshots the context after
// the turn (with per-layer aux bytes of ConvWindowBytesPerLayer); the served
// model (its own registration, with room for every checkpoint) then restores
// exactly as many tokens as the subject did (TurnCache). So hits, evictions,
// tier traffic and copy costs are those of the subject's geometry, while the
// served model supplies the tokens, TTFT's compute and the accuracy.
//
//   ASSIGN_OR_RETURN(auto redis, RedisProcess::Start("redis-server"));
//   ASSIGN_OR_RETURN(auto subject, SubjectCache::Create(clients, "shadow", &router));
//   RunRemoteWorkload(model, client0, served_id, convs, schedule, {}, subject.get());
//   subject->counts().cross_instance_hits
#ifndef STATECACHE_CLIENT_CTL_SERVE_BENCH_CLUSTER_H_
#define STATECACHE_CLIENT_CTL_SERVE_BENCH_CLUSTER_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/statecache_client.h"
#include "client/ctl/serve_bench_routing.h"
#include "client/remote_store/multi_turn.h"
#include "client/remote_store/remote_state_store.h"

namespace statecache {

// One command to a Redis node over a plain TCP connection (RESP), e.g.
// {"FLUSHALL"}: the reply's first line ("+OK", "+PONG"). kUnavailable when
// the node cannot be reached within `timeout_ms`, kInternal for an error
// reply ("-ERR ...").
absl::StatusOr<std::string> RedisCommand(const std::string& host, int port,
                                         const std::vector<std::string>& args,
                                         int timeout_ms = 2000);
// "host:port" -> host, port; kInvalidArgument naming `field` otherwise.
absl::Status ParseHostPort(const std::string& address, const std::string& field,
                           std::string* host, int* port);

// A redis-server child on a free loopback port, no persistence, in a fresh
// temp dir; ~RedisProcess kills it (SIGKILL) and removes the dir.
class RedisProcess {
 public:
  // `binary` is a path or a name looked up in PATH ("redis-server").
  // kUnavailable when it exits or does not answer PING within 10 s.
  static absl::StatusOr<std::unique_ptr<RedisProcess>> Start(const std::string& binary);
  ~RedisProcess();
  // "127.0.0.1:PORT".
  std::string address() const;
  int port() const { return port_; }

 private:
  RedisProcess() = default;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_;
};

class SubjectCache : public TurnCache {
 public:
  struct Counts {
    int64_t hits = 0;                 // turns that restored a subject checkpoint
    int64_t misses = 0;
    int64_t cross_instance_hits = 0;  // ... snapshotted on another instance
    std::vector<int64_t> turns_by_instance;
  };

  // Allocates one slot of `model_id` on every client's instance (index =
  // instance) and fills each with a one-token prefill of fixed pseudo-random
  // inputs on every layer (so packed checkpoints hold non-zero states).
  // `router` (not owned) must route to < clients.size() instances.
  static absl::StatusOr<std::unique_ptr<SubjectCache>> Create(
      const std::vector<StateCacheClient*>& clients, const std::string& model_id,
      const ConversationRouter* router);

  absl::StatusOr<int64_t> BeforeTurn(int step, int conversation, int turn,
                                     absl::Span<const int32_t> prompt) override;
  absl::Status AfterTurn(int step, int conversation, int turn,
                         absl::Span<const int32_t> context) override;

  const Counts& counts() const { return counts_; }
  // One checkpoint's aux bytes (all layers).
  int64_t aux_bytes() const;

 private:
  SubjectCache() = default;
  const ConversationRouter* router_ = nullptr;
  std::vector<std::unique_ptr<RemoteStateStore>> stores_;  // [instance]
  std::vector<std::string> aux_;                           // [layer]
  // (conversation, tokens) -> instance that snapshotted it.
  std::map<std::pair<int, int64_t>, int> origin_;
  Counts counts_;
};

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CTL_SERVE_BENCH_CLUSTER_H_
