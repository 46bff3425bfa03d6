// Checkpoint tiers: demotion from the arena to host memory and disk, promotion
// back, LRU and budgets per tier, corrupt disk files, restart.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/disk_tier.h"
#include "server/pool/host_tier.h"
#include "server/pool/prefix_key.h"
#include "server/pool/slot_pool.h"
#include "server/pool/testing/restore_check.h"
#include "server/pool/testing/test_keys.h"

namespace statecache {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kDevice = static_cast<int>(StoreTier::kDevice);
constexpr int kHost = static_cast<int>(StoreTier::kHost);
constexpr int kDisk = static_cast<int>(StoreTier::kDisk);

StateLayout SmallLayout() {
  ModelGeometry g{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};
  return StateLayout::Identity(g, ParseFormatSpec("int8").value()).value();
}

PrefixKey Key(int n) { return KeyOfRun(100, n); }

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base != nullptr ? base : "/tmp") + "/" + name;
  std::string cmd = "rm -rf '" + dir + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

int CountFiles(const std::string& dir) {
  std::string cmd = "ls '" + dir + "' | grep -c '\\.ckpt$' > '" + dir + ".count'";
  (void)std::system(cmd.c_str());
  std::ifstream in(dir + ".count");
  int n = -1;
  in >> n;
  return n;
}

constexpr const char* kTags = "model=m format=int8 fingerprint=0123 geometry=gdn:2x1x2x32x32 rev=1";

class TiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = CpuBackend::Create(CpuBackend::Options{});
    pool_ = SlotPool::Create(backend_.get(), layout_, 4).value();
    slots_ = pool_->Allocate(2).value();
    auto access = pool_->Acquire(slots_, "slots").value();
    a_ = access.indices()[0];
    b_ = access.indices()[1];
    slot_bytes_ = pool_->slot_bytes();
    dir_ = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    if (store_ != nullptr) {
      EXPECT_TRUE(store_->CheckInvariants().ok()) << store_->CheckInvariants();
    }
    EXPECT_TRUE(pool_->CheckInvariants().ok()) << pool_->CheckInvariants();
  }

  // A store of `capacity` arena entries, a host tier of `host_blobs` blobs
  // (0: none) and a disk tier of `disk_blobs` blobs (0: none); aux of 4 bytes.
  void MakeStore(int capacity, int host_blobs, int disk_blobs, const std::string& tags = kTags) {
    store_.reset();
    CheckpointStore::Options o;
    o.capacity = capacity;
    o.clock = [this] { return now_; };
    if (host_blobs > 0) {
      host_ = std::make_shared<HostTier>(host_blobs * (slot_bytes_ + 4));
      o.host = host_;
    }
    if (disk_blobs > 0) {
      auto disk = DiskTier::Create(dir_, tags, disk_blobs * (slot_bytes_ + 4));
      ASSERT_TRUE(disk.ok()) << disk.status();
      disk_ = std::shared_ptr<DiskTier>(std::move(*disk));
      o.disk = disk_;
    }
    store_ = CheckpointStore::Create(backend_.get(), layout_, o).value();
  }

  void Put(int n) {
    const std::string bytes = PatternBytes(n, slot_bytes_);
    std::memcpy(pool_->view().slot(a_), bytes.data(), bytes.size());
    auto put = store_->Put(Key(n), pool_->view(), a_, {Aux(n)});
    ASSERT_TRUE(put.ok()) << put.status();
  }
  static std::string Aux(int n) { return "ax" + std::to_string(n + 10); }  // 4 bytes

  // Lookup + Restore into slot b; checks bytes, aux and tokens; returns the tier.
  StoreTier ExpectRestores(int n) {
    return statecache::ExpectRestores(*store_, pool_->view(), b_, Key(n),
                                      PatternBytes(n, slot_bytes_), {Aux(n)}, n);
  }

  bool Misses(int n) {
    auto hit = store_->Lookup({Key(n)}, absl::ZeroDuration());
    return hit.ok() && !hit->hit;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<Backend> backend_;
  StateLayout layout_ = SmallLayout();
  std::unique_ptr<SlotPool> pool_;
  std::vector<SlotHandle> slots_;
  int32_t a_ = -1, b_ = -1;
  int64_t slot_bytes_ = 0;
  std::string dir_;
  std::shared_ptr<HostTier> host_;
  std::shared_ptr<DiskTier> disk_;
  std::unique_ptr<CheckpointStore> store_;
};

