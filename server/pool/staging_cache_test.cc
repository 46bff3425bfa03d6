#include "server/pool/staging_cache.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/pool/testing/fake_backend.h"

namespace statecache {
namespace {

TEST(StagingCacheTest, ReusesBuffersOfTheSameSizeClass) {
  testing::FakeBackend backend;
  StagingCache cache(&backend, 1 << 20);
  uint8_t* first = nullptr;
  {
    absl::StatusOr<StagingCache::Lease> a = cache.Get(5000);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->capacity(), 8192);  // class of 5000 bytes: 8 KiB
    first = a->data();
  }
  EXPECT_EQ(cache.cached_bytes(), 8192);
  absl::StatusOr<StagingCache::Lease> b = cache.Get(8192);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), first);  // the same buffer came back
  EXPECT_EQ(cache.allocations(), 1);
  EXPECT_EQ(cache.cached_bytes(), 0);
  // Held leases are never handed out twice.
  absl::StatusOr<StagingCache::Lease> c = cache.Get(100);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->data(), b->data());
  EXPECT_EQ(c->capacity(), 4096);
  EXPECT_EQ(cache.allocations(), 2);
}

TEST(StagingCacheTest, HostStagingBuffersAreAKindOfTheirOwn) {
  testing::FakeBackend backend;
  StagingCache cache(&backend, 1 << 20);
  uint8_t* dev = nullptr;
  {
    absl::StatusOr<StagingCache::Lease> d = cache.Get(4096);
    ASSERT_TRUE(d.ok()) << d.status();
    dev = d->data();
  }
  uint8_t* host = nullptr;
  {
    absl::StatusOr<StagingCache::Lease> h = cache.GetHost(4096);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_NE(h->data(), dev);  // a cached backend buffer is never host staging
    EXPECT_EQ(h->capacity(), 4096);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(h->data()) % 256, 0u);
    host = h->data();
  }
  EXPECT_EQ(cache.allocations(), 2);
  EXPECT_EQ(backend.live_bytes(), 4096);  // host staging is not backend memory
  EXPECT_EQ(cache.cached_bytes(), 8192);
  absl::StatusOr<StagingCache::Lease> h2 = cache.GetHost(3000);
  absl::StatusOr<StagingCache::Lease> d2 = cache.Get(3000);
  ASSERT_TRUE(h2.ok() && d2.ok());
  EXPECT_EQ(h2->data(), host);
  EXPECT_EQ(d2->data(), dev);
  EXPECT_EQ(cache.allocations(), 2);
}

TEST(StagingCacheTest, FreesBuffersBeyondTheCap) {
  testing::FakeBackend backend;
  StagingCache cache(&backend, 8192);
  {
    absl::StatusOr<StagingCache::Lease> a = cache.Get(8192);
    absl::StatusOr<StagingCache::Lease> b = cache.Get(8192);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(backend.live_bytes(), 2 * 8192);
  }
  EXPECT_EQ(cache.cached_bytes(), 8192);  // one kept, one freed
  EXPECT_EQ(backend.live_bytes(), 8192);
}

TEST(StagingCacheTest, AllocationFailureIsReported) {
  testing::FakeBackend backend(/*memory_limit=*/4096);
  StagingCache cache(&backend, 1 << 20);
  absl::StatusOr<StagingCache::Lease> a = cache.Get(1 << 16);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(StagingCacheTest, ConcurrentLeasesAreDistinct) {
  testing::FakeBackend backend;
  StagingCache cache(&backend, 64 << 20);
  constexpr int kThreads = 8, kIters = 200;
  std::vector<std::thread> threads;
  std::vector<int> bad(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        absl::StatusOr<StagingCache::Lease> l = cache.Get(4096 * (1 + (i + t) % 3));
        if (!l.ok()) {
          ++bad[t];
          continue;
        }
        // Only this thread writes the leased bytes while it holds them.
        for (int64_t j = 0; j < 4096; ++j) l->data()[j] = static_cast<uint8_t>(t);
        for (int64_t j = 0; j < 4096; ++j) bad[t] += l->data()[j] != static_cast<uint8_t>(t);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
  EXPECT_LE(cache.allocations(), kThreads * 3);
}

}  // namespace
}  // namespace statecache
