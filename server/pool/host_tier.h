// HostTier: checkpoints in host memory, LRU within a byte budget
// (--host_checkpoint_bytes). See checkpoint_tier.h for the contract.
//
//   HostTier host(/*capacity_bytes=*/1 << 30);
//   std::vector<CheckpointBlob> spilled;
//   RETURN_IF_ERROR(host.Put(std::move(blob), &spilled));
#ifndef STATECACHE_SERVER_POOL_HOST_TIER_H_
#define STATECACHE_SERVER_POOL_HOST_TIER_H_

#include <cstdint>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "server/pool/checkpoint_tier.h"

namespace statecache {

class HostTier : public CheckpointTier {
 public:
  // capacity_bytes >= 1.
  explicit HostTier(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  StoreTier tier() const override { return StoreTier::kHost; }
  absl::Status Put(CheckpointBlob blob, std::vector<CheckpointBlob>* evicted) override;
  bool LongestHeld(absl::Span<const PrefixKey> candidates, PrefixKey* best) const override;
  absl::StatusOr<CheckpointBlob> Take(const PrefixKey& key) override;
  TierUse use() const override;

  // Keys held, most recently used first (tests).
  std::vector<PrefixKey> KeysByRecency() const;

 private:
  const int64_t capacity_bytes_;
  int64_t bytes_ = 0;
  int64_t evictions_ = 0;
  std::list<CheckpointBlob> lru_;  // front = most recently used
  absl::flat_hash_map<PrefixKey, std::list<CheckpointBlob>::iterator> index_;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_HOST_TIER_H_