TEST_F(TiersTest, WithoutLowerTiersEvictionDropsTheCheckpoint) {
  MakeStore(/*capacity=*/2, 0, 0);
  Put(1);
  Put(2);
  Put(3);
  EXPECT_TRUE(Misses(1));
  const CheckpointStats s = store_->stats();
  EXPECT_EQ(s.tiers[kDevice].demotions, 0);
  EXPECT_FALSE(s.tiers[kHost].enabled);
  EXPECT_FALSE(s.tiers[kDisk].enabled);
}

TEST_F(TiersTest, ArenaEvictionDemotesToHostAndRestorePromotesByteIdentical) {
  MakeStore(/*capacity=*/2, /*host_blobs=*/2, 0);
  Put(1);
  Put(2);
  Put(3);  // evicts 1 into the host tier
  EXPECT_FALSE(store_->Contains(Key(1)));
  EXPECT_THAT(host_->KeysByRecency(), ElementsAre(Key(1)));
  CheckpointStats s = store_->stats();
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.tiers[kDevice].demotions, 1);
  EXPECT_EQ(s.tiers[kHost].entries, 1);
  EXPECT_EQ(s.tiers[kHost].bytes, slot_bytes_ + 4);
  EXPECT_EQ(s.tiers[kHost].capacity_bytes, 2 * (slot_bytes_ + 4));

  EXPECT_EQ(ExpectRestores(1), StoreTier::kHost);  // promoted; 2 is demoted for it
  EXPECT_TRUE(store_->Contains(Key(1)));
  EXPECT_THAT(host_->KeysByRecency(), ElementsAre(Key(2)));
  EXPECT_EQ(ExpectRestores(1), StoreTier::kDevice);  // now in the arena
  EXPECT_EQ(ExpectRestores(3), StoreTier::kDevice);
  EXPECT_EQ(ExpectRestores(2), StoreTier::kHost);
  s = store_->stats();
  EXPECT_EQ(s.tiers[kHost].promotions, 2);
  EXPECT_EQ(s.tiers[kHost].hits, 2);
  EXPECT_EQ(s.tiers[kDevice].hits, 2);
  EXPECT_EQ(s.tiers[kDevice].misses, 2);  // the two host hits
  EXPECT_EQ(s.tiers[kHost].misses, 2);
  EXPECT_EQ(s.tiers[kDevice].demotions, 3);
  EXPECT_EQ(s.lookups_hit, 4);
}

TEST_F(TiersTest, HostLruSpillsToDiskAndDiskRestoresByteIdentical) {
  MakeStore(/*capacity=*/1, /*host_blobs=*/1, /*disk_blobs=*/2);
  for (int n = 1; n <= 4; ++n) Put(n);
  // arena: 4; host: 3; disk: 2 (newest), 1.
  EXPECT_TRUE(store_->Contains(Key(4)));
  EXPECT_THAT(host_->KeysByRecency(), ElementsAre(Key(3)));
  EXPECT_THAT(disk_->KeysByRecency(), ElementsAre(Key(2), Key(1)));
  EXPECT_EQ(CountFiles(dir_), 2);
  CheckpointStats s = store_->stats();
  EXPECT_EQ(s.tiers[kDevice].demotions, 3);
  EXPECT_EQ(s.tiers[kHost].demotions, 2);
  EXPECT_EQ(s.tiers[kDisk].bytes, 2 * (slot_bytes_ + 4));

  EXPECT_EQ(ExpectRestores(1), StoreTier::kDisk);
  // 1 came up from disk (its file is gone); 4 went down to host, 3 to disk.
  EXPECT_THAT(host_->KeysByRecency(), ElementsAre(Key(4)));
  EXPECT_THAT(disk_->KeysByRecency(), ElementsAre(Key(3), Key(2)));
  EXPECT_EQ(CountFiles(dir_), 2);
  Put(5);  // disk full: its LRU entry (2) is dropped
  EXPECT_THAT(disk_->KeysByRecency(), ElementsAre(Key(4), Key(3)));
  EXPECT_TRUE(Misses(2));
  s = store_->stats();
  EXPECT_EQ(s.tiers[kDisk].promotions, 1);
  EXPECT_EQ(s.tiers[kDisk].demotions, 1);  // dropped by the disk LRU
  EXPECT_LE(s.tiers[kDisk].bytes, s.tiers[kDisk].capacity_bytes);
  EXPECT_LE(s.tiers[kHost].bytes, s.tiers[kHost].capacity_bytes);
  EXPECT_EQ(ExpectRestores(3), StoreTier::kDisk);
  EXPECT_EQ(ExpectRestores(5), StoreTier::kHost);
}

