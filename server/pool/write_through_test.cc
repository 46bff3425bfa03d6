// Write-through of snapshots to the remote tier (checkpoint_store.h,
// remote_writer.h): a checkpoint snapshotted on one store is restored on
// others sharing one redis-server while the first still holds it; a full
// queue drops (counted) without failing the snapshot; Redis down leaves
// snapshots and lookups unaffected; a demotion of a written-through
// checkpoint does not send its bytes again.
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/redis_tier.h"
#include "server/pool/remote_writer.h"
#include "server/pool/slot_pool.h"
#include "server/pool/testing/fake_backend.h"
#include "server/pool/testing/gated_remote.h"
#include "server/pool/testing/redis_server.h"
#include "server/pool/testing/test_keys.h"

namespace statecache {
namespace {

constexpr int kRemote = static_cast<int>(StoreTier::kRemote);

StateLayout SmallLayout() {
  ModelGeometry g{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};
  return StateLayout::Identity(g, ParseFormatSpec("int8").value()).value();
}

PrefixKey Key(int n) { return KeyOfRun(100, n); }

// One server's checkpoint store and slots on its own fake backend.
struct Instance {
  Instance(std::shared_ptr<CheckpointTier> remote, int capacity, bool write_through,
           int64_t queue_bytes = int64_t{1} << 30) {
    pool = SlotPool::Create(&backend, layout, 2).value();
    CheckpointStore::Options options;
    options.capacity = capacity;
    options.remote = std::move(remote);
    options.remote_write_through = write_through;
    options.remote_writer.max_queued_bytes = queue_bytes;
    options.remote_writer.drain_timeout = absl::Milliseconds(500);
    store = CheckpointStore::Create(&backend, layout, options).value();
    handles = pool->Allocate(2).value();
    auto access = pool->Acquire(handles, "slots").value();
    for (int32_t i : access.indices()) slot.push_back(i);
  }
  void Fill(int k, uint8_t value) { std::memset(pool->view().slot(slot[k]), value, slot_bytes()); }
  bool SlotIs(int k, uint8_t value) const {
    const uint8_t* p = pool->view().slot(slot[k]);
    for (int64_t i = 0; i < slot_bytes(); ++i) {
      if (p[i] != value) return false;
    }
    return true;
  }
  int64_t slot_bytes() const { return pool->slot_bytes(); }
  absl::Status Snapshot(int n, uint8_t value, std::vector<std::string> aux = {}) {
    Fill(0, value);
    return store->Put(Key(n), pool->view(), slot[0], std::move(aux)).status();
  }
  // Waits until `n` copies were handed to the remote tier (false after 5 s).
  bool WaitWritten(int64_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (store->stats().tiers[kRemote].write_through_written < n) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return true;
  }

