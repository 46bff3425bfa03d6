// ShardedStateCacheClient: consistent-hash routing of conversations over
// several statecached endpoints (issue 7), the C++ twin of the Python
// client's ShardedClient (client/python/statecache/sharded.py).
//
// The ring is client/routing/hash_ring.h, pinned to the Python ring by
// client/routing/testdata/ring_vectors.tsv, so a C++ and a Python worker send
// a conversation's states and checkpoints to the same server. One
// StateCacheClient per endpoint, connected lazily on first use and kept for
// the lifetime of this object (also after RemoveEndpoint, so a client handed
// out earlier stays valid).
//
// Ring endpoint names are what the ring hashes; each is dialled as itself
// unless Options::targets maps it to another gRPC target (stable names such
// as pod DNS names in the ring, changing addresses underneath).
//
// Thread-safe: all methods may be called concurrently.
//
//   ASSIGN_OR_RETURN(auto sharded, ShardedStateCacheClient::FromDns(
//       "statecached-headless.statecache.svc.cluster.local", 50051, {}));
//   ASSIGN_OR_RETURN(std::shared_ptr<StateCacheClient> client,
//                    sharded->ForConversation("conversation-42"));
//   ASSIGN_OR_RETURN(PrefixKey key, client->Snapshot("qwen", slot, tokens));
#ifndef STATECACHE_CLIENT_CPP_SHARDED_CLIENT_H_
#define STATECACHE_CLIENT_CPP_SHARDED_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/statecache_client.h"
#include "client/routing/hash_ring.h"

namespace statecache {

class ShardedStateCacheClient {
 public:
  struct Options {
    // Options of every per-endpoint client.
    StateCacheClient::Options client;
    // Ring points per endpoint (same default as the Python client).
    int virtual_nodes = kDefaultVirtualNodes;
    // Ring endpoint name -> gRPC target to dial; names not in the map are
    // dialled as themselves.
    absl::flat_hash_map<std::string, std::string> targets;
  };

  // kInvalidArgument (naming the field) for an empty endpoint list, an empty
  // or duplicated endpoint, or virtual_nodes out of range. Connects nothing.
  static absl::StatusOr<std::unique_ptr<ShardedStateCacheClient>> Create(
      std::vector<std::string> endpoints, Options options);
  // Endpoints = ResolveEndpoints(host, port) ("ip:port", sorted: the same
  // ring as the Python ShardedClient.from_dns). Its errors pass through
  // (kInvalidArgument, kNotFound, kUnavailable).
  static absl::StatusOr<std::unique_ptr<ShardedStateCacheClient>> FromDns(absl::string_view host,
                                                                          int port,
                                                                          Options options);

  // The ring endpoint owning `conversation_id` (its bytes, e.g. UTF-8).
  std::string EndpointFor(absl::string_view conversation_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // The client of EndpointFor(conversation_id), connected on first use
  // (StateCacheClient::Connect's errors pass through).
  absl::StatusOr<std::shared_ptr<StateCacheClient>> ForConversation(
      absl::string_view conversation_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The client of one ring endpoint; kNotFound when it is not in the ring.
  absl::StatusOr<std::shared_ptr<StateCacheClient>> ForEndpoint(absl::string_view endpoint)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Ring membership changes: only the conversations of the added / removed
  // endpoint move. kInvalidArgument when already present / absent or the
  // last endpoint.
  absl::Status AddEndpoint(absl::string_view endpoint) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RemoveEndpoint(absl::string_view endpoint) ABSL_LOCKS_EXCLUDED(mu_);

  // Ring endpoints, in the order given (added ones last).
  std::vector<std::string> endpoints() const ABSL_LOCKS_EXCLUDED(mu_);
  // The gRPC target `endpoint` is dialled as.
  std::string TargetOf(absl::string_view endpoint) const;

 private:
  ShardedStateCacheClient(HashRing ring, Options options)
      : options_(std::move(options)), ring_(std::move(ring)) {}

  absl::StatusOr<std::shared_ptr<StateCacheClient>> ClientLocked(const std::string& endpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  HashRing ring_ ABSL_GUARDED_BY(mu_);
  // By ring endpoint name; never erased.
  absl::flat_hash_map<std::string, std::shared_ptr<StateCacheClient>> clients_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CPP_SHARDED_CLIENT_H_