TEST_F(TiersTest, LookupTakesTheLongestPrefixAcrossTiers) {
  MakeStore(/*capacity=*/1, /*host_blobs=*/1, /*disk_blobs=*/2);
  Put(7);
  Put(3);
  Put(2);  // arena: 2, host: 3, disk: 7
  auto hit = store_->Lookup({Key(2), Key(3), Key(7)}, absl::ZeroDuration()).value();
  ASSERT_TRUE(hit.hit);
  EXPECT_EQ(hit.key, Key(7));
  EXPECT_EQ(hit.tier, StoreTier::kDisk);
  // arena: 7 (leased); host: 2; disk: 3. The arena cannot take 3 while 7 is
  // leased, so only an arena entry could serve: a miss.
  EXPECT_FALSE(store_->Lookup({Key(2), Key(3)}, absl::ZeroDuration()).value().hit);
  ASSERT_TRUE(store_->ReleaseLease(hit.lease_id).ok());
  hit = store_->Lookup({Key(2), Key(3)}, absl::ZeroDuration()).value();
  ASSERT_TRUE(hit.hit);
  EXPECT_EQ(hit.key, Key(3));
  EXPECT_EQ(hit.tier, StoreTier::kDisk);
  ASSERT_TRUE(store_->ReleaseLease(hit.lease_id).ok());
  // arena: 3; host: 7; disk: 2.
  hit = store_->Lookup({Key(2), Key(7)}, absl::ZeroDuration()).value();
  ASSERT_TRUE(hit.hit);
  EXPECT_EQ(hit.key, Key(7));
  EXPECT_EQ(hit.tier, StoreTier::kHost);
}

TEST_F(TiersTest, LeasedEntriesAreNotDemotedAndPromotionWaitsForRoom) {
  MakeStore(/*capacity=*/1, /*host_blobs=*/2, 0);
  Put(1);
  Put(2);  // 1 -> host
  auto lease = store_->Lookup({Key(2)}, absl::Seconds(5)).value();
  ASSERT_TRUE(lease.hit);
  // The only arena entry is leased: 1 cannot be promoted and is not a hit.
  EXPECT_TRUE(Misses(1));
  EXPECT_THAT(host_->KeysByRecency(), ElementsAre(Key(1)));
  ASSERT_TRUE(store_->ReleaseLease(lease.lease_id).ok());
  EXPECT_EQ(ExpectRestores(1), StoreTier::kHost);
}

TEST_F(TiersTest, RestoreWithoutLeaseFindsLowerTiers) {
  MakeStore(/*capacity=*/1, /*host_blobs=*/1, 0);
  Put(1);
  Put(2);
  auto restored = store_->Restore(Key(1), 0, pool_->view(), b_);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(pool_->view().slot(b_)), slot_bytes_),
            PatternBytes(1, slot_bytes_));
  EXPECT_EQ(store_->stats().tiers[kHost].promotions, 1);
}

