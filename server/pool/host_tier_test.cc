// HostTier memory: blocks in chunks of the backend's PinnedMemory, reused
// (no allocation per checkpoint), and the copy paths PutFromBackend /
// TakeInto of demotion and promotion.
#include "server/pool/host_tier.h"

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend/pinned_memory.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/prefix_key.h"
#include "server/pool/slot_pool.h"
#include "server/pool/testing/fake_backend.h"
#include "server/pool/testing/restore_check.h"
#include "server/pool/testing/test_keys.h"

namespace statecache {
namespace {

using ::testing::ElementsAre;

PrefixKey Key(int n) { return KeyOfRun(7, n); }

// Counts the allocations it passes on to the CPU backend's PinnedMemory.
class CountingPinned : public PinnedMemory {
 public:
  explicit CountingPinned(PinnedMemory* inner) : inner_(inner) {}
  absl::StatusOr<std::unique_ptr<BackendBuffer>> AllocatePinned(int64_t bytes) override {
    ++calls;
    total_bytes += bytes;
    return inner_->AllocatePinned(bytes);
  }
  bool page_locked() const override { return inner_->page_locked(); }
  int calls = 0;
  int64_t total_bytes = 0;

 private:
  PinnedMemory* inner_;
};

TEST(PinnedMemoryTest, CpuBackendHandsOutPlainAlignedMemory) {
  auto backend = CpuBackend::Create({});
  ASSERT_NE(backend->pinned_memory(), nullptr);
  EXPECT_FALSE(backend->pinned_memory()->page_locked());
  auto b = backend->pinned_memory()->AllocatePinned(1000);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->size(), 1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*b)->data()) % 256, 0u);
  std::memset((*b)->data(), 0xab, 1000);
  EXPECT_EQ(backend->pinned_memory()->AllocatePinned(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostTierMemoryTest, PutFromBackendAndTakeIntoCopyTheBytes) {
  auto backend = CpuBackend::Create({});
  CountingPinned pinned(backend->pinned_memory());
  HostTier host({/*capacity_bytes=*/1000, &pinned, /*chunk_bytes=*/1 << 20});
  auto src = backend->Allocate(300).value();
  const std::string bytes = PatternBytes(1, 300);
  std::memcpy(src->data(), bytes.data(), 300);
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE(host.PutFromBackend(Key(3), *backend, src->data(), 300, {"aux"}, &evicted,
                                  /*refill=*/nullptr)
                  .ok());
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(host.use().bytes, 303);
  EXPECT_EQ(pinned.calls, 1);
  // The budget allows ceil(1000 / 300) + 1 = 5 blocks; one chunk of 1 MiB
  // would hold more, so it is cut to 5 blocks of 512 (300 rounded to 256s).
  EXPECT_EQ(pinned.total_bytes, 5 * 512);
  EXPECT_EQ(host.PutFromBackend(Key(4), *backend, src->data(), 1001, {}, &evicted,
                               /*refill=*/nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);

  // Promotion that fails: the checkpoint comes back whole, out of the tier.
  CheckpointBlob blob;
  absl::Status st = host.TakeInto(
      Key(3),
      [&](const void* packed, int64_t n) {
        EXPECT_EQ(n, 300);
        EXPECT_EQ(std::memcmp(packed, bytes.data(), 300), 0);
        return absl::UnavailableError("copy failed");
      },
      &blob);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(blob.key, Key(3));
  EXPECT_EQ(blob.packed, bytes);
  EXPECT_THAT(blob.aux, ElementsAre("aux"));
  EXPECT_TRUE(host.KeysByRecency().empty());
  EXPECT_EQ(host.use().bytes, 0);
  ASSERT_TRUE(host.Put(blob, &evicted).ok());  // put back

  // Promotion into backend memory; the block is reused afterwards.
  auto dst = backend->Allocate(300).value();
  CheckpointBlob promoted;
  st = host.TakeInto(
      Key(3),
      [&](const void* packed, int64_t n) { return backend->CopyIn(dst->data(), packed, n); },
      &promoted);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(dst->data()), 300), bytes);
  EXPECT_TRUE(promoted.packed.empty());
  EXPECT_THAT(promoted.aux, ElementsAre("aux"));
  bool called = false;
  EXPECT_EQ(host.TakeInto(Key(3), [&](const void*, int64_t) {
                  called = true;
                  return absl::OkStatus();
                }, &promoted).code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(called);
  EXPECT_EQ(pinned.calls, 1);
}

TEST(HostTierMemoryTest, PutFromBackendWithRefillSwapsTheBytes) {
  auto backend = CpuBackend::Create({});
  HostTier host(1000);
  auto region = backend->Allocate(300).value();
  const std::string out = PatternBytes(1, 300), in = PatternBytes(2, 300);
  std::memcpy(region->data(), out.data(), 300);
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE(
      host.PutFromBackend(Key(3), *backend, region->data(), 300, {"aux"}, &evicted, in.data())
          .ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(region->data()), 300), in);
  absl::StatusOr<CheckpointBlob> held = host.Take(Key(3));
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->packed, out);
  EXPECT_THAT(held->aux, ElementsAre("aux"));
  // Over the budget: nothing stored, the region's bytes are the caller's to refill.
  EXPECT_EQ(host.PutFromBackend(Key(4), *backend, region->data(), 1001, {}, &evicted, in.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(host.KeysByRecency().empty());
}

TEST(HostTierMemoryTest, DemoteAndPromoteReuseChunksThroughTheStore) {
  auto backend = CpuBackend::Create({});
  ModelGeometry g{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};
  StateLayout layout = StateLayout::Identity(g, ParseFormatSpec("int8").value()).value();
  auto pool = SlotPool::Create(backend.get(), layout, 2).value();
  auto slots = pool->Allocate(2).value();
  auto access = pool->Acquire(slots, "slots").value();
  const int32_t a = access.indices()[0], b = access.indices()[1];
  const int64_t slot_bytes = pool->slot_bytes();
  CountingPinned pinned(backend->pinned_memory());
  // 3 checkpoints of budget, chunks of 2 blocks: 3 held plus the one a
  // promotion holds while the arena's entry is demoted need 2 chunks, however
  // many checkpoints pass through.
  auto host = std::make_shared<HostTier>(
      HostTier::Options{3 * (slot_bytes + 2), &pinned, 2 * ((slot_bytes + 255) / 256 * 256)});
  CheckpointStore::Options o;
  o.capacity = 1;
  o.host = host;
  auto store = CheckpointStore::Create(backend.get(), layout, o).value();
  for (int round = 0; round < 5; ++round) {
    for (int n = 1; n <= 4; ++n) {  // one in the arena, three in the host tier
      const std::string bytes = PatternBytes(100 * round + n, slot_bytes);
      std::memcpy(pool->view().slot(a), bytes.data(), bytes.size());
      ASSERT_TRUE(store->Put(Key(n), pool->view(), a, {"a" + std::to_string(n)}).ok());
    }
    for (int n : {2, 1, 3}) {
      ASSERT_EQ(ExpectRestores(*store, pool->view(), b, Key(n),
                               PatternBytes(100 * round + n, slot_bytes),
                               {"a" + std::to_string(n)}),
                StoreTier::kHost)
          << "round " << round << " prefix " << n;
    }
    ASSERT_TRUE(store->CheckInvariants().ok()) << store->CheckInvariants();
  }
  EXPECT_EQ(store->stats().tiers[static_cast<int>(StoreTier::kHost)].promotions, 15);
  EXPECT_LE(pinned.calls, 2);
  EXPECT_EQ(host->chunk_allocations(), pinned.calls);
  EXPECT_LE(host->reserved_bytes(), 4 * ((slot_bytes + 255) / 256 * 256));
}

// The inclusive host tier (CheckpointStore::Options::host_write_through):
// every Put copies out once, an eviction whose key the host tier holds copies
// nothing, and a promotion into a full arena is one copy in that keeps the
// host copy.
class InclusiveHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = SlotPool::Create(&backend_, layout_, 2).value();
    slots_ = pool_->Allocate(2).value();
    auto access = pool_->Acquire(slots_, "slots").value();
    a_ = access.indices()[0];
    b_ = access.indices()[1];
    slot_bytes_ = pool_->slot_bytes();
  }
  void TearDown() override {
    ASSERT_NE(store_, nullptr);
    EXPECT_TRUE(store_->CheckInvariants().ok()) << store_->CheckInvariants();
  }
  void MakeStore(int capacity, int host_blobs) {
    host_ = std::make_shared<HostTier>(host_blobs * (slot_bytes_ + 2));
    CheckpointStore::Options o;
    o.capacity = capacity;
    o.host = host_;
    o.host_write_through = true;
    store_ = CheckpointStore::Create(&backend_, layout_, o).value();
  }
  void Put(int n) {
    const std::string bytes = PatternBytes(n, slot_bytes_);
    std::memcpy(pool_->view().slot(a_), bytes.data(), bytes.size());
    ASSERT_TRUE(store_->Put(Key(n), pool_->view(), a_, {"a" + std::to_string(n)}).ok());
  }
  // Lookup + Restore of n into slot b: the tier, after checking bytes and aux.
  StoreTier Restores(int n) {
    return ExpectRestores(*store_, pool_->view(), b_, Key(n), PatternBytes(n, slot_bytes_),
                          {"a" + std::to_string(n)});
  }

  testing::FakeBackend backend_;
  StateLayout layout_ =
      StateLayout::Identity(ModelGeometry{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2,
                                          /*d_k=*/32, /*d_v=*/32},
                            ParseFormatSpec("int8").value())
          .value();
  std::unique_ptr<SlotPool> pool_;
  std::vector<SlotHandle> slots_;
  int32_t a_ = -1, b_ = -1;
  int64_t slot_bytes_ = 0;
  std::shared_ptr<HostTier> host_;
  std::unique_ptr<CheckpointStore> store_;
};

