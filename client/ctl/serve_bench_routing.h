// What serve-bench's multi-instance runs decide without a server: which
// instance serves each turn (ConversationRouter), what a setup row is
// (ServeSetup, "2+redis"), and the cache subject's state geometry.
//
//   ASSIGN_OR_RETURN(auto setups, ParseServeSetups("1,1+host,2,2+redis"));
//   RouterOptions ro;
//   ro.instances = 2;
//   ro.join_after = 6;  // instance 1 joins the ring after 6 turns
//   ASSIGN_OR_RETURN(ConversationRouter r, ConversationRouter::Create({"prose#1", ...}, ro));
//   int instance = r.Route(step, conversation);
#ifndef STATECACHE_CLIENT_CTL_SERVE_BENCH_ROUTING_H_
#define STATECACHE_CLIENT_CTL_SERVE_BENCH_ROUTING_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/layout/geometry.h"

namespace statecache {

// One row group of serve-bench: `instances` statecached children, each with
// the checkpoint budget, a host tier (host) and one Redis shared by all of
// them (redis). Text: "N[+host][+redis]", e.g. "1", "1+host", "2+redis".
struct ServeSetup {
  int instances = 1;
  bool host = false;
  bool redis = false;
  std::string name;  // canonical text
};
// Comma-separated setups; kInvalidArgument naming --setups for an empty
// item, N outside 1..8, an unknown or repeated "+part".
absl::StatusOr<std::vector<ServeSetup>> ParseServeSetups(absl::string_view text);

enum class RouteMode { kRing, kRoundRobin };

struct RouterOptions {
  int instances = 1;  // 1..8
  RouteMode mode = RouteMode::kRing;
  // kRing with instances > 1: the ring holds instances 0..N-2 for the first
  // join_after steps of the schedule, then instance N-1 joins (the
  // conversations it takes over move). 0 = all N from the start.
  int join_after = 0;
};

// Routes the schedule's turns to instances. kRing: consistent hash
// (client/routing/hash_ring) of the conversation's key over the endpoint
// names "statecached-0", "statecached-1", ... (virtual_nodes 256);
// kRoundRobin: step % instances (no affinity). Immutable.
class ConversationRouter {
 public:
  // kInvalidArgument (naming the field) for no keys, instances outside
  // 1..8 or join_after < 0.
  static absl::StatusOr<ConversationRouter> Create(std::vector<std::string> keys,
                                                   RouterOptions options);

  // Instance serving step `step` (0-based) of the schedule, a turn of
  // conversation `conversation` (index into keys).
  int Route(int step, int conversation) const;
  // kRing: conversations whose instance changes when the last instance
  // joins (0 without a join); kRoundRobin: 0.
  int moved() const;
  const RouterOptions& options() const { return options_; }
  // "ring over 2 instances, statecached-1 joins after step 6 (3 of 6
  // conversations move)" / "round robin over 2 instances (no affinity)".
  std::string Describe() const;

 private:
  ConversationRouter() = default;
  RouterOptions options_;
  std::vector<int> before_;  // [conversation] instance before the join
  std::vector<int> after_;   // [conversation] instance after it
};

// --state_geometry: "model" (nullopt: the served model's own states) or
// "qwen3.6" (Qwen3.6-35B-A3B: GDN, 30 layers, 16 key heads, 32 value heads,
// 128 x 128 states: 62.9 MB of fp32 per sequence). kInvalidArgument naming
// --state_geometry otherwise.
absl::StatusOr<std::optional<ModelGeometry>> ParseStateGeometry(absl::string_view name);

// Per-layer conv-window bytes a checkpoint of `geometry` carries (serve-bench's
// subject aux): 3 past positions (kernel 4) x (2 h_qk d_k + h_v d_v) channels
// in bf16. 49,152 for Qwen3.6.
int64_t ConvWindowBytesPerLayer(const ModelGeometry& geometry);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CTL_SERVE_BENCH_ROUTING_H_