// Threads snapshot, look up and restore keys whose bytes are a function of the
// key, through a small arena, host and disk tier: every restore must return
// exactly the bytes of its key, and the refcounts and budgets must hold.
TEST_F(TiersTest, ConcurrentTrafficRestoresOnlyTheBytesOfTheKey) {
  constexpr int kThreads = 3, kKeys = 10, kOps = 150;
  pool_.reset();
  slots_.clear();
  pool_ = SlotPool::Create(backend_.get(), layout_, 2 * kThreads).value();
  MakeStore(/*capacity=*/2, /*host_blobs=*/2, /*disk_blobs=*/3);
  std::vector<SlotHandle> handles = pool_->Allocate(2 * kThreads).value();
  auto access = pool_->Acquire(handles, "slots").value();
  std::vector<int32_t> idx(access.indices().begin(), access.indices().end());
  std::atomic<int> wrong{0}, restored{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      const int32_t src = idx[2 * t], dst = idx[2 * t + 1];
      for (int op = 0; op < kOps; ++op) {
        const int n = 1 + static_cast<int>(rng() % kKeys);
        if (rng() % 2 == 0) {
          const std::string bytes = PatternBytes(n, slot_bytes_);
          std::memcpy(pool_->view().slot(src), bytes.data(), bytes.size());
          auto put = store_->Put(Key(n), pool_->view(), src, {Aux(n)});
          if (!put.ok() && put.status().code() != absl::StatusCode::kResourceExhausted) ++wrong;
          continue;
        }
        auto hit = store_->Lookup({Key(n)}, absl::ZeroDuration());
        if (!hit.ok()) {
          ++wrong;
          continue;
        }
        if (!hit->hit) continue;
        auto r = store_->Restore(hit->key, hit->lease_id, pool_->view(), dst);
        if (!r.ok()) {
          ++wrong;
          continue;
        }
        ++restored;
        const std::string got(reinterpret_cast<const char*>(pool_->view().slot(dst)), slot_bytes_);
        if (got != PatternBytes(n, slot_bytes_) || r->aux != std::vector<std::string>{Aux(n)}) ++wrong;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(restored.load(), 0);
  const CheckpointStats s = store_->stats();
  EXPECT_GT(s.tiers[kHost].promotions + s.tiers[kDisk].promotions, 0);
  EXPECT_EQ(s.leases_active, 0);
  EXPECT_TRUE(store_->CheckInvariants().ok()) << store_->CheckInvariants();
}

TEST(HostTierTest, LruOrderAndBudget) {
  HostTier host(/*capacity_bytes=*/20);
  auto blob = [](int n, int bytes) {
    CheckpointBlob b;
    b.key = Key(n);
    b.packed = std::string(bytes - 2, static_cast<char>(n));
    b.aux = {"xy"};
    return b;
  };
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE(host.Put(blob(1, 8), &evicted).ok());
  ASSERT_TRUE(host.Put(blob(2, 8), &evicted).ok());
  EXPECT_TRUE(evicted.empty());
  ASSERT_TRUE(host.Put(blob(3, 8), &evicted).ok());  // 24 > 20: evicts 1
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].key, Key(1));
  EXPECT_EQ(evicted[0].packed, std::string(6, 1));
  EXPECT_THAT(host.KeysByRecency(), ElementsAre(Key(3), Key(2)));
  EXPECT_EQ(host.use().bytes, 16);
  EXPECT_EQ(host.use().evictions, 1);
  ASSERT_TRUE(host.Put(blob(2, 12), &evicted).ok());  // replaces 2: 8 + 12 = 20 fits
  EXPECT_EQ(evicted.size(), 1u);
  EXPECT_THAT(host.KeysByRecency(), ElementsAre(Key(2), Key(3)));
  EXPECT_EQ(host.use().bytes, 20);
  EXPECT_EQ(host.Put(blob(4, 21), &evicted).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(host.use().bytes, 20);
  PrefixKey best;
  EXPECT_TRUE(host.LongestHeld({Key(1), Key(2), Key(3)}, &best));
  EXPECT_EQ(best, Key(3));
  auto taken = host.Take(Key(2));
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken->packed, std::string(10, 2));
  EXPECT_EQ(host.use().bytes, 8);
  EXPECT_EQ(host.Take(Key(2)).status().code(), absl::StatusCode::kNotFound);
}

