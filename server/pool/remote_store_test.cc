// The checkpoint store with a remote tier: writes to it (demotions) run after
// the store's lock is released, and concurrent snapshots, lookups and
// restores against a real redis-server return the right bytes. Write-through
// (snapshots copied to the remote tier in the background) is in
// write_through_test.cc.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/redis_tier.h"
#include "server/pool/slot_pool.h"
#include "server/pool/testing/fake_backend.h"
#include "server/pool/testing/gated_remote.h"
#include "server/pool/testing/redis_server.h"
#include "server/pool/testing/test_keys.h"

namespace statecache {
namespace {

StateLayout SmallLayout() {
  ModelGeometry g{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};
  return StateLayout::Identity(g, ParseFormatSpec("int8").value()).value();
}

PrefixKey Key(int n) { return KeyOfRun(100, n); }

class RemoteStoreTest : public ::testing::Test {
 protected:
  void MakeStore(std::shared_ptr<CheckpointTier> remote, int capacity, int slots) {
    pool_ = SlotPool::Create(&backend_, layout_, slots).value();
    CheckpointStore::Options options;
    options.capacity = capacity;
    options.remote = std::move(remote);
    store_ = CheckpointStore::Create(&backend_, layout_, options).value();
    handles_ = pool_->Allocate(slots).value();
    auto access = pool_->Acquire(handles_, "slots").value();
    for (int32_t i : access.indices()) slot_.push_back(i);
  }
  void Fill(int32_t slot, uint8_t value) {
    std::memset(pool_->view().slot(slot), value, pool_->slot_bytes());
  }
  bool SlotIs(int32_t slot, uint8_t value) {
    const uint8_t* p = pool_->view().slot(slot);
    for (int64_t i = 0; i < pool_->slot_bytes(); ++i) {
      if (p[i] != value) return false;
    }
    return true;
  }

