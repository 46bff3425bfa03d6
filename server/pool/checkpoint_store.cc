#include "server/pool/checkpoint_store.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace statecache {

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::Create(
    Backend* backend, const StateLayout& layout, Options options) {
  if (options.capacity < 1 || options.capacity > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoints: capacity ", options.capacity, " is out of range 1..2^31-1"));
  }
  if (options.default_lease <= absl::ZeroDuration() || options.max_lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease durations must be positive");
  }
  const ModelGeometry& g = layout.geometry();
  PoolView view;
  view.num_slots = options.capacity;
  view.layers = g.layers;
  view.heads = g.h_v;
  view.head_bytes = layout.head_layout().head_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> arena,
                   backend->Allocate(view.slot_bytes() * options.capacity));
  view.base = arena->data();
  return std::unique_ptr<CheckpointStore>(
      new CheckpointStore(backend, std::move(arena), view,
                          TierBytes::OfHead(layout.head_layout()).Times(g.HeadsPerSlot()),
                          std::move(options)));
}

CheckpointStore::CheckpointStore(Backend* backend, std::unique_ptr<BackendBuffer> arena,
                                 PoolView view, TierBytes slot_tiers, Options options)
    : backend_(backend),
      arena_(std::move(arena)),
      view_(view),
      slot_tiers_(slot_tiers),
      options_(std::move(options)) {
  if (options_.remote && options_.remote_write_through) {
    writer_ = std::make_unique<RemoteWriter>(options_.remote, options_.remote_writer);
  }
  absl::MutexLock lock(&mu_);
  entries_.resize(view_.num_slots);
  if (options_.host) lower_.push_back(options_.host);
  if (options_.disk) lower_.push_back(options_.disk);
  if (options_.remote) lower_.push_back(options_.remote);
  for (int64_t i = view_.num_slots - 1; i >= 0; --i) free_list_.push_back(static_cast<int32_t>(i));
}

void CheckpointStore::SweepExpiredLocked(absl::Time now) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expiry <= now) {
      const int32_t e = it->second.entry;
      leases_.erase(it++);
      --entries_[e].leases;
      ++counters_.leases_expired;
      UnrefLocked(e);
    } else {
      ++it;
    }
  }
}

void CheckpointStore::UnrefLocked(int32_t e) {
  Entry& entry = entries_[e];
  if (--entry.refs > 0) return;
  entry = Entry();
  free_list_.push_back(e);
}

void CheckpointStore::UnindexLocked(int32_t e) {
  Entry& entry = entries_[e];
  index_.erase(entry.key);
  lru_.erase(entry.lru_pos);
  entry.indexed = false;
  UnrefLocked(e);
}

void CheckpointStore::TouchLocked(int32_t e) {
  Entry& entry = entries_[e];
  if (!entry.indexed) return;
  lru_.splice(lru_.begin(), lru_, entry.lru_pos);
}

int32_t CheckpointStore::TakeFreeEntryLocked(int* evicted, const void* refill, bool* refilled) {
  if (refilled != nullptr) *refilled = false;
  while (free_list_.empty()) {
    int32_t victim = -1;
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
      if (entries_[*it].refs == 1) {  // only the index holds it
        victim = *it;
        break;
      }
    }
    if (victim < 0) return -1;
    // The free list is empty, so the victim's entry is the one returned.
    const bool victim_refilled = DemoteLocked(victim, refill);
    if (refilled != nullptr) *refilled = victim_refilled;
    UnindexLocked(victim);
    ++*evicted;
    ++counters_.evictions;
  }
  const int32_t e = free_list_.back();
  free_list_.pop_back();
  return e;
}

bool CheckpointStore::CopyOutLocked(int32_t e, CheckpointBlob* blob) {
  const Entry& entry = entries_[e];
  blob->key = entry.key;
  if (options_.transcoder) {
    absl::StatusOr<std::string> cold = options_.transcoder->ToCold(view_, e);
    if (!cold.ok()) return false;
    blob->packed = *std::move(cold);
    ++counters_.transcodes_to_cold;
  } else {
    blob->packed.resize(static_cast<size_t>(view_.slot_bytes()));
    if (!backend_->CopyOut(&blob->packed[0], view_.slot(e), view_.slot_bytes()).ok()) return false;
  }
  blob->aux = entry.aux;
  blob->remote_written = entry.remote_written;
  return true;
}

