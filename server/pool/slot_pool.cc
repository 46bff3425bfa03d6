#include "server/pool/slot_pool.h"

#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"
#include "server/pool/staging.h"

namespace statecache {

SlotPool::SlotAccess::SlotAccess(SlotAccess&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), indices_(std::move(other.indices_)) {}

SlotPool::SlotAccess& SlotPool::SlotAccess::operator=(SlotAccess&& other) noexcept {
  if (this != &other) {
    if (pool_ != nullptr) pool_->Unbusy(indices_);
    pool_ = std::exchange(other.pool_, nullptr);
    indices_ = std::move(other.indices_);
  }
  return *this;
}

SlotPool::SlotAccess::~SlotAccess() {
  if (pool_ != nullptr) pool_->Unbusy(indices_);
}

absl::StatusOr<std::unique_ptr<SlotPool>> SlotPool::Create(Backend* backend,
                                                           const StateLayout& layout,
                                                           int64_t capacity) {
  return Create(backend, layout, capacity, nullptr);
}

absl::StatusOr<std::unique_ptr<SlotPool>> SlotPool::Create(Backend* backend,
                                                           const StateLayout& layout,
                                                           int64_t capacity,
                                                           std::unique_ptr<BackendBuffer> arena) {
  if (capacity < 1 || capacity > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots: capacity ", capacity, " is out of range 1..2^31-1"));
  }
  const ModelGeometry& g = layout.geometry();
  PoolView view;
  view.num_slots = capacity;
  view.layers = g.layers;
  view.heads = g.h_v;
  view.head_bytes = layout.head_layout().head_bytes;
  const int64_t bytes = view.slot_bytes() * capacity;
  if (arena == nullptr) {
    ASSIGN_OR_RETURN(arena, backend->Allocate(bytes));
  } else if (arena->size() < bytes) {
    return absl::InvalidArgumentError(absl::StrCat("arena: ", arena->size(), " bytes, want ",
                                                   bytes));
  }
  view.base = arena->data();
  const int64_t fp32_slot_bytes = g.HeadsPerSlot() * g.d_k * g.d_v * 4;
  return std::unique_ptr<SlotPool>(
      new SlotPool(backend, std::move(arena), view,
                   TierBytes::OfHead(layout.head_layout()).Times(g.HeadsPerSlot()),
                   fp32_slot_bytes));
}

SlotPool::SlotPool(Backend* backend, std::unique_ptr<BackendBuffer> arena, PoolView view,
                   TierBytes slot_tiers, int64_t fp32_slot_bytes)
    : backend_(backend),
      arena_(std::move(arena)),
      view_(view),
      slot_tiers_(slot_tiers),
      fp32_slot_bytes_(fp32_slot_bytes) {
  absl::MutexLock lock(&mu_);
  slots_.resize(view_.num_slots);
  free_list_.reserve(view_.num_slots);
  for (int64_t i = view_.num_slots - 1; i >= 0; --i) {
    uint64_t id;
    do {
      id = absl::Uniform<uint64_t>(bitgen_);
    } while (id == 0 || index_of_id_.contains(id));
    slots_[i].id = id;
    index_of_id_[id] = static_cast<int32_t>(i);
    free_list_.push_back(static_cast<int32_t>(i));  // slot 0 is handed out first
  }
}

absl::StatusOr<std::vector<SlotHandle>> SlotPool::Allocate(int64_t n) {
  if (n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("count: ", n, " must be >= 1"));
  }
  std::vector<SlotHandle> handles;
  std::vector<int32_t> indices;
  {
    absl::MutexLock lock(&mu_);
    if (n > static_cast<int64_t>(free_list_.size())) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "slots: requested ", n, " but only ", free_list_.size(), " of ", view_.num_slots,
          " slots are free"));
    }
    for (int64_t i = 0; i < n; ++i) {
      const int32_t idx = free_list_.back();
      free_list_.pop_back();
      Slot& s = slots_[idx];
      s.live = true;
      s.busy = true;  // until zeroed; nobody holds the handle yet
      ++s.generation;
      indices.push_back(idx);
      handles.push_back(SlotHandle{s.id, s.generation});
    }
    allocated_ += n;
  }
  absl::Status zeroed = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto staged, StageInts(*backend_, indices));
    return backend_->ZeroSlots(view_, StagedData<int32_t>(*staged), static_cast<int>(n));
  }();
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (int32_t idx : indices) {
    slots_[idx].busy = false;
    slots_[idx].last_used = now;
  }
  unbusy_.SignalAll();
  if (!zeroed.ok()) {
    for (int32_t idx : indices) {
      slots_[idx].live = false;
      free_list_.push_back(idx);
    }
    allocated_ -= n;
    return zeroed;
  }
  return handles;
}