TEST_F(InclusiveHostTest, EvictionCopiesNothingAndPromotionKeepsTheHostCopy) {
  MakeStore(/*capacity=*/1, /*host_blobs=*/3);
  Put(1);
  EXPECT_EQ(backend_.bytes_out(), slot_bytes_);  // the snapshot's copy into the host tier
  EXPECT_THAT(host_->KeysByRecency(), ElementsAre(Key(1)));
  Put(2);  // evicts 1, which the host tier holds: no copy for it
  EXPECT_EQ(backend_.bytes_out(), 2 * slot_bytes_);
  EXPECT_FALSE(store_->Contains(Key(1)));
  EXPECT_THAT(host_->KeysByRecency(), ElementsAre(Key(2), Key(1)));

  const int64_t in_before = backend_.bytes_in(), out_before = backend_.bytes_out();
  EXPECT_EQ(Restores(1), StoreTier::kHost);  // into the full arena: 2 evicted, no copy out
  EXPECT_EQ(backend_.bytes_out() - out_before, 0);
  EXPECT_EQ(backend_.bytes_in() - in_before, slot_bytes_);  // one copy in
  EXPECT_TRUE(store_->Contains(Key(1)));
  EXPECT_THAT(host_->KeysByRecency(), ElementsAre(Key(1), Key(2)));  // 1 kept, most recent
  EXPECT_EQ(Restores(2), StoreTier::kHost);
  EXPECT_EQ(Restores(1), StoreTier::kHost);
  EXPECT_EQ(Restores(1), StoreTier::kDevice);
  EXPECT_EQ(backend_.bytes_out() - out_before, 0);
  const CheckpointStats s = store_->stats();
  EXPECT_EQ(s.tiers[static_cast<int>(StoreTier::kHost)].promotions, 3);
  EXPECT_EQ(s.tiers[static_cast<int>(StoreTier::kDevice)].demotions, 4);
  EXPECT_EQ(s.tiers[static_cast<int>(StoreTier::kHost)].entries, 2);
}