bool CheckpointStore::DemoteLocked(int32_t e, const void* refill) {
  if (lower_.empty()) return false;
  const Entry& entry = entries_[e];
  PrefixKey held;
  if (entry.host_copy && lower_[0]->LongestHeld(absl::MakeConstSpan(&entry.key, 1), &held)) {
    // Inclusive host tier: it already holds these bytes.
    ++counters_.tiers[static_cast<int>(StoreTier::kDevice)].demotions;
    return false;
  }
  if (!options_.transcoder && lower_[0] != options_.remote) {
    // The slot's bytes straight from the arena into the tier's memory (the
    // host tier: pinned, one DMA copy, overlapped with the refill's). The
    // remote_written mark is not kept there: a later demotion to the remote
    // tier sends the bytes again.
    std::vector<CheckpointBlob> evicted;
    const absl::Status put =
        lower_[0]->PutFromBackend(entry.key, *backend_, view_.slot(e), view_.slot_bytes(),
                                  entry.aux, &evicted, refill);
    if (put.ok()) ++counters_.tiers[static_cast<int>(StoreTier::kDevice)].demotions;
    PassDownLocked(0, std::move(evicted));
    return put.ok() && refill != nullptr;
  }
  // Through host bytes: the cold format's encoding, or a remote tier first
  // in line (written outside the lock).
  CheckpointBlob blob;
  if (!CopyOutLocked(e, &blob)) return false;  // dropped, as an unwritable tier drops it
  ++counters_.tiers[static_cast<int>(StoreTier::kDevice)].demotions;
  SpillLocked(0, std::move(blob));
  return false;
}

void CheckpointStore::WriteToHostLocked(int32_t e) {
  Entry& entry = entries_[e];
  std::vector<CheckpointBlob> evicted;
  entry.host_copy = lower_[0]
                        ->PutFromBackend(entry.key, *backend_, view_.slot(e), view_.slot_bytes(),
                                         entry.aux, &evicted, /*refill=*/nullptr)
                        .ok();
  PassDownLocked(0, std::move(evicted));
}

absl::Status CheckpointStore::PromoteBytesLocked(absl::string_view packed, int32_t e) {
  if (!options_.transcoder) {
    return backend_->CopyIn(view_.slot(e), packed.data(), view_.slot_bytes());
  }
  RETURN_IF_ERROR(options_.transcoder->FromCold(packed, view_, e));
  ++counters_.transcodes_from_cold;
  return absl::OkStatus();
}

// Declared before a call's MutexLock, so that it runs after the lock is released.
class CheckpointStore::FlushOnExit {
 public:
  explicit FlushOnExit(CheckpointStore* store) : store_(store) {}
  ~FlushOnExit() { store_->FlushRemote(); }
  FlushOnExit(const FlushOnExit&) = delete;
  FlushOnExit& operator=(const FlushOnExit&) = delete;

 private:
  CheckpointStore* const store_;
};

void CheckpointStore::FlushRemote() {
  if (!options_.remote) return;
  std::vector<CheckpointBlob> out;
  {
    absl::MutexLock lock(&mu_);
    out.swap(remote_outbox_);
  }
  for (CheckpointBlob& blob : out) {
    std::vector<CheckpointBlob> evicted;  // the last tier: nothing to spill
    (void)options_.remote->Put(std::move(blob), &evicted);  // a failed write is a dropped blob
  }
}

void CheckpointStore::SpillLocked(size_t i, CheckpointBlob blob) {
  if (lower_[i] == options_.remote) {  // the last tier, written outside the lock
    remote_outbox_.push_back(std::move(blob));
    return;
  }
  std::vector<CheckpointBlob> evicted;
  if (!lower_[i]->Put(std::move(blob), &evicted).ok()) return;  // too large or unwritable: dropped
  PassDownLocked(i, std::move(evicted));
}

void CheckpointStore::PassDownLocked(size_t i, std::vector<CheckpointBlob> evicted) {
  if (i + 1 == lower_.size()) return;  // the last tier's drops are its use().evictions
  for (CheckpointBlob& b : evicted) {
    ++counters_.tiers[static_cast<int>(lower_[i]->tier())].demotions;
    SpillLocked(i + 1, std::move(b));
  }
}