class DiskTierTest : public TiersTest {
 protected:
  CheckpointBlob Blob(int n) {
    CheckpointBlob b;
    b.key = Key(n);
    b.packed = PatternBytes(n, 100);
    b.aux = {"a" + std::to_string(n), ""};
    return b;
  }
  std::unique_ptr<DiskTier> Open(int64_t capacity, const std::string& tags = kTags) {
    auto disk = DiskTier::Create(dir_, tags, capacity);
    EXPECT_TRUE(disk.ok()) << disk.status();
    return disk.ok() ? std::move(*disk) : nullptr;
  }
};

TEST_F(DiskTierTest, LruOrderBudgetAndRoundTrip) {
  auto disk = Open(/*capacity=*/2 * 102);
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE(disk->Put(Blob(1), &evicted).ok());
  ASSERT_TRUE(disk->Put(Blob(2), &evicted).ok());
  ASSERT_TRUE(disk->Put(Blob(3), &evicted).ok());
  EXPECT_TRUE(evicted.empty());  // the last tier drops what it evicts
  EXPECT_THAT(disk->KeysByRecency(), ElementsAre(Key(3), Key(2)));
  EXPECT_EQ(CountFiles(dir_), 2);
  EXPECT_EQ(disk->use().bytes, 2 * 102);
  EXPECT_EQ(disk->use().evictions, 1);
  auto blob = disk->Take(Key(2));
  ASSERT_TRUE(blob.ok()) << blob.status();
  EXPECT_EQ(blob->packed, PatternBytes(2, 100));
  EXPECT_THAT(blob->aux, ElementsAre("a2", ""));
  EXPECT_EQ(CountFiles(dir_), 1);
  EXPECT_EQ(disk->Put(CheckpointBlob{Key(9), std::string(300, 'x'), {}}, &evicted).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DiskTierTest, KeysDifferingOnlyInKindOrSaltKeepTheirOwnFiles) {
  // Stored keys are tenant-salted: the same tokens give the same FNV hash and
  // length under every tenant, told apart only by the salted digest.
  const PrefixKey a = SaltKey("tenant-a", Key(4));
  const PrefixKey b = SaltKey("tenant-b", Key(4));
  std::vector<int32_t> tokens = {100, 101, 102, 103};
  const PrefixKey sha = SaltKey("tenant-a", Sha256KeyOfTokens(tokens));
  ASSERT_EQ(a.hash, b.hash);
  ASSERT_EQ(a.num_tokens, b.num_tokens);
  ASSERT_NE(a, b);
  auto disk = Open(/*capacity=*/1 << 20);
  std::vector<CheckpointBlob> evicted;
  int seed = 40;
  for (const PrefixKey& k : {a, b, sha}) {
    ASSERT_TRUE(disk->Put(CheckpointBlob{k, PatternBytes(seed++, 100), {"x"}}, &evicted).ok());
  }
  EXPECT_EQ(CountFiles(dir_), 3);
  // The files' headers carry kind and digest: a re-index finds the same keys.
  disk.reset();
  disk = Open(/*capacity=*/1 << 20);
  EXPECT_THAT(disk->KeysByRecency(), ::testing::UnorderedElementsAre(a, b, sha));
  seed = 40;
  for (const PrefixKey& k : {a, b, sha}) {
    auto blob = disk->Take(k);
    ASSERT_TRUE(blob.ok()) << blob.status();
    EXPECT_EQ(blob->key, k);
    EXPECT_EQ(blob->packed, PatternBytes(seed++, 100));
  }
  EXPECT_EQ(CountFiles(dir_), 0);
}

void Truncate(const std::string& path, int64_t keep) { ASSERT_EQ(truncate(path.c_str(), keep), 0); }

void FlipByte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x01;
  f.seekp(offset);
  f.write(&c, 1);
}