absl::StatusOr<int32_t> SlotPool::ResolveLocked(const SlotHandle& h, absl::string_view field,
                                                size_t position) const {
  auto it = index_of_id_.find(h.id);
  if (it == index_of_id_.end()) {
    return absl::NotFoundError(absl::StrCat(field, "[", position, "]: unknown slot handle ",
                                            h.DebugString()));
  }
  const Slot& s = slots_[it->second];
  if (!s.live || s.generation != h.generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, "[", position, "]: stale slot handle ", h.DebugString(),
        " (the slot was released", s.live ? " and re-allocated)" : ")"));
  }
  return it->second;
}

absl::StatusOr<std::vector<int32_t>> SlotPool::ResolveAllLocked(
    absl::Span<const SlotHandle> handles, absl::string_view field) const {
  if (handles.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": no slot handles given"));
  }
  std::vector<int32_t> indices;
  indices.reserve(handles.size());
  absl::flat_hash_set<int32_t> seen;
  for (size_t i = 0; i < handles.size(); ++i) {
    ASSIGN_OR_RETURN(int32_t idx, ResolveLocked(handles[i], field, i));
    if (!seen.insert(idx).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: slot handle ",
                                                     handles[i].DebugString(),
                                                     " appears more than once"));
    }
    indices.push_back(idx);
  }
  return indices;
}

bool SlotPool::AnyBusyLocked(const std::vector<int32_t>& indices) const {
  for (int32_t idx : indices) {
    if (slots_[idx].busy) return true;
  }
  return false;
}

absl::Status SlotPool::Release(absl::Span<const SlotHandle> handles) {
  absl::MutexLock lock(&mu_);
  while (true) {
    ASSIGN_OR_RETURN(std::vector<int32_t> indices, ResolveAllLocked(handles, "slots"));
    if (AnyBusyLocked(indices)) {
      unbusy_.Wait(&mu_);
      continue;  // re-validate: the handles may have gone stale meanwhile
    }
    for (int32_t idx : indices) {
      slots_[idx].live = false;
      free_list_.push_back(idx);
    }
    allocated_ -= static_cast<int64_t>(indices.size());
    return absl::OkStatus();
  }
}

absl::StatusOr<SlotPool::SlotAccess> SlotPool::Acquire(absl::Span<const SlotHandle> handles,
                                                       absl::string_view field) {
  absl::MutexLock lock(&mu_);
  while (true) {
    ASSIGN_OR_RETURN(std::vector<int32_t> indices, ResolveAllLocked(handles, field));
    if (AnyBusyLocked(indices)) {
      unbusy_.Wait(&mu_);
      continue;
    }
    for (int32_t idx : indices) slots_[idx].busy = true;
    return SlotAccess(this, std::move(indices));
  }
}

void SlotPool::Unbusy(const std::vector<int32_t>& indices) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  for (int32_t idx : indices) {
    slots_[idx].busy = false;
    slots_[idx].last_used = now;
  }
  unbusy_.SignalAll();
}

int64_t SlotPool::ReleaseIdle(absl::Time cutoff) {
  absl::MutexLock lock(&mu_);
  int64_t released = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.live || s.busy || s.last_used >= cutoff) continue;
    s.live = false;
    free_list_.push_back(static_cast<int32_t>(i));
    ++released;
  }
  allocated_ -= released;
  return released;
}

SlotPoolStats SlotPool::stats() const {
  absl::MutexLock lock(&mu_);
  SlotPoolStats s;
  s.capacity = view_.num_slots;
  s.allocated = allocated_;
  s.capacity_bytes = view_.num_slots * view_.slot_bytes();
  s.used_bytes = slot_tiers_.Times(allocated_);
  s.fp32_equivalent_bytes = fp32_slot_bytes_ * allocated_;
  return s;
}

absl::Status SlotPool::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  auto fail = [](auto... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  if (allocated_ + static_cast<int64_t>(free_list_.size()) != view_.num_slots) {
    return fail("allocated ", allocated_, " + free ", free_list_.size(), " != capacity ",
                view_.num_slots);
  }
  std::vector<bool> on_free_list(slots_.size(), false);
  for (int32_t idx : free_list_) {
    if (idx < 0 || idx >= static_cast<int32_t>(slots_.size())) {
      return fail("free list holds out-of-range index ", idx);
    }
    if (on_free_list[idx]) return fail("slot ", idx, " is on the free list twice");
    if (slots_[idx].live) return fail("slot ", idx, " is both free and live");
    on_free_list[idx] = true;
  }
  int64_t live = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.live) ++live;
    if (!s.live && !on_free_list[i]) return fail("slot ", i, " is neither live nor free");
    if (s.busy && !s.live) return fail("slot ", i, " is busy but not live");
    auto it = index_of_id_.find(s.id);
    if (it == index_of_id_.end() || it->second != static_cast<int32_t>(i)) {
      return fail("slot ", i, " id does not map back to it");
    }
  }
  if (live != allocated_) return fail("live slots ", live, " != allocated ", allocated_);
  if (index_of_id_.size() != slots_.size()) return fail("id map size mismatch");
  return absl::OkStatus();
}

}  // namespace statecache