int64_t CheckpointStore::LocalLongestLocked(absl::Span<const PrefixKey> candidates) const {
  int64_t longest = 0;
  PrefixKey k;
  if (LongestHeldIn(index_, candidates, &k)) longest = k.num_tokens;
  for (const auto& t : lower_) {
    if (t != options_.remote && t->LongestHeld(candidates, &k)) {
      longest = std::max(longest, k.num_tokens);
    }
  }
  return longest;
}

std::optional<CheckpointBlob> CheckpointStore::FetchRemote(absl::Span<const PrefixKey> candidates,
                                                           int64_t local_tokens) {
  if (!options_.remote) return std::nullopt;
  std::vector<PrefixKey> longer;
  for (const PrefixKey& k : candidates) {
    if (k.num_tokens > local_tokens) longer.push_back(k);
  }
  // A corrupt copy is deleted (and counted) by Take; the search goes on
  // without that key, so the loop ends.
  while (!longer.empty()) {
    PrefixKey k;
    if (!options_.remote->LongestHeld(longer, &k)) return std::nullopt;
    absl::StatusOr<CheckpointBlob> blob = options_.remote->Take(k);
    if (blob.ok()) return *std::move(blob);
    longer.erase(std::find(longer.begin(), longer.end(), k));
  }
  return std::nullopt;
}