  testing::FakeBackend backend;
  StateLayout layout = SmallLayout();
  std::unique_ptr<SlotPool> pool;
  std::unique_ptr<CheckpointStore> store;
  std::vector<SlotHandle> handles;
  std::vector<int32_t> slot;
};

std::shared_ptr<RedisTier> Redis(int port) {
  RedisTierOptions o;  // default timeouts
  o.port = port;
  o.ttl_s = 60;
  o.breaker_cooldown_ms = 200;
  auto t = RedisTier::Create("tags-share", o);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

TEST(WriteThroughTest, SnapshotOnAIsRestoredOnBAndCWithoutEviction) {
  RedisServer redis(FreeRedisPort());
  ASSERT_NO_FATAL_FAILURE(redis.Start());
  auto ra = Redis(redis.port()), rb = Redis(redis.port()), rc = Redis(redis.port());
  Instance a(ra, /*capacity=*/1, /*write_through=*/true);
  Instance b(rb, /*capacity=*/4, /*write_through=*/true);
  Instance c(rc, /*capacity=*/4, /*write_through=*/false);
  const std::vector<std::string> aux = {"conv-window", std::string("\0\1", 2)};
  ASSERT_TRUE(a.Snapshot(16, 0x5a, aux).ok());
  ASSERT_TRUE(a.WaitWritten(1));
  EXPECT_TRUE(a.store->Contains(Key(16)));  // A still holds it: nothing was evicted
  EXPECT_EQ(a.store->stats().evictions, 0);
  EXPECT_EQ(a.store->stats().tiers[kRemote].write_through_dropped, 0);
  // B finds it in Redis and restores A's exact bytes and aux.
  auto hit = b.store->Lookup({Key(8), Key(16), Key(24)}, absl::Seconds(5));
  ASSERT_TRUE(hit.ok()) << hit.status();
  ASSERT_TRUE(hit->hit);
  EXPECT_EQ(hit->key, Key(16));
  EXPECT_EQ(hit->tier, StoreTier::kRemote);
  b.Fill(1, 0);
  auto restored = b.store->Restore(hit->key, hit->lease_id, b.pool->view(), b.slot[1]);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(b.SlotIs(1, 0x5a));
  EXPECT_EQ(restored->aux, aux);
  EXPECT_EQ(restored->num_tokens, 16);
  // Not consumed: a third store hits it too.
  auto third = c.store->Lookup({Key(16)}, absl::Seconds(5));
  ASSERT_TRUE(third.ok() && third->hit);
  EXPECT_EQ(third->tier, StoreTier::kRemote);
  ASSERT_TRUE(c.store->Restore(Key(16), third->lease_id, c.pool->view(), c.slot[1]).ok());
  EXPECT_TRUE(c.SlotIs(1, 0x5a));
  // A evicts Key(16) (capacity 1): the demotion refreshes the copy written
  // through instead of sending its bytes again.
  ASSERT_TRUE(a.Snapshot(32, 0x6b).ok());
  EXPECT_EQ(a.store->stats().evictions, 1);
  EXPECT_EQ(ra->resends_skipped(), 1);
  ASSERT_TRUE(a.WaitWritten(2));
  EXPECT_EQ(ra->use().entries, 2);  // Key(16) and Key(32) SET once each
  EXPECT_EQ(ra->errors(), 0);
  EXPECT_EQ(rb->errors(), 0);
  EXPECT_TRUE(a.store->CheckInvariants().ok()) << a.store->CheckInvariants();
  EXPECT_TRUE(b.store->CheckInvariants().ok()) << b.store->CheckInvariants();
}

TEST(WriteThroughTest, FullQueueDropsAndCountsSnapshotStillSucceeds) {
  auto remote = std::make_shared<GatedRemote>();
  remote->Arm(GatedRemote::kPut);
  // Room for one queued copy (the checkpoint is slot_bytes, no aux).
  Instance probe(nullptr, 1, false);
  Instance s(remote, /*capacity=*/8, /*write_through=*/true,
             /*queue_bytes=*/probe.slot_bytes() * 3 / 2);
  ASSERT_TRUE(s.Snapshot(1, 1).ok());  // taken by the writer, blocked in Put
  ASSERT_TRUE(remote->WaitEntered(GatedRemote::kPut, std::chrono::seconds(5)));
  ASSERT_TRUE(s.Snapshot(2, 2).ok());  // queued
  ASSERT_TRUE(s.Snapshot(3, 3).ok());  // does not fit: dropped, the snapshot is fine
  CheckpointStats st = s.store->stats();
  EXPECT_EQ(st.snapshots, 3);
  EXPECT_EQ(st.tiers[kRemote].write_through_dropped, 1);
  EXPECT_EQ(st.tiers[kRemote].write_through_queued_bytes, s.slot_bytes());
  EXPECT_TRUE(s.store->Contains(Key(3)));
  remote->Release(GatedRemote::kPut);
  ASSERT_TRUE(s.WaitWritten(2));
  st = s.store->stats();
  EXPECT_EQ(st.tiers[kRemote].write_through_queued_bytes, 0);
  EXPECT_EQ(remote->puts(), 2);
  CheckpointBlob held;
  ASSERT_TRUE(remote->Held(Key(2), &held));
  EXPECT_EQ(held.packed, std::string(static_cast<size_t>(s.slot_bytes()), '\x02'));
  EXPECT_FALSE(remote->Held(Key(3), &held));
  // Key(3) was not written through: its demotion sends it unmarked.
  EXPECT_TRUE(s.store->CheckInvariants().ok()) << s.store->CheckInvariants();
}

TEST(WriteThroughTest, DemotionCarriesTheWrittenThroughMark) {
  auto remote = std::make_shared<GatedRemote>();
  Instance s(remote, /*capacity=*/1, /*write_through=*/true);
  ASSERT_TRUE(s.Snapshot(1, 1).ok());
  ASSERT_TRUE(s.WaitWritten(1));
  CheckpointBlob held;
  ASSERT_TRUE(remote->Held(Key(1), &held));
  EXPECT_FALSE(held.remote_written);  // the write-through itself sends the bytes
  ASSERT_TRUE(s.Snapshot(2, 2).ok());  // evicts Key(1) into the remote tier
  ASSERT_TRUE(remote->Held(Key(1), &held));
  EXPECT_TRUE(held.remote_written);  // RedisTier refreshes instead of resending
  EXPECT_EQ(held.packed, std::string(static_cast<size_t>(s.slot_bytes()), '\x01'));
}

TEST(WriteThroughTest, RedisDownLeavesSnapshotsAndLookupsUnaffected) {
  RedisServer redis(FreeRedisPort());
  ASSERT_NO_FATAL_FAILURE(redis.Start());
  auto remote = Redis(redis.port());
  redis.Stop();
  const auto start = std::chrono::steady_clock::now();
  {
    Instance s(remote, /*capacity=*/4, /*write_through=*/true);
    for (int i = 1; i <= 20; ++i) {
      ASSERT_TRUE(s.Snapshot(i, static_cast<uint8_t>(i)).ok()) << i;
      auto hit = s.store->Lookup({Key(i)}, absl::Seconds(5));
      ASSERT_TRUE(hit.ok()) << hit.status();
      ASSERT_TRUE(hit->hit) << i;
      EXPECT_EQ(hit->tier, StoreTier::kDevice);
      ASSERT_TRUE(s.store->Restore(Key(i), hit->lease_id, s.pool->view(), s.slot[1]).ok());
      EXPECT_TRUE(s.SlotIs(1, static_cast<uint8_t>(i)));
    }
    auto miss = s.store->Lookup({Key(1)}, absl::Seconds(5));  // evicted, Redis down: a miss
    ASSERT_TRUE(miss.ok());
    EXPECT_FALSE(miss->hit);
    EXPECT_EQ(s.store->stats().snapshots, 20);
    EXPECT_GE(remote->errors(), 1);
    EXPECT_TRUE(s.store->CheckInvariants().ok()) << s.store->CheckInvariants();
  }  // destruction drains or drops within its bound
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(RemoteWriterTest, DrainsOnDestructionAndDropsWhatIsLeftAfterTheBound) {
  auto remote = std::make_shared<GatedRemote>();
  RemoteWriterOptions o;
  o.max_queued_bytes = 1000;
  o.drain_timeout = absl::Milliseconds(100);
  CheckpointBlob b;
  b.packed = std::string(100, 'x');
  {
    RemoteWriter w(remote, o);
    for (int i = 1; i <= 3; ++i) {
      b.key = Key(i);
      ASSERT_TRUE(w.Enqueue(b));
    }
    ASSERT_TRUE(w.WaitIdle(absl::Seconds(5)));
    EXPECT_EQ(w.stats().written, 3);
    b.key = Key(4);
    b.packed = std::string(1001, 'y');
    EXPECT_FALSE(w.Admit(b.bytes()));
    EXPECT_FALSE(w.Enqueue(b));
    EXPECT_EQ(w.stats().dropped_full, 2);
  }
  EXPECT_EQ(remote->puts(), 3);
  // Blocked tier: destruction waits drain_timeout, drops the queue, then
  // joins after the write in flight.
  remote->Arm(GatedRemote::kPut);
  auto w = std::make_unique<RemoteWriter>(remote, o);
  b.packed = std::string(100, 'z');
  for (int i = 5; i <= 7; ++i) {
    b.key = Key(i);
    ASSERT_TRUE(w->Enqueue(b));
  }
  ASSERT_TRUE(remote->WaitEntered(GatedRemote::kPut, std::chrono::seconds(5)));
  EXPECT_FALSE(w->WaitIdle(absl::Milliseconds(50)));
  EXPECT_EQ(w->stats().queued, 2);
  const auto start = std::chrono::steady_clock::now();
  auto release = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    remote->Release(GatedRemote::kPut);
  });
  w.reset();
  const auto took = std::chrono::steady_clock::now() - start;
  release.get();
  EXPECT_GE(took, std::chrono::milliseconds(250));  // waited for the write in flight
  EXPECT_LT(took, std::chrono::seconds(3));
  EXPECT_EQ(remote->puts(), 4);  // the two queued ones were dropped
}

}  // namespace
}  // namespace statecache
