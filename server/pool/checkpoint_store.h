// CheckpointStore: prefix-cache checkpoints of one model.
//
// A checkpoint is a copy of one slot (all packed states of a request at a
// token boundary) plus the worker's per-layer auxiliary bytes (e.g. its
// short-convolution window), indexed by PrefixKey (prefix_key.h). Checkpoints
// live in their own arena on the backend, separate from the live slots, with a
// fixed number of entries (the checkpoint byte budget / slot_bytes); aux bytes
// are kept in host memory.
//
// Lifetime: every entry is reference counted. References are: the prefix
// index (1 while the entry is the one its key names), each lease taken by
// Lookup, and each in-flight copy (a snapshot being written, a restore being
// read). An entry is freed when its count drops to 0. When the arena is full,
// Put evicts the least recently used entry whose only reference is the index
// (not leased, not being copied); if there is none, kResourceExhausted.
// Restore copies the checkpoint into a slot (Backend::CopySlots), so later
// updates of the slot never change the checkpoint. Copies run outside the
// store's lock.
//
// Leases pin an entry until Restore consumes them or they expire (clock from
// Options; no background thread: every call, stats() included, first collects
// the leases expired by then, so an expired lease never counts as active in
// stats, metrics or DropModel and its entry becomes evictable at expiry).
//
// Lower tiers (checkpoint_tier.h; optional): an entry evicted from the arena
// is copied out (CheckpointTier::PutFromBackend: one Backend::CopyOut into
// the host tier's pinned memory) and demoted to the host tier, whose LRU
// evictions go to the disk tier. Lookup and Restore search every tier for the
// longest candidate (equal lengths resolve to the upper tier, which always
// holds the newest copy); a hit in a lower tier takes the checkpoint out of it
// and promotes it into the arena (CheckpointTier::TakeInto: one
// Backend::CopyIn from pinned memory) before leasing, so leases
// and Restore always read the arena. With Options::host_write_through the
// host tier is inclusive instead: Put copies into it, a promotion keeps its
// copy (CheckpointTier::CopyInto) and an entry it still holds is evicted
// without a copy. A corrupt disk file is a miss (the tier
// deletes it) and the search goes on. Host and disk tier copies run under
// the store's lock; the remote tier is called outside it: Lookup / Restore /
// Peek first find the longest local hit under the lock, then ask the remote
// tier for longer candidates (taking the longest one out of it) without the
// lock, then promote under the lock; demotions to the remote tier are
// queued under the lock and sent by the same call after it releases the
// lock, before it returns. The remote tier is shared by servers: a hit there
// leaves its copy (checkpoint_tier.h), so a blob fetched but not promoted
// is simply dropped.
// Write-through (Options::remote_write_through, with a remote tier): every
// successful Put also copies the new checkpoint into host bytes (in the
// checkpoint format) and queues that copy on a RemoteWriter
// (remote_writer.h), whose thread sends it: another server sharing the tier
// can restore it while this one still holds it. Without a transcoder the
// copy is read from the caller's source slot (held exclusively for the Put)
// outside the lock; with one it is encoded from the ready entry under the
// lock (the transcoder and its scratch are not thread-safe), so other
// callers wait for that transcode. When the writer's queue is full the new
// copy is dropped before copying (counted in write_through_dropped); a
// write-through never fails or blocks a Put on Redis. An entry written
// through is marked (CheckpointBlob::remote_written): its demotion straight
// to the remote tier only refreshes the TTL, and resends the bytes only when
// the key expired (redis_tier.h). The host and disk tiers do not keep the
// mark: a checkpoint that passes through them is sent again on reaching
// Redis.
// With a transcoder (checkpoint_transcoder.h) the lower tiers hold the
// checkpoint format instead of the slot's bytes: demotion encodes into it,
// promotion decodes back into the slot format.
//
// Thread-safe. Slots passed in must be held exclusively by the caller
// (SlotPool::Acquire).
//
//   ASSIGN_OR_RETURN(auto store, CheckpointStore::Create(backend, layout, options));
//   RETURN_IF_ERROR(store->Put(key, pool.view(), slot, aux).status());
//   ASSIGN_OR_RETURN(auto hit, store->Lookup(candidates, absl::Seconds(30)));
//   ASSIGN_OR_RETURN(auto restored, store->Restore(hit.key, hit.lease_id, pool.view(), slot2));
#ifndef STATECACHE_SERVER_POOL_CHECKPOINT_STORE_H_
#define STATECACHE_SERVER_POOL_CHECKPOINT_STORE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/pool_view.h"
#include "kernels/layout/state_layout.h"
#include "server/pool/checkpoint_tier.h"
#include "server/pool/checkpoint_transcoder.h"
#include "server/pool/prefix_key.h"
#include "server/pool/remote_writer.h"
#include "server/pool/tier_bytes.h"

