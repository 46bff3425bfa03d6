#include "client/routing/hash_ring.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace statecache {

uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t h = kFnvOffsetBasis;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= kFnvPrime;
  }
  return h;
}

uint64_t Fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

absl::StatusOr<HashRing> HashRing::Create(std::vector<std::string> endpoints,
                                          Options options) {
  if (endpoints.empty()) return absl::InvalidArgumentError("endpoints: empty");
  if (options.virtual_nodes < 1 || options.virtual_nodes > kMaxVirtualNodes) {
    return absl::InvalidArgumentError(absl::StrCat("virtual_nodes: ", options.virtual_nodes,
                                                   " not in [1, ", kMaxVirtualNodes, "]"));
  }
  absl::flat_hash_set<std::string> seen;
  for (const std::string& e : endpoints) {
    if (e.empty()) return absl::InvalidArgumentError("endpoints: empty endpoint name");
    if (!seen.insert(e).second) {
      return absl::InvalidArgumentError(absl::StrCat("endpoints: duplicated endpoint ", e));
    }
  }
  HashRing ring;
  ring.endpoints_ = std::move(endpoints);
  ring.virtual_nodes_ = options.virtual_nodes;
  ring.points_.reserve(ring.endpoints_.size() * options.virtual_nodes);
  for (int e = 0; e < static_cast<int>(ring.endpoints_.size()); ++e) {
    const std::string prefix = absl::StrCat(ring.endpoints_[e], "#");
    for (int i = 0; i < options.virtual_nodes; ++i) {
      ring.points_.emplace_back(RingHash64(absl::StrCat(prefix, i)), e);
    }
  }
  const std::vector<std::string>& names = ring.endpoints_;
  std::sort(ring.points_.begin(), ring.points_.end(),
            [&names](const std::pair<uint64_t, int>& a, const std::pair<uint64_t, int>& b) {
              if (a.first != b.first) return a.first < b.first;
              return names[a.second] < names[b.second];
            });
  return ring;
}

int HashRing::RouteIndex(absl::string_view key) const {
  const uint64_t h = RingHash64(key);
  auto it = std::lower_bound(
      points_.begin(), points_.end(), h,
      [](const std::pair<uint64_t, int>& p, uint64_t v) { return p.first < v; });
  if (it == points_.end()) it = points_.begin();
  return it->second;
}

absl::StatusOr<HashRing> HashRing::WithEndpoint(absl::string_view endpoint) const {
  std::vector<std::string> endpoints = endpoints_;
  endpoints.emplace_back(endpoint);
  return Create(std::move(endpoints), Options{virtual_nodes_});
}

absl::StatusOr<HashRing> HashRing::WithoutEndpoint(absl::string_view endpoint) const {
  std::vector<std::string> endpoints;
  for (const std::string& e : endpoints_) {
    if (e != endpoint) endpoints.push_back(e);
  }
  if (endpoints.size() == endpoints_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("endpoints: ", endpoint, " not in the ring"));
  }
  return Create(std::move(endpoints), Options{virtual_nodes_});
}

}  // namespace statecache
