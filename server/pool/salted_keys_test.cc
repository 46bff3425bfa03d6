// Salted prefix keys in one CheckpointStore shared by two tenants (the shape
// of a shared cold tier): the same wire key of every kind, salted for tenant
// B, never finds tenant A's checkpoint; Peek takes no lease and changes no
// counter; ReleaseLease unpins at once.
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/prefix_key.h"
#include "server/pool/slot_pool.h"
#include "server/pool/testing/fake_backend.h"

namespace statecache {
namespace {

StateLayout SmallLayout() {
  ModelGeometry g{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};
  return StateLayout::Identity(g, ParseFormatSpec("int8").value()).value();
}

class SaltedKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = SlotPool::Create(&backend_, layout_, 2).value();
    CheckpointStore::Options options;
    options.capacity = 4;
    store_ = CheckpointStore::Create(&backend_, layout_, options).value();
    slots_ = pool_->Allocate(1).value();
    slot_ = pool_->Acquire(slots_, "slots").value().indices()[0];
  }
  void TearDown() override {
    EXPECT_TRUE(store_->CheckInvariants().ok()) << store_->CheckInvariants();
  }

  testing::FakeBackend backend_;
  StateLayout layout_ = SmallLayout();
  std::unique_ptr<SlotPool> pool_;
  std::unique_ptr<CheckpointStore> store_;
  std::vector<SlotHandle> slots_;
  int32_t slot_ = -1;
};

TEST_F(SaltedKeysTest, AnotherTenantsSaltNeverHits) {
  PrefixKey engine;
  engine.kind = PrefixKeyKind::kEngine;
  engine.digest = "block";
  engine.num_tokens = 16;
  const std::vector<int32_t> tokens = {3, 1, 4};
  for (const PrefixKey& wire : {KeyOfTokens(tokens), Sha256KeyOfTokens(tokens), engine}) {
    ASSERT_TRUE(store_->Put(SaltKey("a", wire), pool_->view(), slot_, {}).ok());
    for (const char* other : {"b", "", "a "}) {
      const std::vector<PrefixKey> theirs = {SaltKey(other, wire)};
      EXPECT_FALSE(store_->Peek(theirs).hit) << other << " " << wire.DebugString();
      auto looked = store_->Lookup(theirs, absl::ZeroDuration());
      ASSERT_TRUE(looked.ok());
      EXPECT_FALSE(looked->hit) << other << " " << wire.DebugString();
      EXPECT_FALSE(store_->Contains(SaltKey(other, wire)));
    }
    EXPECT_FALSE(store_->Contains(wire));  // the unsalted wire key is not stored either
    EXPECT_TRUE(store_->Contains(SaltKey("a", wire)));
  }
  EXPECT_EQ(store_->stats().leases_active, 0);
}

TEST_F(SaltedKeysTest, PeekIsSideEffectFreeAndReleaseUnpins) {
  const PrefixKey k2 = SaltKey("", Sha256KeyOfTokens({1, 2}));
  const PrefixKey k3 = SaltKey("", Sha256KeyOfTokens({1, 2, 3}));
  ASSERT_TRUE(store_->Put(k2, pool_->view(), slot_, {}).ok());
  const CheckpointStats before = store_->stats();
  const CheckpointStore::LookupResult peek = store_->Peek({k2, k3});
  EXPECT_TRUE(peek.hit);
  EXPECT_EQ(peek.key, k2);
  EXPECT_EQ(peek.lease_id, 0u);
  EXPECT_EQ(peek.candidate_tokens, 3);
  const CheckpointStats after = store_->stats();
  EXPECT_EQ(after.leases_active, 0);
  EXPECT_EQ(after.lookups_hit, before.lookups_hit);
  EXPECT_EQ(after.lookups_miss, before.lookups_miss);
  EXPECT_EQ(after.lookup_tokens_hit, before.lookup_tokens_hit);
  EXPECT_FALSE(store_->Peek({k3}).hit);

  auto lease = store_->Lookup({k2}, absl::ZeroDuration());
  ASSERT_TRUE(lease.ok() && lease->hit);
  EXPECT_EQ(store_->stats().leases_active, 1);
  EXPECT_EQ(store_->stats().leased, 1);
  ASSERT_TRUE(store_->ReleaseLease(lease->lease_id).ok());
  const CheckpointStats released = store_->stats();
  EXPECT_EQ(released.leases_active, 0);
  EXPECT_EQ(released.leased, 0);
  EXPECT_EQ(released.leases_expired, 0);
  EXPECT_EQ(store_->ReleaseLease(lease->lease_id).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace statecache