namespace statecache {

// Current use and cumulative counts of a CheckpointStore. Every field maps 1:1
// onto a metric (server/metrics.h) and onto statecache.v1.ModelStats.
// One storage tier of a CheckpointStore (statecache_checkpoint_tier_* series
// with label store_tier="device"|"host"|"disk"|"remote").
struct CheckpointTierStats {
  bool enabled = false;        // the device tier always; host / disk when configured
  int64_t entries = 0;         // checkpoints held
  int64_t bytes = 0;           // packed + aux bytes held
  int64_t capacity_bytes = 0;  // the tier's budget (device: arena + aux)
  // Lookups (and index-less Restores) this tier served / in which it held
  // none of the candidates.
  int64_t hits = 0;
  int64_t misses = 0;
  // Checkpoints that left this tier for the one below (device -> host ->
  // disk); the last configured tier's count is what its LRU dropped.
  int64_t demotions = 0;
  // Checkpoints taken from this tier back into the device arena.
  int64_t promotions = 0;
  // Checkpoints found corrupt (disk, remote: checksum, size, tags) and deleted.
  int64_t dropped_corrupt = 0;
  // Remote tier only (TierUse): calls to the store, their summed wall time
  // in microseconds, and the failed ones.
  int64_t requests = 0;
  int64_t request_micros = 0;
  int64_t errors = 0;
  // Remote tier with write-through only (RemoteWriterStats): snapshot copies
  // handed to the tier, copies dropped (queue full, or left at shutdown),
  // and bytes queued now.
  int64_t write_through_written = 0;
  int64_t write_through_dropped = 0;
  int64_t write_through_queued_bytes = 0;
};

struct CheckpointStats {
  // Entries in the arena (statecache_checkpoint_capacity).
  int64_t capacity = 0;
  // Entries holding a checkpoint (indexed, or still referenced after being
  // replaced) (statecache_checkpoints).
  int64_t checkpoints = 0;
  // Arena bytes = capacity * slot_bytes (statecache_checkpoint_capacity_bytes).
  int64_t capacity_bytes = 0;
  // Packed bytes of the held checkpoints by tier (statecache_checkpoint_bytes{tier}).
  TierBytes used_bytes;
  // Aux bytes held in host memory (statecache_checkpoint_aux_bytes).
  int64_t aux_bytes = 0;
  // Entries pinned by at least one lease (statecache_checkpoints_leased).
  int64_t leased = 0;
  // Leases not yet consumed or expired (statecache_leases_active).
  int64_t leases_active = 0;
  // Lookup calls that found / did not find a cached prefix
  // (statecache_prefix_lookups_total{result="hit"|"miss"}). hit rate =
  // lookups_hit / (lookups_hit + lookups_miss).
  int64_t lookups_hit = 0;
  int64_t lookups_miss = 0;
  // Tokens covered by the hit prefix, and candidate tokens not covered
  // (longest candidate - hit length; all of it on a miss)
  // (statecache_prefix_lookup_tokens_total{result}). Token hit rate =
  // tokens_hit / (tokens_hit + tokens_miss).
  int64_t lookup_tokens_hit = 0;
  int64_t lookup_tokens_miss = 0;
  // Entries evicted (LRU) to make room (statecache_checkpoint_evictions_total).
  int64_t evictions = 0;
  // Leases that expired unused (statecache_leases_expired_total).
  int64_t leases_expired = 0;
  // Successful Put / Restore calls (statecache_snapshots_total,
  // statecache_restores_total) and the packed bytes they copied
  // (statecache_snapshot_bytes_total, statecache_restore_bytes_total).
  int64_t snapshots = 0;
  int64_t restores = 0;
  int64_t bytes_snapshotted = 0;
  int64_t bytes_restored = 0;
  // By storage tier, indexed by StoreTier (device, host, disk, remote).
  CheckpointTierStats tiers[kNumStoreTiers];
  // Checkpoints transcoded into the cold checkpoint format on demotion from
  // device checkpoint memory, and back into the slot format on promotion
  // (statecache_checkpoint_transcodes_total{direction="to_cold"|"from_cold"});
  // 0 when the checkpoint format is the slot format.
  int64_t transcodes_to_cold = 0;
  int64_t transcodes_from_cold = 0;
};

class CheckpointStore {
 public:
  struct Options {
    // Checkpoints the arena holds (>= 1).
    int64_t capacity = 0;
    // Lease duration when Lookup is given a zero duration, and the cap.
    absl::Duration default_lease = absl::Seconds(30);
    absl::Duration max_lease = absl::Minutes(10);
    // Time source (tests inject a fake clock); absl::Now when empty.
    std::function<absl::Time()> clock;
    // Lower tiers (tier() kHost / kDisk / kRemote), or null, searched and
    // demoted to in this order. The store owns their use.
    std::shared_ptr<CheckpointTier> host;
    std::shared_ptr<CheckpointTier> disk;
    std::shared_ptr<CheckpointTier> remote;  // the Redis tier (redis_tier.h)
    // With `remote`: every Put also queues a copy for it (write-through, above).
    bool remote_write_through = false;
    RemoteWriterOptions remote_writer;
    // Null: the lower tiers hold the slot's packed bytes. Else they hold the
    // transcoder's cold format (its cold_slot_bytes() per checkpoint); its
    // slot model must be this store's layout.
    std::shared_ptr<CheckpointTranscoder> transcoder;
    // With `host` and no transcoder: the host tier is inclusive. Every Put
    // also copies the new checkpoint into it (under the lock, one copy out
    // into pinned memory), and a promotion from it keeps its copy
    // (CheckpointTier::CopyInto). An arena entry whose key the host tier
    // still holds is then evicted without a copy, so a promotion into a full
    // arena is one copy in, and the copy out moves to the snapshot (where a
    // full arena's eviction already put it). The host tier's budget then
    // also holds copies of arena entries.
    bool host_write_through = false;
  };

