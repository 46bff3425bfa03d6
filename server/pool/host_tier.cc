#include "server/pool/host_tier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

constexpr int64_t kAlign = 256;

int64_t RoundUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

int64_t HostTier::Held::bytes() const {
  int64_t n = packed_bytes;
  for (const std::string& a : aux) n += static_cast<int64_t>(a.size());
  return n;
}

absl::StatusOr<uint8_t*> HostTier::GetBlock(int64_t bytes) {
  if (bytes == 0) return nullptr;
  SizeClass& c = classes_[bytes];
  if (c.free.empty()) {
    const int64_t stride = RoundUp(bytes);
    // The budget's worth, plus the block a promotion holds while TakeInto's
    // callback demotes another checkpoint into the tier.
    const int64_t left = (options_.capacity_bytes + bytes - 1) / bytes + 1 - c.blocks;
    if (left < 1) {
      return absl::InternalError(absl::StrCat("host tier: all ", c.blocks, " blocks of ", bytes,
                                              " bytes are in use"));
    }
    const int64_t n = std::min(left, std::max<int64_t>(1, options_.chunk_bytes / stride));
    ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> chunk,
                     PinnedOrPlain(options_.memory)->AllocatePinned(n * stride));
    for (int64_t i = n - 1; i >= 0; --i) c.free.push_back(chunk->data() + i * stride);
    c.blocks += n;
    reserved_bytes_ += n * stride;
    chunks_.push_back(std::move(chunk));
  }
  uint8_t* block = c.free.back();
  c.free.pop_back();
  return block;
}

void HostTier::ReleaseBlock(uint8_t* block, int64_t bytes) {
  if (block != nullptr) classes_[bytes].free.push_back(block);
}

void HostTier::Insert(Held held) {
  bytes_ += held.bytes();
  const PrefixKey key = held.key;
  lru_.push_front(std::move(held));
  index_[key] = lru_.begin();
}

HostTier::Held HostTier::Remove(std::list<Held>::iterator it) {
  Held held = std::move(*it);
  index_.erase(held.key);
  lru_.erase(it);
  bytes_ -= held.bytes();
  return held;
}

CheckpointBlob HostTier::ToBlob(Held held) {
  CheckpointBlob blob;
  blob.key = std::move(held.key);
  blob.packed.assign(reinterpret_cast<const char*>(held.packed),
                     static_cast<size_t>(held.packed_bytes));
  blob.aux = std::move(held.aux);
  ReleaseBlock(held.packed, held.packed_bytes);
  return blob;
}

absl::StatusOr<uint8_t*> HostTier::Reserve(const PrefixKey& key, int64_t need,
                                           int64_t packed_bytes,
                                           std::vector<CheckpointBlob>* evicted) {
  if (need > options_.capacity_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("host tier: checkpoint of ", need,
                                                   " bytes exceeds the budget of ",
                                                   options_.capacity_bytes, " bytes"));
  }
  auto old = index_.find(key);
  if (old != index_.end()) {
    Held replaced = Remove(old->second);
    ReleaseBlock(replaced.packed, replaced.packed_bytes);
  }
  while (bytes_ + need > options_.capacity_bytes) {
    ++evictions_;
    evicted->push_back(ToBlob(Remove(std::prev(lru_.end()))));
  }
  return GetBlock(packed_bytes);
}

void HostTier::EvictOverBudget(std::vector<CheckpointBlob>* evicted) {
  while (bytes_ > options_.capacity_bytes && lru_.size() > 1) {
    ++evictions_;
    evicted->push_back(ToBlob(Remove(std::prev(lru_.end()))));
  }
}

absl::Status HostTier::Put(CheckpointBlob blob, std::vector<CheckpointBlob>* evicted) {
  Held held;
  held.packed_bytes = static_cast<int64_t>(blob.packed.size());
  ASSIGN_OR_RETURN(held.packed, Reserve(blob.key, blob.bytes(), held.packed_bytes, evicted));
  if (held.packed_bytes > 0) {
    std::memcpy(held.packed, blob.packed.data(), static_cast<size_t>(held.packed_bytes));
  }
  held.key = std::move(blob.key);
  held.aux = std::move(blob.aux);
  Insert(std::move(held));
  return absl::OkStatus();
}

absl::Status HostTier::PutFromBackend(const PrefixKey& key, Backend& backend, void* src,
                                      int64_t packed_bytes, std::vector<std::string> aux,
                                      std::vector<CheckpointBlob>* evicted, const void* refill) {
  Held held;
  held.key = key;
  held.packed_bytes = packed_bytes;
  held.aux = std::move(aux);
  ASSIGN_OR_RETURN(held.packed, Reserve(key, held.bytes(), packed_bytes, evicted));
  absl::Status copied = refill != nullptr
                            ? backend.CopyOutThenIn(held.packed, src, refill, packed_bytes)
                            : backend.CopyOut(held.packed, src, packed_bytes);
  if (!copied.ok()) {
    ReleaseBlock(held.packed, packed_bytes);
    return copied;
  }
  Insert(std::move(held));
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
  return ToBlob(Remove(it->second));
}

absl::Status HostTier::TakeInto(const PrefixKey& key, const Promote& promote,
                                CheckpointBlob* blob) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("host tier: no checkpoint ", key.DebugString()));
  }
  Held held = Remove(it->second);  // out of the tier: promote may re-enter it
  absl::Status promoted = promote(held.packed, held.packed_bytes);
  if (!promoted.ok()) {
    *blob = ToBlob(std::move(held));
    return promoted;
  }
  ReleaseBlock(held.packed, held.packed_bytes);
  blob->key = std::move(held.key);
  blob->packed.clear();
  blob->aux = std::move(held.aux);
  return absl::OkStatus();
}

absl::Status HostTier::CopyInto(const PrefixKey& key, const Promote& promote,
                                CheckpointBlob* blob, bool* kept,
                                std::vector<CheckpointBlob>* evicted) {
  *kept = false;
  auto it = index_.find(key);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("host tier: no checkpoint ", key.DebugString()));
  }
  Held held = Remove(it->second);  // out of reach of promote's evictions
  absl::Status promoted = promote(held.packed, held.packed_bytes);
  blob->key = held.key;
  blob->packed.clear();
  blob->aux = held.aux;
  // Back as the most recently used entry (a demotion during promote may have
  // put the tier at its budget without it).
  auto old = index_.find(held.key);
  if (old != index_.end()) {  // promote demoted a copy of the same key: ours is the one read
    Held replaced = Remove(old->second);
    ReleaseBlock(replaced.packed, replaced.packed_bytes);
  }
  Insert(std::move(held));
  EvictOverBudget(evicted);
  *kept = true;
  return promoted;
}

TierUse HostTier::use() const {
  TierUse u;
  u.entries = static_cast<int64_t>(lru_.size());
  u.bytes = bytes_;
  u.capacity_bytes = options_.capacity_bytes;
  u.evictions = evictions_;
  return u;
}

std::vector<PrefixKey> HostTier::KeysByRecency() const {
  std::vector<PrefixKey> keys;
  for (const Held& h : lru_) keys.push_back(h.key);
  return keys;
}

}  // namespace statecache