int32_t CheckpointStore::FindOrPromoteLocked(absl::Span<const PrefixKey> candidates,
                                             std::optional<CheckpointBlob>* fetched,
                                             PrefixKey* key, StoreTier* tier) {
  int32_t best = -1;
  for (const PrefixKey& k : candidates) {
    auto it = index_.find(k);
    if (it == index_.end()) continue;
    if (best < 0 || k.num_tokens > key->num_tokens) {
      best = it->second;
      *key = k;
    }
  }
  StoreTier served = StoreTier::kDevice;
  // A corrupt lower-tier copy is deleted by Take; the search goes on without it.
  while (true) {
    CheckpointTier* from = nullptr;
    PrefixKey lower_key;
    int64_t longest = best >= 0 ? key->num_tokens : 0;  // keys have num_tokens >= 1
    for (const auto& t : lower_) {
      PrefixKey k;
      if (t != options_.remote && t->LongestHeld(candidates, &k) && k.num_tokens > longest) {
        from = t.get();
        lower_key = k;
        longest = k.num_tokens;
      }
    }
    // The remote tier was searched outside the lock (FetchRemote).
    const bool use_fetched = fetched->has_value() && (*fetched)->key.num_tokens > longest;
    if (use_fetched) {
      from = options_.remote.get();
      lower_key = (*fetched)->key;
    }
    if (from == nullptr) break;
    // A local tier hands over the packed bytes where it keeps them (the host
    // tier: pinned memory, one DMA copy into the arena); a remote blob was
    // fetched outside the lock. An arena entry is freed only then: its
    // eviction may demote into `from`, which no longer holds the checkpoint
    // being promoted. Bytes of the wrong size are corrupt: dropped.
    CheckpointBlob blob;
    int32_t e = -1;
    bool promoting = false, wrong_size = false;
    const int64_t want_bytes =
        options_.transcoder ? options_.transcoder->cold_slot_bytes() : view_.slot_bytes();
    const CheckpointTier::Promote promote = [&](const void* packed,
                                                int64_t bytes) -> absl::Status {
      promoting = true;
      if (bytes != want_bytes) {
        wrong_size = true;
        return absl::DataLossError(
            absl::StrCat("checkpoint of ", bytes, " bytes, expected ", want_bytes));
      }
      // Without a transcoder the packed bytes are the slot's: an evicted
      // entry takes them in while its own go out.
      int evicted = 0;
      bool refilled = false;
      e = TakeFreeEntryLocked(&evicted, options_.transcoder ? nullptr : packed, &refilled);
      if (e < 0) return absl::ResourceExhaustedError("checkpoints: every entry is pinned");
      if (refilled) return absl::OkStatus();
      return PromoteBytesLocked(
          absl::string_view(static_cast<const char*>(packed), static_cast<size_t>(bytes)), e);
    };
    absl::Status promoted;
    bool kept = false;  // `from` still holds the checkpoint (inclusive host tier)
    if (use_fetched) {
      blob = *std::move(*fetched);
      fetched->reset();
      promoted = promote(blob.packed.data(), static_cast<int64_t>(blob.packed.size()));
      if (promoted.ok()) blob.packed.clear();
    } else if (HostInclusive() && from == options_.host.get()) {
      std::vector<CheckpointBlob> evicted;
      promoted = from->CopyInto(lower_key, promote, &blob, &kept, &evicted);
      PassDownLocked(0, std::move(evicted));
    } else {
      promoted = from->TakeInto(lower_key, promote, &blob);
    }
    // Bytes of the wrong size are corrupt: a kept copy is dropped too.
    if (wrong_size && kept) (void)from->Take(lower_key);
    // Not held after all, or corrupt (deleted by the tier, or dropped here).
    if (!promoting || wrong_size) continue;
    if (promoted.ok()) {
      Entry& entry = entries_[e];
      entry.host_copy = kept;
      entry.state = EntryState::kReady;
      entry.key = lower_key;
      entry.refs = 1;
      entry.aux = std::move(blob.aux);
      entry.aux_bytes = 0;
      for (const std::string& a : entry.aux) entry.aux_bytes += static_cast<int64_t>(a.size());
      entry.remote_written = blob.remote_written;
      entry.indexed = true;
      lru_.push_front(e);
      entry.lru_pos = lru_.begin();
      index_[lower_key] = e;
      ++counters_.tiers[static_cast<int>(from->tier())].promotions;
      best = e;
      *key = lower_key;
      served = from->tier();
      break;
    }
    // Every arena entry is pinned (or the copy failed): the checkpoint stays
    // where it was and the longest arena hit, if any, is served.
    if (e >= 0) free_list_.push_back(e);
    if (from == options_.remote.get() || kept) {
      // The tier kept its copy: nothing to put back.
    } else {
      std::vector<CheckpointBlob> spilled;
      if (from->Put(std::move(blob), &spilled).ok()) {
        size_t i = 0;
        while (lower_[i].get() != from) ++i;
        for (CheckpointBlob& b : spilled) {
          if (i + 1 < lower_.size()) SpillLocked(i + 1, std::move(b));
        }
      }
    }
    best = -1;
    for (const PrefixKey& k : candidates) {
      auto it = index_.find(k);
      if (it != index_.end() && (best < 0 || k.num_tokens > key->num_tokens)) {
        best = it->second;
        *key = k;
      }
    }
    break;
  }
  // A fetched blob not promoted (a local copy as long, or every entry
  // pinned) is dropped: the remote tier kept its copy.
  fetched->reset();
  // Each lookup is a hit of the tier that served it and a miss of the others.
  auto& t = counters_.tiers;
  ++(best >= 0 && served == StoreTier::kDevice ? t[0].hits : t[0].misses);
  for (const auto& lower : lower_) {
    const int i = static_cast<int>(lower->tier());
    ++(best >= 0 && served == lower->tier() ? t[i].hits : t[i].misses);
  }
  if (best >= 0) *tier = served;
  return best;
}

absl::Status CheckpointStore::Copy(const PoolView& src, int32_t src_slot, const PoolView& dst,
                                   int32_t dst_slot) {
  if (src.slot_bytes() != dst.slot_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("slot_bytes: ", src.slot_bytes(), " != ",
                                                   dst.slot_bytes()));
  }
  if (src_slot < 0 || src_slot >= src.num_slots || dst_slot < 0 || dst_slot >= dst.num_slots) {
    return absl::InvalidArgumentError(absl::StrCat("slot: copy ", src_slot, " -> ", dst_slot,
                                                   " outside the pools (", src.num_slots, ", ",
                                                   dst.num_slots, " slots)"));
  }
  // One whole contiguous slot: a plain backend copy (no index upload, no
  // validation kernels; the store owns src_slot, the caller holds dst_slot).
  return backend_->CopyWithin(dst.slot(dst_slot), src.slot(src_slot), src.slot_bytes());
}