  struct PutResult {
    int evicted = 0;  // entries evicted to make room
  };

  struct LookupResult {
    bool hit = false;
    PrefixKey key;           // the longest cached candidate (when hit)
    uint64_t lease_id = 0;   // when hit
    absl::Time lease_expiry; // when hit
    int64_t candidate_tokens = 0;  // longest candidate length
    StoreTier tier = StoreTier::kDevice;  // where the hit was found (promoted from)
  };

  struct RestoreResult {
    std::vector<std::string> aux;
    int64_t num_tokens = 0;
  };

  // kInvalidArgument when options.capacity < 1 or > 2^31 - 1 or a lease
  // duration is not positive; kResourceExhausted when the backend cannot
  // allocate the arena. `backend` must outlive the store.
  static absl::StatusOr<std::unique_ptr<CheckpointStore>> Create(Backend* backend,
                                                                 const StateLayout& layout,
                                                                 Options options);

  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  // Copies slot `src_slot` of `src` (slot_bytes must equal this store's) into
  // a checkpoint under `key`, replacing an entry with the same key (a leased
  // old entry stays readable through its lease until released). Evicts LRU
  // entries when full; kResourceExhausted when every entry is pinned.
  // kInvalidArgument when key.num_tokens < 1 or slot sizes differ.
  absl::StatusOr<PutResult> Put(const PrefixKey& key, const PoolView& src, int32_t src_slot,
                                std::vector<std::string> aux) ABSL_LOCKS_EXCLUDED(mu_);

  // The longest candidate cached in any tier (keys compared by hash and
  // length); a lower-tier hit is promoted into the arena first (a miss when
  // every arena entry is pinned). On a hit, leases it for `lease` (zero: default; capped at max_lease) and
  // marks it recently used. Never fails on a miss (hit = false, no lease).
  absl::StatusOr<LookupResult> Lookup(absl::Span<const PrefixKey> candidates,
                                      absl::Duration lease) ABSL_LOCKS_EXCLUDED(mu_);

