// RedisRouter: sends commands to one Redis node or to a Redis Cluster over
// hiredis (Debian ships no cluster client), for the Redis checkpoint tier.
//
// Cluster mode: a key's slot is CRC16-XMODEM(key) mod 16384, where a key
// containing a non-empty "{tag}" is hashed on the tag alone (keys sharing a
// tag share a node). The slot map comes from CLUSTER SLOTS, asked of the
// seeds (then of every known node) on first use and again after a MOVED
// reply or a node failure (at most once per breaker cool-down). A MOVED
// reply re-routes its slot and retries; an ASK reply retries once on the
// named node after ASKING. At most `max_redirects` rounds per Run.
//
// Failures are per node: every connect has `timeout_ms`, every pipeline
// the timeout given to Run (`timeout_ms` when 0: callers moving large values
// pass one that scales with their size, redis_tier.h); a
// failed node's connection is dropped and counted in errors(); after
// `breaker_failures` consecutive failures the node is skipped for
// `breaker_cooldown_ms`. A command whose node is down, skipped, unknown or
// out of redirects gets a kFailed reply: callers treat it as a miss.
//
// Not thread-safe (the checkpoint store calls its tiers under its lock).
//
//   RedisRouterOptions o;
//   RETURN_IF_ERROR(ParseRedisAddressList("10.0.0.1:7000,10.0.0.2:7000", &o.seeds));
//   o.cluster = true;
//   RedisRouter router(o);
//   std::vector<RedisReply> r = router.Run({{"GET", key}, {"DEL", key}});
#ifndef STATECACHE_SERVER_POOL_REDIS_ROUTER_H_
#define STATECACHE_SERVER_POOL_REDIS_ROUTER_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

struct redisContext;

namespace statecache {

struct RedisAddress {
  std::string host;
  int port = 0;
  std::string ToString() const;
};

// "host:port" (port 1..65535). kInvalidArgument naming `field` otherwise.
absl::Status ParseRedisAddress(absl::string_view text, absl::string_view field, RedisAddress* out);
// Comma-separated "host:port" list, at least one. kInvalidArgument naming `field`.
absl::Status ParseRedisAddressList(absl::string_view text, absl::string_view field,
                                   std::vector<RedisAddress>* out);

// The cluster slot (0..16383) of `key`, honouring {hash tags}.
int RedisKeySlot(absl::string_view key);

struct RedisReply {
  enum class Type { kFailed, kNil, kString, kInteger, kStatus, kError, kArray };
  Type type = Type::kFailed;
  std::string str;        // kString, kStatus, kError
  long long integer = 0;  // kInteger
};

struct RedisRouterOptions {
  std::vector<RedisAddress> seeds;  // the node (single mode) or any cluster nodes
  bool cluster = false;
  int timeout_ms = 20;
  int breaker_failures = 3;
  int breaker_cooldown_ms = 1000;
  int max_redirects = 3;
};

class RedisRouter {
 public:
  // argv; argv[1] is the key that routes the command (every command sent
  // here has one). The views must outlive Run.
  using Command = std::vector<absl::string_view>;

  // `options` must have at least one seed (RedisTier::Create checks).
  explicit RedisRouter(RedisRouterOptions options);
  ~RedisRouter();
  RedisRouter(const RedisRouter&) = delete;
  RedisRouter& operator=(const RedisRouter&) = delete;

  // Runs `commands`, pipelined per node and in order per node (two commands
  // on one key run in the order given), and returns one reply per command.
  // `timeout_ms` (> 0) bounds each node's pipeline (send + replies); 0:
  // options.timeout_ms.
  std::vector<RedisReply> Run(const std::vector<Command>& commands, int timeout_ms = 0);

  // Attempts to reach a node (a pipeline, or a CLUSTER SLOTS; a node skipped
  // by its breaker is not attempted) and their summed wall time (connect
  // included). errors(): failed attempts (connect, timeout, unreadable
  // CLUSTER SLOTS), error replies other than MOVED / ASK, and redirect
  // chains that ran out.
  int64_t requests() const { return requests_; }
  int64_t request_micros() const { return request_micros_; }
  int64_t errors() const { return errors_; }
  // The node the current slot map sends `key` to ("host:port"; "" when
  // unmapped). Loads the map first in cluster mode (tests).
  std::string NodeOf(absl::string_view key);

 private:
  struct Node {
    RedisAddress address;
    redisContext* ctx = nullptr;
    int ctx_timeout_ms = 0;  // the timeout set on ctx
    int consecutive_failures = 0;
    std::chrono::steady_clock::time_point open_until{};
  };
  int NodeIndex(const RedisAddress& address);
  int OwnerOf(absl::string_view key) const;
  // A live connection to node `i`, or nullptr (breaker open, connect failed).
  redisContext* Conn(int i);
  void Fail(int i);
  // Loads the slot map (cluster mode) when it is due.
  void MaybeRefresh();
  bool LoadSlots(int node);

  const RedisRouterOptions options_;
  std::vector<Node> nodes_;
  std::vector<int> slot_owner_;  // cluster: node index per slot, -1 unmapped
  bool refresh_due_ = true;
  std::chrono::steady_clock::time_point last_refresh_{};
  int64_t requests_ = 0;
  int64_t request_micros_ = 0;
  int64_t errors_ = 0;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_REDIS_ROUTER_H_
