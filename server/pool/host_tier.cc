#include "server/pool/host_tier.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace statecache {

absl::Status HostTier::Put(CheckpointBlob blob, std::vector<CheckpointBlob>* evicted) {
  const int64_t need = blob.bytes();
  if (need > capacity_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("host tier: checkpoint of ", need,
                                                   " bytes exceeds the budget of ",
                                                   capacity_bytes_, " bytes"));
  }
  auto old = index_.find(blob.key);
  if (old != index_.end()) {
    bytes_ -= old->second->bytes();
    lru_.erase(old->second);
    index_.erase(old);
  }
  while (bytes_ + need > capacity_bytes_) {
    CheckpointBlob& victim = lru_.back();
    bytes_ -= victim.bytes();
    index_.erase(victim.key);
    ++evictions_;
    evicted->push_back(std::move(victim));
    lru_.pop_back();
  }
  bytes_ += need;
  const PrefixKey key = blob.key;
  lru_.push_front(std::move(blob));
  index_[key] = lru_.begin();
  return absl::OkStatus();
}

bool HostTier::LongestHeld(absl::Span<const PrefixKey> candidates, PrefixKey* best) const {
  return LongestHeldIn(index_, candidates, best);
}

absl::StatusOr<CheckpointBlob> HostTier::Take(const PrefixKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("host tier: no checkpoint ", key.DebugString()));
  }
  CheckpointBlob blob = std::move(*it->second);
  lru_.erase(it->second);
  index_.erase(it);
  bytes_ -= blob.bytes();
  return blob;
}

TierUse HostTier::use() const {
  TierUse u;
  u.entries = static_cast<int64_t>(lru_.size());
  u.bytes = bytes_;
  u.capacity_bytes = capacity_bytes_;
  u.evictions = evictions_;
  return u;
}

std::vector<PrefixKey> HostTier::KeysByRecency() const {
  std::vector<PrefixKey> keys;
  for (const CheckpointBlob& b : lru_) keys.push_back(b.key);
  return keys;
}

}  // namespace statecache
