// HostTier: checkpoints in host memory, LRU within a byte budget
// (--host_checkpoint_bytes). See checkpoint_tier.h for the contract.
//
// Packed bytes live in fixed-size blocks carved from large allocations
// (chunks of Options::chunk_bytes) of the backend's PinnedMemory
// (kernels/backend/pinned_memory.h: page-locked on CUDA, so demotion and
// promotion are one DMA copy each through PutFromBackend / TakeInto) or,
// without one, of plain host memory. Blocks are reused; chunks are kept
// until the tier is destroyed. Per block size, at most
// ceil(capacity_bytes / size) + 1 blocks are ever allocated (each rounded up
// to 256 bytes; the + 1 is the block a promotion holds while its callback
// demotes another checkpoint), so a tier whose checkpoints share one size
// (one model's slot_bytes) holds about its budget in chunks. Aux bytes stay
// in ordinary strings.
//
//   HostTier host({.capacity_bytes = 1 << 30, .memory = backend->pinned_memory()});
//   std::vector<CheckpointBlob> spilled;
//   RETURN_IF_ERROR(host.Put(std::move(blob), &spilled));
#ifndef STATECACHE_SERVER_POOL_HOST_TIER_H_
#define STATECACHE_SERVER_POOL_HOST_TIER_H_

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/pinned_memory.h"
#include "server/pool/checkpoint_tier.h"

namespace statecache {

class HostTier : public CheckpointTier {
 public:
  struct Options {
    int64_t capacity_bytes = 0;  // the budget, >= 1
    // Source of the chunks (the backend's capability; must outlive the
    // tier); null: plain host memory.
    PinnedMemory* memory = nullptr;
    // Bytes per chunk allocation (>= 1); a chunk holds at least one block.
    int64_t chunk_bytes = int64_t{256} << 20;
  };

  explicit HostTier(Options options) : options_(options) {}
  // Plain host memory, default chunks.
  explicit HostTier(int64_t capacity_bytes) : HostTier(Options{capacity_bytes}) {}

  StoreTier tier() const override { return StoreTier::kHost; }
  // kResourceExhausted (nothing stored) when a chunk cannot be allocated.
  absl::Status Put(CheckpointBlob blob, std::vector<CheckpointBlob>* evicted) override;
  bool LongestHeld(absl::Span<const PrefixKey> candidates, PrefixKey* best) const override;
  absl::StatusOr<CheckpointBlob> Take(const PrefixKey& key) override;
  TierUse use() const override;
  // Backend::CopyOut straight into a block (with a refill:
  // Backend::CopyOutThenIn, the two directions overlapped).
  absl::Status PutFromBackend(const PrefixKey& key, Backend& backend, void* src,
                              int64_t packed_bytes, std::vector<std::string> aux,
                              std::vector<CheckpointBlob>* evicted, const void* refill) override;
  // Hands `promote` the block itself; the block is reused once it returns.
  absl::Status TakeInto(const PrefixKey& key, const Promote& promote,
                        CheckpointBlob* blob) override;
  // Hands `promote` the block and keeps the entry (*kept true), whether
  // promote succeeded or not; during the call the entry is out of the index,
  // so promote's re-entry (a demotion into this tier) cannot evict it.
  absl::Status CopyInto(const PrefixKey& key, const Promote& promote, CheckpointBlob* blob,
                        bool* kept, std::vector<CheckpointBlob>* evicted) override;

  // Keys held, most recently used first (tests).
  std::vector<PrefixKey> KeysByRecency() const;
  // Chunk bytes allocated so far, and how many allocations made them.
  int64_t reserved_bytes() const { return reserved_bytes_; }
  int64_t chunk_allocations() const { return static_cast<int64_t>(chunks_.size()); }

 private:
  struct Held {
    PrefixKey key;
    uint8_t* packed = nullptr;  // a block of packed_bytes (null when 0)
    int64_t packed_bytes = 0;
    std::vector<std::string> aux;
    int64_t bytes() const;  // packed + aux
  };
  struct SizeClass {
    std::vector<uint8_t*> free;
    int64_t blocks = 0;  // allocated, free or in use
  };

  // Makes room for `need` bytes of `key` (replacing its old entry, evicting
  // LRU entries into `evicted`) and a block of `packed_bytes`.
  // kInvalidArgument when need > capacity; kResourceExhausted when no chunk.
  absl::StatusOr<uint8_t*> Reserve(const PrefixKey& key, int64_t need, int64_t packed_bytes,
                                   std::vector<CheckpointBlob>* evicted);
  absl::StatusOr<uint8_t*> GetBlock(int64_t bytes);
  void ReleaseBlock(uint8_t* block, int64_t bytes);
  void Insert(Held held);
  // Removes `it` from the LRU list and the index (its block stays taken).
  Held Remove(std::list<Held>::iterator it);
  // Evicts least recently used entries into `evicted` while over the budget.
  void EvictOverBudget(std::vector<CheckpointBlob>* evicted);
  // The blob of `held` (packed copied out of its block), releasing the block.
  CheckpointBlob ToBlob(Held held);

  const Options options_;
  int64_t bytes_ = 0;
  int64_t evictions_ = 0;
  std::list<Held> lru_;  // front = most recently used
  absl::flat_hash_map<PrefixKey, std::list<Held>::iterator> index_;
  absl::flat_hash_map<int64_t, SizeClass> classes_;  // by block size
  std::vector<std::unique_ptr<BackendBuffer>> chunks_;
  int64_t reserved_bytes_ = 0;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_HOST_TIER_H_
