// CheckpointTier: a lower storage tier of the checkpoint store (host memory,
// local disk, a shared Redis) below the backend's checkpoint arena.
//
// The CheckpointStore (checkpoint_store.h) moves checkpoints between tiers:
// an entry evicted from the backend arena is copied out and demoted to the
// first lower tier; what that tier evicts (LRU, over its byte budget) goes to
// the next one; what the last one evicts is dropped. A lookup hit in a lower
// tier takes the checkpoint out of it (Take; the shared remote tier keeps its
// copy) and promotes it back into the
// arena; an inclusive host tier keeps its copy (CopyInto). Each tier is LRU
// with its own byte budget.
//
// A tier holds CheckpointBlobs: the packed slot bytes plus the worker's aux
// bytes. Compatibility tags (model, format, layout fingerprint, geometry,
// packed revision) are fixed per tier instance (one per model), so a blob
// never meets a layout it was not written for; the disk tier stores and
// checks them because its files outlive the process.
//
// The CheckpointStore calls its tiers under its own lock, except the remote
// tier's Put (sent after the lock is released): host and disk tiers need not
// be thread-safe, the remote tier must be.
//
// Copies between a tier and the backend arena go through PutFromBackend
// (demotion) and TakeInto (promotion): the host tier moves the packed bytes
// straight between backend memory and its own (pinned) memory, one
// Backend::CopyOut / CopyIn each; the other tiers stage them in a blob.
//
//   std::vector<CheckpointBlob> spilled;
//   RETURN_IF_ERROR(host->Put(std::move(blob), &spilled));  // spilled -> next tier
//   PrefixKey best;
//   if (host->LongestHeld(candidates, &best)) { ASSIGN_OR_RETURN(auto b, host->Take(best)); }
#ifndef STATECACHE_SERVER_POOL_CHECKPOINT_TIER_H_
#define STATECACHE_SERVER_POOL_CHECKPOINT_TIER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/pool/prefix_key.h"

namespace statecache {

class Backend;  // kernels/backend/backend.h

// Where a checkpoint was found (statecache.v1.CheckpointTier on the wire).
enum class StoreTier : int { kDevice = 0, kHost = 1, kDisk = 2, kRemote = 3 };
inline constexpr int kNumStoreTiers = 4;
inline const char* StoreTierName(StoreTier t) {
  switch (t) {
    case StoreTier::kDevice: return "device";
    case StoreTier::kHost: return "host";
    case StoreTier::kDisk: return "disk";
    default: return "remote";
  }
}

// One checkpoint outside the backend arena.
struct CheckpointBlob {
  PrefixKey key;
  std::string packed;            // slot_bytes of packed states, as in the arena
  std::vector<std::string> aux;  // the worker's per-layer aux bytes
  // True when the remote tier already holds a copy of this checkpoint
  // (written through at snapshot time, or read from it): a remote Put
  // refreshes that copy's TTL instead of sending the bytes again, unless it
  // expired (redis_tier.h). Tiers that do not keep it read it as false,
  // which only costs a resend.
  bool remote_written = false;

  // Bytes charged against a tier's budget: packed + every aux string.
  int64_t bytes() const {
    int64_t n = static_cast<int64_t>(packed.size());
    for (const std::string& a : aux) n += static_cast<int64_t>(a.size());
    return n;
  }
};

// Current use of one tier (a part of CheckpointStats::tiers).
// The remote tier holds what other servers wrote too and lets its store
// expire entries: its entries / bytes are what this server wrote (minus the
// corrupt blobs it deleted; never below 0), and its capacity_bytes is 0 (no budget known).
struct TierUse {
  int64_t entries = 0;
  int64_t bytes = 0;           // blob bytes held (packed + aux)
  int64_t capacity_bytes = 0;  // the tier's budget; 0: unbounded / unknown (remote)
  int64_t evictions = 0;       // blobs evicted (LRU) to fit the budget
  int64_t dropped_corrupt = 0; // blobs found unreadable (checksum, size, tags) and deleted
  // Remote calls (one per Put / LongestHeld / Take that reached the store),
  // their summed wall time in microseconds, and the failed ones (connect,
  // timeout, error reply). Zero for the local tiers.
  int64_t requests = 0;
  int64_t request_micros = 0;
  int64_t errors = 0;
};

// The longest of `candidates` that `held` (any container keyed by PrefixKey
// with contains()) holds: true and `*best` set, or false. The one search of
// every tier, the device index included.
template <typename Held>
bool LongestHeldIn(const Held& held, absl::Span<const PrefixKey> candidates, PrefixKey* best) {
  bool found = false;
  for (const PrefixKey& key : candidates) {
    if (!held.contains(key)) continue;
    if (!found || key.num_tokens > best->num_tokens) *best = key;
    found = true;
  }
  return found;
}

class CheckpointTier {
 public:
  virtual ~CheckpointTier() = default;

