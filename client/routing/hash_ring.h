// HashRing: consistent-hash routing of conversation ids over statecached
// endpoints, so a cluster shards states across servers and a conversation's
// checkpoints stay on one server.
//
// The algorithm is shared with the Python client (client/python/statecache/
// ring.py) and pinned by client/routing/testdata/ring_vectors.tsv, so a C++
// and a Python worker route a conversation to the same endpoint:
//
//   RingHash64(b) = Fmix64(Fnv1a64(b)): FNV-1a 64 with offset basis (the seed)
//                   0xcbf29ce484222325 and prime 0x100000001b3, then
//                   MurmurHash3's fmix64 finalizer for avalanche.
//   ring points   = RingHash64(endpoint + "#" + decimal(i)) for every endpoint
//                   and i in [0, virtual_nodes), sorted by (point, endpoint).
//   Route(key)    = the endpoint of the first point >= RingHash64(key),
//                   wrapping around to the first point.
//
// Adding or removing one of N endpoints moves only the keys owned by that
// endpoint (~1/N of all keys). Immutable after Create; thread-safe.
//
//   ASSIGN_OR_RETURN(HashRing ring, HashRing::Create({"10.0.0.1:50051",
//                                                     "10.0.0.2:50051"}));
//   const std::string& endpoint = ring.Route("conversation-42");
#ifndef STATECACHE_CLIENT_ROUTING_HASH_RING_H_
#define STATECACHE_CLIENT_ROUTING_HASH_RING_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace statecache {

inline constexpr uint64_t kFnvOffsetBasis = 0xcbf29ce484222325ULL;
inline constexpr uint64_t kFnvPrime = 0x100000001b3ULL;
inline constexpr int kDefaultVirtualNodes = 256;
inline constexpr int kMaxVirtualNodes = 65536;

// Plain FNV-1a 64 of `bytes`.
uint64_t Fnv1a64(absl::string_view bytes);
// MurmurHash3's 64-bit finalizer.
uint64_t Fmix64(uint64_t k);
// The ring hash: Fmix64(Fnv1a64(bytes)).
inline uint64_t RingHash64(absl::string_view bytes) { return Fmix64(Fnv1a64(bytes)); }

class HashRing {
 public:
  struct Options {
    // Points per endpoint, 1..kMaxVirtualNodes. More points even out the
    // load (256: each of 8 endpoints within ~+-15% of the mean).
    int virtual_nodes = kDefaultVirtualNodes;
  };

  // kInvalidArgument (naming the field) when `endpoints` is empty, has an
  // empty or duplicated name, or virtual_nodes is out of range.
  static absl::StatusOr<HashRing> Create(std::vector<std::string> endpoints,
                                         Options options);
  static absl::StatusOr<HashRing> Create(std::vector<std::string> endpoints) {
    return Create(std::move(endpoints), Options());
  }

  // The endpoint owning `key` (a conversation id's bytes, e.g. UTF-8).
  const std::string& Route(absl::string_view key) const {
    return endpoints_[RouteIndex(key)];
  }
  // Index into endpoints() of the endpoint owning `key`.
  int RouteIndex(absl::string_view key) const;

  // Endpoints in the order given to Create.
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  int virtual_nodes() const { return virtual_nodes_; }

  // A new ring with `endpoint` added / removed (kInvalidArgument if already
  // present / absent or the last one).
  absl::StatusOr<HashRing> WithEndpoint(absl::string_view endpoint) const;
  absl::StatusOr<HashRing> WithoutEndpoint(absl::string_view endpoint) const;

 private:
  HashRing() = default;

  std::vector<std::string> endpoints_;
  int virtual_nodes_ = 0;
  // Sorted by (hash, endpoint name); .second indexes endpoints_.
  std::vector<std::pair<uint64_t, int>> points_;
};

}  // namespace statecache

#endif  // STATECACHE_CLIENT_ROUTING_HASH_RING_H_
