// SlotPool: the live slots of one model, in one preallocated backend arena.
//
// A slot holds all packed recurrent states of one request
// (StateLayout::slot_bytes: layers x h_v packed heads). The arena is
// allocated once, at Create, from the backend (device memory on CUDA, aligned
// host memory on CPU); slots are handed out from a free list and named by
// SlotHandles (random id + generation, slot_handle.h), never by index.
//
// Exclusive access: the backend must never see two concurrent calls on the
// same slot, and a slot must not be released (and re-allocated to another
// request) while a call still uses it. Every operation on slot contents
// therefore goes through Acquire(), which validates the handles and marks the
// slots busy until the returned SlotAccess is destroyed; Acquire and Release
// wait for busy slots. Acquire takes all its slots at once under the pool
// lock (no hold-and-wait), so concurrent multi-slot calls cannot deadlock.
//
// Thread-safe. Memory is freed when the pool is destroyed; the backend must
// outlive it.
//
//   ASSIGN_OR_RETURN(auto pool, SlotPool::Create(backend, layout, /*capacity=*/64));
//   ASSIGN_OR_RETURN(std::vector<SlotHandle> h, pool->Allocate(2));
//   {
//     ASSIGN_OR_RETURN(SlotPool::SlotAccess access, pool->Acquire(h, "slots"));
//     RETURN_IF_ERROR(backend.DecodeUpdate(model, pool->view(), layer, ...access.indices()...));
//   }
//   RETURN_IF_ERROR(pool->Release(h));
#ifndef STATECACHE_SERVER_POOL_SLOT_POOL_H_
#define STATECACHE_SERVER_POOL_SLOT_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/pool_view.h"
#include "kernels/layout/state_layout.h"
#include "server/pool/slot_handle.h"
#include "server/pool/tier_bytes.h"

namespace statecache {

// Current use of a SlotPool. Every field maps 1:1 onto a metric
// (server/metrics.h) and onto statecache.v1.ModelStats.
struct SlotPoolStats {
  // Slots in the arena (statecache_slots_capacity).
  int64_t capacity = 0;
  // Slots allocated to requests (statecache_slots_used); free = capacity - allocated.
  int64_t allocated = 0;
  // Bytes of the arena = capacity * slot_bytes (statecache_state_capacity_bytes).
  int64_t capacity_bytes = 0;
  // Bytes of allocated slots by tier (statecache_state_bytes{tier}).
  TierBytes used_bytes;
  // FP32 bytes the allocated slots would need (statecache_state_fp32_equivalent_bytes).
  int64_t fp32_equivalent_bytes = 0;
};

class SlotPool {
 public:
  // Exclusive use of a set of slots; releases them on destruction. Movable.
  class SlotAccess {
   public:
    SlotAccess(SlotAccess&& other) noexcept;
    SlotAccess& operator=(SlotAccess&& other) noexcept;
    SlotAccess(const SlotAccess&) = delete;
    SlotAccess& operator=(const SlotAccess&) = delete;
    ~SlotAccess();

    // Arena indices, in the order of the handles given to Acquire.
    const std::vector<int32_t>& indices() const { return indices_; }

   private:
    friend class SlotPool;
    SlotAccess(SlotPool* pool, std::vector<int32_t> indices)
        : pool_(pool), indices_(std::move(indices)) {}
    SlotPool* pool_ = nullptr;
    std::vector<int32_t> indices_;
  };

