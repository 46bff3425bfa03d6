// Test-only: a checkpoint's round trip through CheckpointStore::Lookup and
// Restore, checked with gtest expectations.
//
//   EXPECT_EQ(ExpectRestores(*store, view, /*slot=*/1, key, PatternBytes(3, n), {"aux"}),
//             StoreTier::kHost);
#ifndef STATECACHE_SERVER_POOL_TESTING_RESTORE_CHECK_H_
#define STATECACHE_SERVER_POOL_TESTING_RESTORE_CHECK_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/prefix_key.h"

namespace statecache {

// Zeroes slot `slot` of `view`, looks `key` up (no lease wait) and restores
// the hit into the slot; expects a hit, the slot's bytes equal to `want`, the
// restored aux equal to `want_aux` and, when want_tokens >= 0, its
// num_tokens equal to want_tokens. Returns the tier the hit came from
// (kDevice when there was no hit, after the failed expectation).
inline StoreTier ExpectRestores(CheckpointStore& store, const PoolView& view, int32_t slot,
                                const PrefixKey& key, const std::string& want,
                                const std::vector<std::string>& want_aux,
                                int64_t want_tokens = -1) {
  std::memset(view.slot(slot), 0, static_cast<size_t>(view.slot_bytes()));
  auto hit = store.Lookup({key}, absl::ZeroDuration());
  EXPECT_TRUE(hit.ok() && hit->hit) << "prefix of " << key.num_tokens << " tokens";
  if (!hit.ok() || !hit->hit) return StoreTier::kDevice;
  auto restored = store.Restore(hit->key, hit->lease_id, view, slot);
  EXPECT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(view.slot(slot)),
                        static_cast<size_t>(view.slot_bytes())),
            want)
      << "restored slot of the prefix of " << key.num_tokens << " tokens differs";
  if (restored.ok()) {
    EXPECT_THAT(restored->aux, ::testing::ElementsAreArray(want_aux));
    if (want_tokens >= 0) EXPECT_EQ(restored->num_tokens, want_tokens);
  }
  return hit->tier;
}

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_TESTING_RESTORE_CHECK_H_
