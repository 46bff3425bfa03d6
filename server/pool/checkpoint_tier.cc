#include "server/pool/checkpoint_tier.h"

#include <utility>

#include "kernels/backend/backend.h"

namespace statecache {

absl::Status CheckpointTier::PutFromBackend(const PrefixKey& key, Backend& backend, void* src,
                                            int64_t packed_bytes, std::vector<std::string> aux,
                                            std::vector<CheckpointBlob>* evicted,
                                            const void* refill) {
  CheckpointBlob blob;
  blob.key = key;
  blob.packed.resize(static_cast<size_t>(packed_bytes));
  absl::Status copied = backend.CopyOut(&blob.packed[0], src, packed_bytes);
  if (copied.ok() && refill != nullptr) copied = backend.CopyIn(src, refill, packed_bytes);
  if (!copied.ok()) return copied;
  blob.aux = std::move(aux);
  return Put(std::move(blob), evicted);
}

absl::Status CheckpointTier::TakeInto(const PrefixKey& key, const Promote& promote,
                                      CheckpointBlob* blob) {
  absl::StatusOr<CheckpointBlob> taken = Take(key);
  if (!taken.ok()) return taken.status();
  *blob = *std::move(taken);
  absl::Status promoted =
      promote(blob->packed.data(), static_cast<int64_t>(blob->packed.size()));
  if (promoted.ok()) blob->packed.clear();
  return promoted;
}

absl::Status CheckpointTier::CopyInto(const PrefixKey& key, const Promote& promote,
                                      CheckpointBlob* blob, bool* kept,
                                      std::vector<CheckpointBlob>* /*evicted*/) {
  *kept = false;
  return TakeInto(key, promote, blob);
}

}  // namespace statecache
