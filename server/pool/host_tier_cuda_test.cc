// The host tier on the CUDA backend: chunks of page-locked memory, and a
// checkpoint demoted to it (device -> pinned host) and promoted back
// (pinned host -> device) restores byte for byte. Skips without a GPU.
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend/pinned_memory.h"
#include "kernels/cuda/testing/gpu_backend.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/host_tier.h"
#include "server/pool/prefix_key.h"
#include "server/pool/slot_pool.h"
#include "server/pool/testing/test_keys.h"

namespace statecache {
namespace {

PrefixKey Key(int n) { return KeyOfRun(11, n); }

TEST(HostTierCudaTest, PinnedMemoryIsPageLocked) {
  STATECACHE_SKIP_WITHOUT_GPU();
  PinnedMemory* pinned = TestGpu()->pinned_memory();
  ASSERT_NE(pinned, nullptr);
  EXPECT_TRUE(pinned->page_locked());
  auto b = pinned->AllocatePinned(1 << 20);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*b)->data()) % 256, 0u);
  std::memset((*b)->data(), 0x5a, 1 << 20);  // host-writable
}

// Arbitrary bytes (not a valid packed state: only copies touch them).
TEST(HostTierCudaTest, DemoteThenPromoteRestoresIdenticalBytes) {
  STATECACHE_SKIP_WITHOUT_GPU();
  Backend* gpu = TestGpu().get();
  for (const char* format : {"damp:16", "fp32"}) {
    SCOPED_TRACE(format);
    ModelGeometry g{Arch::kGdn, /*layers=*/3, /*h_qk=*/2, /*h_v=*/4, /*d_k=*/128, /*d_v=*/128};
    StateLayout layout = StateLayout::Identity(g, ParseFormatSpec(format).value()).value();
    auto pool = SlotPool::Create(gpu, layout, 2).value();
    auto slots = pool->Allocate(2).value();
    auto access = pool->Acquire(slots, "slots").value();
    const int32_t a = access.indices()[0], b = access.indices()[1];
    const int64_t slot_bytes = pool->slot_bytes();
    const int64_t block = (slot_bytes + 255) / 256 * 256;
    auto host = std::make_shared<HostTier>(
        HostTier::Options{4 * slot_bytes, gpu->pinned_memory(), /*chunk_bytes=*/2 * block});
    CheckpointStore::Options o;
    o.capacity = 1;
    o.host = host;
    auto store = CheckpointStore::Create(gpu, layout, o).value();
    for (int n = 1; n <= 3; ++n) {  // 1 and 2 are demoted to the host tier
      const std::string bytes = PatternBytes(n, slot_bytes);
      ASSERT_TRUE(gpu->CopyIn(pool->view().slot(a), bytes.data(), slot_bytes).ok());
      ASSERT_TRUE(store->Put(Key(n), pool->view(), a, {"aux" + std::to_string(n)}).ok());
    }
    ASSERT_EQ(host->KeysByRecency().size(), 2u);
    // Each lookup promotes from the host tier and demotes the arena's entry.
    for (int n : {1, 3, 2, 1}) {
      auto hit = store->Lookup({Key(n)}, absl::ZeroDuration());
      ASSERT_TRUE(hit.ok() && hit->hit) << n;
      EXPECT_EQ(hit->tier, StoreTier::kHost) << n;
      ASSERT_TRUE(gpu->CopyIn(pool->view().slot(b), std::string(slot_bytes, '\0').data(),
                              slot_bytes)
                      .ok());
      auto restored = store->Restore(hit->key, hit->lease_id, pool->view(), b);
      ASSERT_TRUE(restored.ok()) << restored.status();
      ASSERT_EQ(restored->aux.size(), 1u);
      EXPECT_EQ(restored->aux[0], "aux" + std::to_string(n));
      std::string out(static_cast<size_t>(slot_bytes), '\0');
      ASSERT_TRUE(gpu->CopyOut(&out[0], pool->view().slot(b), slot_bytes).ok());
      EXPECT_TRUE(out == PatternBytes(n, slot_bytes)) << "prefix " << n << " differs after the tiers";
    }
    const CheckpointStats s = store->stats();
    EXPECT_EQ(s.tiers[static_cast<int>(StoreTier::kHost)].promotions, 4);
    EXPECT_EQ(s.tiers[static_cast<int>(StoreTier::kDevice)].demotions, 6);
    // 2 held + the one a promotion holds: 3 blocks in chunks of 2.
    EXPECT_EQ(host->chunk_allocations(), 2);
    EXPECT_TRUE(store->CheckInvariants().ok()) << store->CheckInvariants();
  }
}

}  // namespace
}  // namespace statecache