  testing::FakeBackend backend_;
  StateLayout layout_ = SmallLayout();
  std::unique_ptr<SlotPool> pool_;
  std::unique_ptr<CheckpointStore> store_;
  std::vector<SlotHandle> handles_;
  std::vector<int32_t> slot_;
};

TEST_F(RemoteStoreTest, RemoteWritesRunAfterTheLockIsReleased) {
  auto remote = std::make_shared<GatedRemote>();
  remote->Arm(GatedRemote::kPut);
  MakeStore(remote, /*capacity=*/1, /*slots=*/2);
  Fill(slot_[0], 1);
  ASSERT_TRUE(store_->Put(Key(1), pool_->view(), slot_[0], {}).ok());
  Fill(slot_[0], 2);
  // Key(1) is evicted to the remote tier, whose Put blocks.
  auto writer = std::async(std::launch::async, [&] {
    return store_->Put(Key(2), pool_->view(), slot_[0], {}).status();
  });
  ASSERT_TRUE(remote->WaitEntered(GatedRemote::kPut, std::chrono::seconds(5)));
  // The store's lock is free meanwhile: these calls need it.
  auto reader = std::async(std::launch::async, [&] {
    const bool has2 = store_->Contains(Key(2));
    auto hit = store_->Lookup({Key(1)}, absl::Seconds(1));  // in no tier yet: a miss
    return has2 && hit.ok() && !hit->hit && store_->stats().snapshots == 2;
  });
  const bool free = reader.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  // The writing call returns only after its remote write.
  EXPECT_NE(writer.wait_for(std::chrono::milliseconds(100)), std::future_status::ready);
  remote->Release(GatedRemote::kPut);
  ASSERT_TRUE(free) << "the store's lock was held during the remote write";
  EXPECT_TRUE(reader.get());
  ASSERT_TRUE(writer.get().ok());
  EXPECT_EQ(remote->use().entries, 1);
  // Promoted back from the remote tier with its bytes (Key(2) demoted in turn).
  auto restored = store_->Restore(Key(1), 0, pool_->view(), slot_[1]);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(SlotIs(slot_[1], 1));
  EXPECT_EQ(remote->use().entries, 1);
  EXPECT_TRUE(store_->CheckInvariants().ok()) << store_->CheckInvariants();
}

TEST_F(RemoteStoreTest, RemoteLookupsRunOutsideTheLock) {
  auto remote = std::make_shared<GatedRemote>();
  MakeStore(remote, /*capacity=*/1, /*slots=*/2);
  Fill(slot_[0], 1);
  ASSERT_TRUE(store_->Put(Key(1), pool_->view(), slot_[0], {}).ok());
  Fill(slot_[0], 2);
  ASSERT_TRUE(store_->Put(Key(2), pool_->view(), slot_[0], {}).ok());  // Key(1) -> remote
  ASSERT_EQ(remote->use().entries, 1);
  // Key(2) is local and longer than Key(1): served from the device tier.
  auto local = store_->Lookup({Key(1), Key(2)}, absl::Seconds(5));
  ASSERT_TRUE(local.ok() && local->hit);
  EXPECT_EQ(local->key, Key(2));
  EXPECT_EQ(local->tier, StoreTier::kDevice);
  ASSERT_TRUE(store_->ReleaseLease(local->lease_id).ok());
  // Key(1) only in the remote tier: the store asks it without its lock.
  remote->Arm(GatedRemote::kLongestHeld);
  auto lookup =
      std::async(std::launch::async, [&] { return store_->Lookup({Key(1)}, absl::Seconds(5)); });
  ASSERT_TRUE(remote->WaitEntered(GatedRemote::kLongestHeld, std::chrono::seconds(5)));
  auto other = std::async(std::launch::async, [&] {
    Fill(slot_[1], 3);
    return store_->Put(Key(3), pool_->view(), slot_[1], {}).ok() && store_->Contains(Key(3));
  });
  const bool free = other.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  remote->Release(GatedRemote::kLongestHeld);
  ASSERT_TRUE(free) << "the store's lock was held during the remote lookup";
  EXPECT_TRUE(other.get());
  // Taken outside the lock, promoted under it, with its bytes.
  auto hit = lookup.get();
  ASSERT_TRUE(hit.ok()) << hit.status();
  ASSERT_TRUE(hit->hit);
  EXPECT_EQ(hit->key, Key(1));
  EXPECT_EQ(hit->tier, StoreTier::kRemote);
  auto restored = store_->Restore(Key(1), hit->lease_id, pool_->view(), slot_[1]);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(SlotIs(slot_[1], 1));
  // Key(2) and Key(3) were demoted to the remote tier on the way.
  EXPECT_EQ(remote->use().entries, 2);
  EXPECT_TRUE(store_->CheckInvariants().ok()) << store_->CheckInvariants();
}

TEST_F(RemoteStoreTest, ConcurrentSnapshotsLookupsRestoresThroughRedis) {
  RedisServer redis(FreeRedisPort());
  ASSERT_NO_FATAL_FAILURE(redis.Start());
  RedisTierOptions o;
  o.port = redis.port();
  o.timeout_ms = 1000;
  auto tier = RedisTier::Create("tags-store", o);
  ASSERT_TRUE(tier.ok()) << tier.status();
  std::shared_ptr<RedisTier> remote = std::move(*tier);
  constexpr int kThreads = 4, kSteps = 30;
  // Each thread pins at most two entries (a snapshot being written, a lease
  // or a restore): one more and a Put never finds every entry pinned.
  MakeStore(remote, /*capacity=*/2 * kThreads + 1, /*slots=*/2 * kThreads);
  // Thread t snapshots Key(1000 t + i) holding value t * kSteps + i + 1 from
  // its slot 2t, then restores an earlier one of its own into slot 2t + 1.
  std::vector<std::thread> threads;
  std::vector<int> wrong(kThreads, 0), failed(kThreads, 0), restores(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int32_t src = slot_[2 * t], dst = slot_[2 * t + 1];
      for (int i = 0; i < kSteps; ++i) {
        const uint8_t value = static_cast<uint8_t>(t * kSteps + i + 1);
        Fill(src, value);
        if (!store_->Put(Key(1000 * t + i + 1), pool_->view(), src, {}).ok()) ++failed[t];
        const int back = i / 2;
        auto hit = store_->Lookup({Key(1000 * t + back + 1)}, absl::Seconds(5));
        if (!hit.ok()) {
          ++failed[t];
          continue;
        }
        if (!hit->hit) continue;  // in flight to Redis, or pinned out: a miss is allowed
        auto r = store_->Restore(hit->key, hit->lease_id, pool_->view(), dst);
        if (!r.ok()) {
          ++failed[t];
          continue;
        }
        ++restores[t];
        if (!SlotIs(dst, static_cast<uint8_t>(t * kSteps + back + 1))) ++wrong[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  int total_restores = 0;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(wrong[t], 0) << "thread " << t;
    EXPECT_EQ(failed[t], 0) << "thread " << t;
    total_restores += restores[t];
  }
  EXPECT_GT(total_restores, kThreads * kSteps / 2);
  const CheckpointStats s = store_->stats();
  EXPECT_GT(s.tiers[static_cast<int>(StoreTier::kRemote)].promotions, 0);
  EXPECT_EQ(s.tiers[static_cast<int>(StoreTier::kRemote)].errors, 0);
  EXPECT_TRUE(store_->CheckInvariants().ok()) << store_->CheckInvariants();
}

}  // namespace
}  // namespace statecache