  virtual StoreTier tier() const = 0;

  // Stores `blob` as the most recently used entry, replacing one with the
  // same key, then evicts least recently used entries until the budget holds
  // (their blobs are appended to `evicted`, oldest first, for the next tier).
  // kInvalidArgument when the blob alone exceeds the budget (nothing stored);
  // the disk tier returns kUnavailable / kDataLoss when it cannot write.
  virtual absl::Status Put(CheckpointBlob blob, std::vector<CheckpointBlob>* evicted) = 0;

  // The longest candidate held (keys compared by every field): true and
  // `*best` set, or false. Does not change the LRU order.
  virtual bool LongestHeld(absl::Span<const PrefixKey> candidates, PrefixKey* best) const = 0;

  // Returns the blob of `key` (promotion): the host and disk tiers remove
  // their entry; the remote tier, shared by servers, leaves it (its TTL
  // bounds it). kNotFound when not held; kDataLoss when the stored copy is
  // corrupt (it is deleted and counted in dropped_corrupt, never returned).
  virtual absl::StatusOr<CheckpointBlob> Take(const PrefixKey& key) = 0;

  virtual TierUse use() const = 0;

  // Put of a checkpoint still in backend memory: `packed_bytes` bytes at
  // `src` (backend memory of `backend`) plus `aux`, copied out once. Errors
  // as Put, and the copy's (nothing stored; `evicted` keeps what was
  // evicted before the copy failed). The default copies into a blob and
  // calls Put; the host tier copies into its own memory.
  // refill (null, or host memory of packed_bytes): an eviction making room
  // for a promotion in place - once copied out, src's bytes are replaced by
  // refill's. On OK src holds refill's bytes; on an error src's bytes are
  // unspecified (the caller copies refill in itself). The host tier overlaps
  // the two copies (Backend::CopyOutThenIn); the default copies in after
  // the copy out.
  virtual absl::Status PutFromBackend(const PrefixKey& key, Backend& backend, void* src,
                                      int64_t packed_bytes, std::vector<std::string> aux,
                                      std::vector<CheckpointBlob>* evicted,
                                      const void* refill);

  // Receives a taken checkpoint's packed bytes (host memory, valid during
  // the call only) for promotion, e.g. a Backend::CopyIn into the arena. It
  // may call back into the tier (the entry is already out of it).
  using Promote = std::function<absl::Status(const void* packed, int64_t bytes)>;

  // Take, handing the packed bytes to `promote` where they are stored (the
  // host tier: its pinned memory) instead of copying them into a string.
  // kNotFound / kDataLoss as Take (promote is not called, *blob untouched).
  // Otherwise returns promote's status: on OK *blob gets key and aux with
  // `packed` empty; on an error *blob gets the whole checkpoint (`packed`
  // filled), which the tier no longer holds, so the caller can put it back.
  virtual absl::Status TakeInto(const PrefixKey& key, const Promote& promote,
                                CheckpointBlob* blob);

  // Promotion that may keep the tier's copy (an inclusive upper tier, see
  // CheckpointStore::Options::host_write_through): as TakeInto, and on OK
  // *kept tells whether the tier still holds the entry (then most recently
  // used; what it evicts to make room for it again goes to `evicted`). The
  // default takes the entry (TakeInto, *kept false); the host tier keeps it.
  virtual absl::Status CopyInto(const PrefixKey& key, const Promote& promote,
                                CheckpointBlob* blob, bool* kept,
                                std::vector<CheckpointBlob>* evicted);
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_CHECKPOINT_TIER_H_