absl::StatusOr<CheckpointStore::PutResult> CheckpointStore::Put(const PrefixKey& key,
                                                                const PoolView& src,
                                                                int32_t src_slot,
                                                                std::vector<std::string> aux) {
  if (key.num_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("key.num_tokens: ", key.num_tokens, " must be >= 1"));
  }
  if (src.slot_bytes() != view_.slot_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("slot: slot_bytes ", src.slot_bytes(),
                                                   " differs from the store's ",
                                                   view_.slot_bytes()));
  }
  if (src_slot < 0 || src_slot >= src.num_slots) {
    return absl::InvalidArgumentError(absl::StrCat("slot: index ", src_slot, " out of range"));
  }
  FlushOnExit flush(this);  // destroyed after every lock below
  PutResult result;
  int32_t e;
  {
    absl::MutexLock lock(&mu_);
    SweepExpiredLocked(Now());
    e = TakeFreeEntryLocked(&result.evicted, /*refill=*/nullptr, /*refilled=*/nullptr);
    if (e < 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "checkpoints: all ", view_.num_slots,
          " checkpoints are leased or being copied; none can be evicted"));
    }
    Entry& entry = entries_[e];
    entry.state = EntryState::kWriting;
    entry.key = key;
    entry.refs = 1;
    entry.copies = 1;
  }
  absl::Status copied = Copy(src, src_slot, view_, e);
  // The write-through copy, from the caller's slot (held exclusively for the
  // call) and outside the lock: its bytes, or their cold-format encoding.
  std::optional<CheckpointBlob> through;
  if (copied.ok() && writer_ != nullptr) {
    int64_t aux_bytes = 0;
    for (const std::string& a : aux) aux_bytes += static_cast<int64_t>(a.size());
    const int64_t packed =
        options_.transcoder ? options_.transcoder->cold_slot_bytes() : view_.slot_bytes();
    if (writer_->Admit(packed + aux_bytes)) {  // full: dropped before copying
      CheckpointBlob blob;
      blob.key = key;
      absl::Status out;
      if (options_.transcoder) {
        absl::StatusOr<std::string> cold = options_.transcoder->ToCold(src, src_slot);
        out = cold.status();
        if (out.ok()) blob.packed = *std::move(cold);
      } else {
        blob.packed.resize(static_cast<size_t>(packed));
        out = backend_->CopyOut(&blob.packed[0], src.slot(src_slot), packed);
      }
      if (out.ok()) {
        blob.aux = aux;
        through = std::move(blob);
      }
    }
  }
  absl::MutexLock lock(&mu_);
  Entry& entry = entries_[e];
  entry.copies = 0;
  if (!copied.ok()) {
    UnrefLocked(e);
    return copied;
  }
  auto it = index_.find(key);
  if (it != index_.end()) UnindexLocked(it->second);
  entry.state = EntryState::kReady;
  entry.aux = std::move(aux);
  entry.aux_bytes = 0;
  for (const std::string& a : entry.aux) entry.aux_bytes += static_cast<int64_t>(a.size());
  entry.indexed = true;  // the writer's reference becomes the index reference
  lru_.push_front(e);
  entry.lru_pos = lru_.begin();
  index_[key] = e;
  ++counters_.snapshots;
  counters_.bytes_snapshotted += view_.slot_bytes();
  if (HostInclusive()) WriteToHostLocked(e);
  if (through.has_value()) {
    if (options_.transcoder) ++counters_.transcodes_to_cold;
    entry.remote_written = writer_->Enqueue(*std::move(through));
  }
  return result;
}