// A host copy the host tier dropped (its LRU, over budget) while the entry
// stayed in the arena: the entry's eviction copies it out as without the
// option; a snapshot replacing a key replaces its host copy too.
TEST_F(InclusiveHostTest, EvictionCopiesWhenTheHostTierDroppedItsCopy) {
  MakeStore(/*capacity=*/2, /*host_blobs=*/2);
  Put(1);
  Put(2);
  EXPECT_EQ(backend_.bytes_out(), 2 * slot_bytes_);
  EXPECT_EQ(Restores(1), StoreTier::kDevice);  // 1 most recent in the arena, not in the host
  Put(3);  // evicts 2 (held by the host tier: no copy); 3's copy drops the host's 1
  EXPECT_EQ(backend_.bytes_out(), 3 * slot_bytes_);
  EXPECT_THAT(host_->KeysByRecency(), ElementsAre(Key(3), Key(2)));
  EXPECT_TRUE(store_->Contains(Key(1)));
  Put(4);  // evicts 1, which the host no longer holds: copied out, then 4's copy
  EXPECT_EQ(backend_.bytes_out(), 5 * slot_bytes_);
  EXPECT_THAT(host_->KeysByRecency(), ElementsAre(Key(4), Key(1)));
  EXPECT_EQ(Restores(1), StoreTier::kHost);
  EXPECT_EQ(Restores(4), StoreTier::kDevice);

  const std::string newer = PatternBytes(77, slot_bytes_);
  std::memcpy(pool_->view().slot(a_), newer.data(), newer.size());
  ASSERT_TRUE(store_->Put(Key(4), pool_->view(), a_, {"a4"}).ok());
  absl::StatusOr<CheckpointBlob> held = host_->Take(Key(4));
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->packed, newer);
}

}  // namespace
}  // namespace statecache