  // Allocates an arena of `capacity` slots of layout.slot_bytes() each.
  // kInvalidArgument when capacity < 1 or > 2^31 - 1; kResourceExhausted
  // when the backend cannot allocate it. `backend` must outlive the pool.
  static absl::StatusOr<std::unique_ptr<SlotPool>> Create(Backend* backend,
                                                          const StateLayout& layout,
                                                          int64_t capacity);
  // The same over a caller-provided zero-filled arena in `backend`'s memory
  // space of at least capacity * slot_bytes (e.g. shared memory a co-located
  // worker can map, issue 10). kInvalidArgument when it is too small.
  static absl::StatusOr<std::unique_ptr<SlotPool>> Create(Backend* backend,
                                                          const StateLayout& layout,
                                                          int64_t capacity,
                                                          std::unique_ptr<BackendBuffer> arena);

  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // Allocates `n` slots set to the zero state (all or nothing).
  // kInvalidArgument when n < 1; kResourceExhausted (naming free/capacity)
  // when fewer than n slots are free.
  absl::StatusOr<std::vector<SlotHandle>> Allocate(int64_t n) ABSL_LOCKS_EXCLUDED(mu_);

  // Returns slots to the free list (all or nothing: one bad handle releases
  // none). Waits for in-flight calls on them. kNotFound for an unknown id,
  // kFailedPrecondition for a stale handle, kInvalidArgument for a duplicate.
  absl::Status Release(absl::Span<const SlotHandle> handles) ABSL_LOCKS_EXCLUDED(mu_);

  // Validates `handles` (errors as Release; messages name `field` and the
  // index of the bad handle) and takes exclusive use of their slots, waiting
  // while another call holds any of them. An empty list is kInvalidArgument.
  absl::StatusOr<SlotAccess> Acquire(absl::Span<const SlotHandle> handles,
                                     absl::string_view field) ABSL_LOCKS_EXCLUDED(mu_);

  // Slot leases: releases every allocated slot that no call holds and that
  // was last allocated or used (end of an Acquire) before `cutoff`, as if its
  // owner had called Release (its handle becomes stale). This is how slots of
  // a client that died come back (the server runs it every few seconds with
  // cutoff = now - --slot_idle_timeout_ms). Returns the number released.
  int64_t ReleaseIdle(absl::Time cutoff) ABSL_LOCKS_EXCLUDED(mu_);

  // The arena as the kernels see it (fixed for the pool's lifetime).
  const PoolView& view() const { return view_; }
  int64_t capacity() const { return view_.num_slots; }
  int64_t slot_bytes() const { return view_.slot_bytes(); }
  // The arena buffer (data plane: exported to attached workers).
  const BackendBuffer& arena() const { return *arena_; }

  SlotPoolStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // Internal consistency, for tests: allocated + free == capacity, every
  // free-list entry is a free slot listed once, no slot is both free and
  // live, busy slots are live, ids map to their slots. kInternal otherwise.
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Slot {
    uint64_t id = 0;
    uint32_t generation = 0;
    bool live = false;
    bool busy = false;
    absl::Time last_used;  // allocation or end of the last access
  };

  SlotPool(Backend* backend, std::unique_ptr<BackendBuffer> arena, PoolView view,
           TierBytes slot_tiers, int64_t fp32_slot_bytes);

  // Index of a valid handle, or the error for it.
  absl::StatusOr<int32_t> ResolveLocked(const SlotHandle& h, absl::string_view field,
                                        size_t position) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<int32_t>> ResolveAllLocked(absl::Span<const SlotHandle> handles,
                                                        absl::string_view field) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyBusyLocked(const std::vector<int32_t>& indices) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unbusy(const std::vector<int32_t>& indices) ABSL_LOCKS_EXCLUDED(mu_);

  Backend* const backend_;
  const std::unique_ptr<BackendBuffer> arena_;
  const PoolView view_;
  const TierBytes slot_tiers_;
  const int64_t fp32_slot_bytes_;

  mutable absl::Mutex mu_;
  absl::CondVar unbusy_;  // signalled whenever a slot stops being busy
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> free_list_ ABSL_GUARDED_BY(mu_);  // stack of free indices
  absl::flat_hash_map<uint64_t, int32_t> index_of_id_ ABSL_GUARDED_BY(mu_);
  int64_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
  absl::BitGen bitgen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_SLOT_POOL_H_