absl::StatusOr<CheckpointStore::LookupResult> CheckpointStore::Lookup(
    absl::Span<const PrefixKey> candidates, absl::Duration lease) {
  if (lease < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ms: must be >= 0");
  }
  if (lease == absl::ZeroDuration()) lease = options_.default_lease;
  if (lease > options_.max_lease) lease = options_.max_lease;
  LookupResult result;
  FlushOnExit flush(this);  // destroyed after `lock`
  std::optional<CheckpointBlob> fetched;
  if (options_.remote) {
    int64_t local_tokens = 0;
    {
      absl::MutexLock lock(&mu_);
      local_tokens = LocalLongestLocked(candidates);
    }
    fetched = FetchRemote(candidates, local_tokens);  // outside the lock
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  SweepExpiredLocked(now);
  for (const PrefixKey& key : candidates) {
    result.candidate_tokens = std::max(result.candidate_tokens, key.num_tokens);
  }
  const int32_t best = FindOrPromoteLocked(candidates, &fetched, &result.key, &result.tier);
  if (best < 0) {
    result.key = PrefixKey();
    ++counters_.lookups_miss;
    counters_.lookup_tokens_miss += result.candidate_tokens;
    return result;
  }
  result.hit = true;
  ++counters_.lookups_hit;
  counters_.lookup_tokens_hit += result.key.num_tokens;
  counters_.lookup_tokens_miss += result.candidate_tokens - result.key.num_tokens;
  do {
    result.lease_id = absl::Uniform<uint64_t>(bitgen_);
  } while (result.lease_id == 0 || leases_.contains(result.lease_id));
  result.lease_expiry = now + lease;
  leases_[result.lease_id] = Lease{best, result.key, result.lease_expiry};
  Entry& entry = entries_[best];
  ++entry.leases;
  ++entry.refs;
  TouchLocked(best);
  return result;
}

std::optional<CheckpointBlob> CheckpointStore::FetchRemoteForPin(const PrefixKey& key,
                                                                 uint64_t lease_id) {
  if (!options_.remote) return std::nullopt;
  int64_t local_tokens = 0;
  {
    absl::MutexLock lock(&mu_);
    SweepExpiredLocked(Now());
    if (lease_id != 0 && leases_.contains(lease_id)) return std::nullopt;
    local_tokens = LocalLongestLocked(absl::MakeConstSpan(&key, 1));
  }
  return FetchRemote(absl::MakeConstSpan(&key, 1), local_tokens);
}

absl::StatusOr<int32_t> CheckpointStore::PinForCopyLocked(const PrefixKey& key,
                                                          uint64_t lease_id,
                                                          std::optional<CheckpointBlob>* fetched,
                                                          bool* leased) {
  SweepExpiredLocked(Now());
  int32_t e = -1;
  *leased = false;
  if (lease_id != 0) {
    auto it = leases_.find(lease_id);
    if (it != leases_.end()) {
      fetched->reset();  // not needed after all (the remote tier kept its copy)
      if (it->second.key != key) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lease_id: the lease is for key ", it->second.key.DebugString(), ", not ",
            key.DebugString()));
      }
      e = it->second.entry;
      *leased = true;
    }
  }
  if (e < 0) {
    PrefixKey found;
    StoreTier tier = StoreTier::kDevice;
    e = FindOrPromoteLocked(absl::MakeConstSpan(&key, 1), fetched, &found, &tier);
    if (e < 0) {
      return absl::NotFoundError(absl::StrCat("key: no checkpoint for prefix ", key.DebugString(),
                                              lease_id != 0 ? " (lease unknown or expired)" : ""));
    }
  }
  Entry& entry = entries_[e];
  ++entry.refs;
  ++entry.copies;
  TouchLocked(e);
  return e;
}

absl::StatusOr<CheckpointStore::RestoreResult> CheckpointStore::Restore(const PrefixKey& key,
                                                                        uint64_t lease_id,
                                                                        const PoolView& dst,
                                                                        int32_t dst_slot) {
  if (dst.slot_bytes() != view_.slot_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("slot: slot_bytes ", dst.slot_bytes(),
                                                   " differs from the store's ",
                                                   view_.slot_bytes()));
  }
  if (dst_slot < 0 || dst_slot >= dst.num_slots) {
    return absl::InvalidArgumentError(absl::StrCat("slot: index ", dst_slot, " out of range"));
  }
  FlushOnExit flush(this);  // destroyed after every lock below
  RestoreResult result;
  int32_t e = -1;
  bool leased = false;
  std::optional<CheckpointBlob> fetched = FetchRemoteForPin(key, lease_id);
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(e, PinForCopyLocked(key, lease_id, &fetched, &leased));
    result.aux = entries_[e].aux;  // immutable once ready
    result.num_tokens = entries_[e].key.num_tokens;
  }
  absl::Status copied = Copy(view_, e, dst, dst_slot);
  absl::MutexLock lock(&mu_);
  --entries_[e].copies;
  if (copied.ok() && leased) {
    auto it = leases_.find(lease_id);
    if (it != leases_.end()) {  // may have expired during the copy
      leases_.erase(it);
      --entries_[e].leases;
      UnrefLocked(e);
    }
  }
  UnrefLocked(e);
  if (!copied.ok()) return copied;
  ++counters_.restores;
  counters_.bytes_restored += view_.slot_bytes();
  return result;
}