TEST_F(TiersTest, TruncatedOrFlippedDiskFileIsAMissAndIsDeleted) {
  MakeStore(/*capacity=*/1, 0, /*disk_blobs=*/4);
  for (int n = 1; n <= 4; ++n) Put(n);  // arena: 4; disk: 3, 2, 1
  const std::string truncated = disk_->PathOf(Key(1));
  const std::string flipped = disk_->PathOf(Key(2));
  Truncate(truncated, 100);
  FlipByte(flipped, 200);  // inside the packed bytes
  std::memset(pool_->view().slot(b_), 0xee, slot_bytes_);
  EXPECT_TRUE(Misses(1));
  EXPECT_EQ(store_->Restore(Key(2), 0, pool_->view(), b_).status().code(),
            absl::StatusCode::kNotFound);
  // Nothing was written into the destination slot.
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(pool_->view().slot(b_)), slot_bytes_),
            std::string(slot_bytes_, '\xee'));
  EXPECT_NE(access(truncated.c_str(), F_OK), 0);
  EXPECT_NE(access(flipped.c_str(), F_OK), 0);
  CheckpointStats s = store_->stats();
  EXPECT_EQ(s.tiers[kDisk].dropped_corrupt, 2);
  EXPECT_EQ(s.tiers[kDisk].promotions, 0);
  EXPECT_EQ(s.tiers[kDisk].entries, 1);
  // A shorter intact prefix still serves a lookup whose longest one is corrupt.
  Put(5);  // 4 -> disk
  FlipByte(disk_->PathOf(Key(4)), 50);
  auto hit = store_->Lookup({Key(3), Key(4)}, absl::ZeroDuration()).value();
  ASSERT_TRUE(hit.hit);
  EXPECT_EQ(hit.key, Key(3));
  EXPECT_EQ(ExpectRestores(3), StoreTier::kDevice);
  EXPECT_EQ(store_->stats().tiers[kDisk].dropped_corrupt, 3);
}

TEST_F(TiersTest, RestartKeepsTheDiskTierButNotTheHostTier) {
  MakeStore(/*capacity=*/1, /*host_blobs=*/1, /*disk_blobs=*/2);
  for (int n = 1; n <= 4; ++n) Put(n);  // arena: 4; host: 3; disk: 2, 1
  // Restart: a fresh store (empty arena and host tier) over the same directory.
  host_.reset();
  disk_.reset();
  MakeStore(/*capacity=*/1, /*host_blobs=*/1, /*disk_blobs=*/2);
  EXPECT_THAT(disk_->KeysByRecency().size(), 2u);
  EXPECT_TRUE(Misses(4));  // was in the arena
  EXPECT_TRUE(Misses(3));  // was in host memory
  EXPECT_EQ(ExpectRestores(1), StoreTier::kDisk);
  EXPECT_EQ(ExpectRestores(2), StoreTier::kDisk);  // 1 is demoted to host for it
  EXPECT_EQ(ExpectRestores(1), StoreTier::kHost);
}

TEST_F(TiersTest, RestartWithOtherTagsDropsTheFiles) {
  MakeStore(/*capacity=*/1, 0, /*disk_blobs=*/2);
  Put(1);
  Put(2);  // disk: 1
  EXPECT_EQ(CountFiles(dir_), 1);
  disk_.reset();
  MakeStore(/*capacity=*/1, 0, /*disk_blobs=*/2, "model=m format=int4 fingerprint=0123");
  EXPECT_TRUE(Misses(1));
  EXPECT_EQ(CountFiles(dir_), 0);
  EXPECT_EQ(store_->stats().tiers[kDisk].dropped_corrupt, 1);
}

TEST_F(TiersTest, RestartReindexEnforcesASmallerBudgetAndDropsTruncatedFiles) {
  MakeStore(/*capacity=*/1, 0, /*disk_blobs=*/3);
  for (int n = 1; n <= 4; ++n) Put(n);  // disk: 3, 2, 1
  Truncate(disk_->PathOf(Key(2)), 10);
  disk_.reset();
  MakeStore(/*capacity=*/1, 0, /*disk_blobs=*/1);
  EXPECT_EQ(CountFiles(dir_), 1);
  EXPECT_EQ(disk_->use().bytes, slot_bytes_ + 4);
  EXPECT_TRUE(Misses(2));
}

}  // namespace
}  // namespace statecache