  // Copies the checkpoint of `key` into slot `dst_slot` of `dst` and returns
  // its aux bytes. With lease_id != 0: the lease must be for `key`
  // (kInvalidArgument otherwise), its entry is used even if the key was
  // replaced since, and the lease is consumed after the copy; an unknown or
  // expired lease falls back to the index and then the lower tiers (a hit
  // there is promoted). kNotFound when `key` is not cached (and no valid
  // lease names it).
  absl::StatusOr<RestoreResult> Restore(const PrefixKey& key, uint64_t lease_id,
                                        const PoolView& dst, int32_t dst_slot)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Reads a checkpoint in place: calls `read(arena, entry)` (outside the
  // store's lock) with the arena and the entry of `key`, found as Restore
  // finds it (a lease for another key is kInvalidArgument; an unknown or
  // expired lease falls back to the index, then the lower tiers, whose hit
  // is promoted; kNotFound when no tier holds it). The entry is held as an
  // in-flight copy during the call (never evicted or freed under it) and
  // marked recently used; a lease is not consumed. Returns read's status.
  using ReadFn = std::function<absl::Status(const PoolView& arena, int32_t entry)>;
  absl::Status Read(const PrefixKey& key, uint64_t lease_id, const ReadFn& read)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Lookup without side effects: the longest candidate cached in any tier
  // (`tier` says which; nothing is promoted), no lease, no LRU touch, not
  // counted in the lookup statistics.
  LookupResult Peek(absl::Span<const PrefixKey> candidates) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops a lease without restoring. kNotFound for an unknown or expired one.
  absl::Status ReleaseLease(uint64_t lease_id) ABSL_LOCKS_EXCLUDED(mu_);

  // True when `key` is indexed.
  bool Contains(const PrefixKey& key) const ABSL_LOCKS_EXCLUDED(mu_);

  // Current use and counters, after collecting the leases expired by now
  // (counted in leases_expired, no longer in leases_active / leased).
  CheckpointStats stats() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t capacity() const { return view_.num_slots; }

  // For tests: free + held == capacity, every entry's refcount equals
  // (indexed ? 1 : 0) + its leases + its in-flight copies, indexed entries are
  // ready and listed in the LRU list exactly once, the free list holds exactly
  // the free entries, each lower tier is within its budget. kInternal otherwise.
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class EntryState : uint8_t { kFree, kWriting, kReady };
  struct Entry {
    EntryState state = EntryState::kFree;
    PrefixKey key;
    bool indexed = false;
    int refs = 0;     // index + leases + copies in flight
    int leases = 0;   // leases naming this entry
    int copies = 0;   // copies in flight (the writer, readers)
    std::vector<std::string> aux;
    int64_t aux_bytes = 0;
    bool remote_written = false;  // a copy was queued for / read from the remote tier
    // The host tier was given these bytes under this key (host_write_through);
    // eviction copies nothing while it still holds the key.
    bool host_copy = false;
    std::list<int32_t>::iterator lru_pos;  // valid while indexed
  };
  struct Lease {
    int32_t entry = -1;
    PrefixKey key;
    absl::Time expiry;
  };

  CheckpointStore(Backend* backend, std::unique_ptr<BackendBuffer> arena, PoolView view,
                  TierBytes slot_tiers, Options options);

  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }
  void SweepExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops one reference; frees the entry at zero.
  void UnrefLocked(int32_t e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `e` from the index and the LRU list and drops the index reference.
  void UnindexLocked(int32_t e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchLocked(int32_t e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free entry, evicting LRU entries if needed; -1 when all are pinned.
  // refill (null, or slot_bytes of host memory): the bytes the entry is
  // taken for; *refilled (may be null when refill is) is true when the
  // returned entry already holds them (copied in while an evicted entry's
  // bytes went out, DemoteLocked); otherwise the caller copies them in.
  int32_t TakeFreeEntryLocked(int* evicted, const void* refill, bool* refilled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The arena entry holding the longest of `candidates`, promoting it from a
  // lower tier when that is where it is; -1 when no tier holds one (or the
  // arena cannot take a promoted one). Counts tier hits and misses. The
  // remote tier is not asked: `*fetched` is what FetchRemote took from it
  // (promoted when longest; otherwise queued back to it; empty on return).
  int32_t FindOrPromoteLocked(absl::Span<const PrefixKey> candidates,
                              std::optional<CheckpointBlob>* fetched, PrefixKey* key,
                              StoreTier* tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // num_tokens of the longest candidate in the arena, host or disk tier (0: none).
  int64_t LocalLongestLocked(absl::Span<const PrefixKey> candidates) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Outside the lock: takes the longest candidate longer than `local_tokens`
  // out of the remote tier; nullopt when it holds none (or none readable).
  std::optional<CheckpointBlob> FetchRemote(absl::Span<const PrefixKey> candidates,
                                            int64_t local_tokens) ABSL_LOCKS_EXCLUDED(mu_);
  // Copies ready entry `e` into `blob` (the checkpoint format); false when
  // the copy or the transcode failed.
  bool CopyOutLocked(int32_t e, CheckpointBlob* blob) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when the host tier is inclusive (Options::host_write_through).
  bool HostInclusive() const { return options_.host_write_through && options_.host &&
                                      !options_.transcoder; }
  // Copies ready entry `e` into the host tier (inclusive mode) and sets its
  // host_copy mark; what the host tier evicts goes down. A failed copy
  // leaves the mark unset (eviction then demotes as usual).
  void WriteToHostLocked(int32_t e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Outside the lock, before PinForCopyLocked: what FetchRemote takes for
  // `key` (nullopt without a remote tier or when `lease_id` is held).
  std::optional<CheckpointBlob> FetchRemoteForPin(const PrefixKey& key, uint64_t lease_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The entry Restore / Read copy from (the lease's, else the index's or a
  // promoted one, `*fetched` included), with a reference and an in-flight
  // copy taken; *leased tells whether the lease named it.
  absl::StatusOr<int32_t> PinForCopyLocked(const PrefixKey& key, uint64_t lease_id,
                                           std::optional<CheckpointBlob>* fetched, bool* leased)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the arena entry `e` (indexed, referenced only by the index) into
  // the lower tiers (transcoded when the store has a transcoder). Its arena
  // bytes stay as they are, or, with `refill` (slot_bytes of host memory),
  // are replaced by refill's where the first lower tier copies straight
  // from the backend (CheckpointTier::PutFromBackend): returns true then.
  bool DemoteLocked(int32_t e, const void* refill) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts `blob` into lower tier `i` and what it evicts into tier i + 1; the
  // remote tier's share goes to remote_outbox_.
  void SpillLocked(size_t i, CheckpointBlob blob) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes a lower tier's packed bytes (slot_bytes, or the transcoder's
  // cold_slot_bytes: checked by the caller) into arena entry `e` (CopyIn, or
  // the transcoder's FromCold).
  absl::Status PromoteBytesLocked(absl::string_view packed, int32_t e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends remote_outbox_ to the remote tier, outside the lock. Every public
  // call that may demote runs it (through FlushOnExit) after its lock is
  // released.
  void FlushRemote() ABSL_LOCKS_EXCLUDED(mu_);
  class FlushOnExit;
  // What lower tier `i` evicted goes into tier i + 1 (dropped below the last).
  void PassDownLocked(size_t i, std::vector<CheckpointBlob> evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Copy(const PoolView& src, int32_t src_slot, const PoolView& dst,
                    int32_t dst_slot);

  Backend* const backend_;
  const std::unique_ptr<BackendBuffer> arena_;
  const PoolView view_;
  const TierBytes slot_tiers_;
  const Options options_;

  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> free_list_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PrefixKey, int32_t> index_ ABSL_GUARDED_BY(mu_);
  std::list<int32_t> lru_ ABSL_GUARDED_BY(mu_);  // front = most recently used
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  CheckpointStats counters_ ABSL_GUARDED_BY(mu_);  // cumulative fields only
  absl::BitGen bitgen_ ABSL_GUARDED_BY(mu_);
  // The configured lower tiers, upper first (host, disk, remote).
  std::vector<std::shared_ptr<CheckpointTier>> lower_ ABSL_GUARDED_BY(mu_);
  // Blobs for the remote tier, written by FlushRemote outside the lock.
  std::vector<CheckpointBlob> remote_outbox_ ABSL_GUARDED_BY(mu_);
  // Write-through writer (null without it); declared last, so it drains
  // (bounded) before the rest of the store is destroyed.
  std::unique_ptr<RemoteWriter> writer_;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_CHECKPOINT_STORE_H_