absl::Status CheckpointStore::Read(const PrefixKey& key, uint64_t lease_id,
                                   const ReadFn& read) {
  FlushOnExit flush(this);  // destroyed after every lock below
  int32_t e = -1;
  bool leased = false;
  std::optional<CheckpointBlob> fetched = FetchRemoteForPin(key, lease_id);
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(e, PinForCopyLocked(key, lease_id, &fetched, &leased));
  }
  absl::Status st = read(view_, e);
  absl::MutexLock lock(&mu_);
  --entries_[e].copies;
  UnrefLocked(e);
  return st;
}

CheckpointStore::LookupResult CheckpointStore::Peek(absl::Span<const PrefixKey> candidates) {
  LookupResult result;
  for (const PrefixKey& key : candidates) {
    result.candidate_tokens = std::max(result.candidate_tokens, key.num_tokens);
  }
  // A longer prefix held by a lower tier is what a Lookup would promote
  // (Peek moves nothing, so a corrupt lower copy can still be reported).
  auto consider = [&result](const CheckpointTier& t, absl::Span<const PrefixKey> candidates) {
    PrefixKey k;
    if (t.LongestHeld(candidates, &k) && (!result.hit || k.num_tokens > result.key.num_tokens)) {
      result.hit = true;
      result.key = k;
      result.tier = t.tier();
    }
  };
  {
    absl::MutexLock lock(&mu_);
    result.hit = LongestHeldIn(index_, candidates, &result.key);
    for (const auto& t : lower_) {
      if (t != options_.remote) consider(*t, candidates);
    }
  }
  if (options_.remote) consider(*options_.remote, candidates);  // outside the lock
  return result;
}

absl::Status CheckpointStore::ReleaseLease(uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  SweepExpiredLocked(Now());
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("lease_id: unknown or expired lease ", lease_id));
  }
  const int32_t e = it->second.entry;
  leases_.erase(it);
  --entries_[e].leases;
  UnrefLocked(e);
  return absl::OkStatus();
}

bool CheckpointStore::Contains(const PrefixKey& key) const {
  absl::MutexLock lock(&mu_);
  return index_.contains(key);
}

CheckpointStats CheckpointStore::stats() {
  absl::MutexLock lock(&mu_);
  SweepExpiredLocked(Now());
  CheckpointStats s = counters_;
  s.capacity = view_.num_slots;
  s.capacity_bytes = view_.num_slots * view_.slot_bytes();
  s.checkpoints = view_.num_slots - static_cast<int64_t>(free_list_.size());
  s.used_bytes = slot_tiers_.Times(s.checkpoints);
  s.aux_bytes = 0;
  s.leased = 0;
  for (const Entry& entry : entries_) {
    s.aux_bytes += entry.aux_bytes;
    if (entry.leases > 0) ++s.leased;
  }
  s.leases_active = static_cast<int64_t>(leases_.size());
  CheckpointTierStats& device = s.tiers[static_cast<int>(StoreTier::kDevice)];
  device.enabled = true;
  device.entries = s.checkpoints;
  device.bytes = s.checkpoints * view_.slot_bytes() + s.aux_bytes;
  device.capacity_bytes = s.capacity_bytes;
  for (const auto& tier : lower_) {
    const TierUse use = tier->use();
    CheckpointTierStats& t = s.tiers[static_cast<int>(tier->tier())];
    t.enabled = true;
    t.entries = use.entries;
    t.bytes = use.bytes;
    t.capacity_bytes = use.capacity_bytes;
    t.dropped_corrupt = use.dropped_corrupt;
    t.requests = use.requests;
    t.request_micros = use.request_micros;
    t.errors = use.errors;
    if (tier == lower_.back()) t.demotions = use.evictions;
  }
  if (writer_) {
    const RemoteWriterStats w = writer_->stats();
    CheckpointTierStats& t = s.tiers[static_cast<int>(StoreTier::kRemote)];
    t.write_through_written = w.written;
    t.write_through_dropped = w.dropped_full + w.dropped_shutdown;
    t.write_through_queued_bytes = w.queued_bytes;
  }
  return s;
}

}  // namespace statecache
