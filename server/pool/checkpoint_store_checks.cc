// CheckpointStore::CheckInvariants (checkpoint_store.h), for tests.
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/pool/checkpoint_store.h"

namespace statecache {

absl::Status CheckpointStore::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  auto fail = [](auto... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  std::vector<int> lease_count(entries_.size(), 0);
  for (const auto& [id, lease] : leases_) {
    if (lease.entry < 0 || lease.entry >= static_cast<int32_t>(entries_.size())) {
      return fail("lease ", id, " names entry ", lease.entry);
    }
    if (entries_[lease.entry].state != EntryState::kReady) {
      return fail("lease ", id, " names a non-ready entry ", lease.entry);
    }
    if (entries_[lease.entry].key != lease.key) return fail("lease ", id, " key mismatch");
    ++lease_count[lease.entry];
  }
  std::vector<bool> on_free_list(entries_.size(), false);
  for (int32_t e : free_list_) {
    if (e < 0 || e >= static_cast<int32_t>(entries_.size())) return fail("bad free entry ", e);
    if (on_free_list[e]) return fail("entry ", e, " on the free list twice");
    on_free_list[e] = true;
  }
  std::vector<int> in_lru(entries_.size(), 0);
  for (int32_t e : lru_) ++in_lru[e];
  int64_t held = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& entry = entries_[i];
    const bool free = entry.state == EntryState::kFree;
    if (free != on_free_list[i]) return fail("entry ", i, " free state disagrees with free list");
    if (free) {
      if (entry.refs != 0 || entry.indexed || lease_count[i] != 0) {
        return fail("free entry ", i, " is referenced");
      }
      continue;
    }
    ++held;
    if (entry.leases != lease_count[i]) {
      return fail("entry ", i, " counts ", entry.leases, " leases, found ", lease_count[i]);
    }
    const int want = (entry.indexed ? 1 : 0) + entry.leases + entry.copies;
    if (entry.refs != want) {
      return fail("entry ", i, " refcount ", entry.refs, " != index+leases+copies ", want);
    }
    if (entry.refs <= 0) return fail("held entry ", i, " has no references");
    if (entry.indexed) {
      if (entry.state != EntryState::kReady) return fail("indexed entry ", i, " is not ready");
      auto it = index_.find(entry.key);
      if (it == index_.end() || it->second != static_cast<int32_t>(i)) {
        return fail("indexed entry ", i, " is not in the index under its key");
      }
      if (in_lru[i] != 1) return fail("indexed entry ", i, " is in the LRU list ", in_lru[i], "x");
    } else if (in_lru[i] != 0) {
      return fail("unindexed entry ", i, " is in the LRU list");
    }
  }
  if (held + static_cast<int64_t>(free_list_.size()) != view_.num_slots) {
    return fail("held ", held, " + free ", free_list_.size(), " != capacity ", view_.num_slots);
  }
  if (index_.size() != lru_.size()) return fail("index and LRU sizes differ");
  for (const auto& tier : lower_) {
    const TierUse use = tier->use();
    // capacity_bytes 0: no budget (the remote tier).
    if ((use.capacity_bytes > 0 && use.bytes > use.capacity_bytes) || use.bytes < 0) {
      return fail(StoreTierName(tier->tier()), " tier holds ", use.bytes, " bytes, budget ",
                  use.capacity_bytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace statecache
