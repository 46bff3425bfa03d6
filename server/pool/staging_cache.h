// StagingCache: reusable backend buffers for the per-call staging of request
// inputs and outputs (Update's q, k, v, g, beta, slot indices and o), and
// reusable host staging buffers (the backend's PinnedMemory: page-locked on
// CUDA; plain memory without one) that the host side of those copies is packed into.
//
// Backend::Allocate is expensive per call on CUDA (cudaMalloc, a zero fill
// and, when the buffer goes, cudaFree, which waits for the whole device), so
// the service takes staging memory from here instead: Get(bytes) hands out a
// buffer of at least `bytes` whose contents are undefined (not zeroed), and
// the buffer returns to the cache when the Lease ends; GetHost(bytes) the
// same for host staging memory. Buffers are kept per kind and power-of-two
// size class (at least 4 KiB), up to max_cached_bytes in all;
// beyond that a returned buffer is freed. Thread-safe; the backend must
// outlive the cache and every lease.
//
//   StagingCache cache(backend, /*max_cached_bytes=*/256 << 20);
//   ASSIGN_OR_RETURN(StagingCache::Lease buf, cache.Get(bytes));
//   RETURN_IF_ERROR(backend->CopyIn(buf.data(), host, bytes));
#ifndef STATECACHE_SERVER_POOL_STAGING_CACHE_H_
#define STATECACHE_SERVER_POOL_STAGING_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend/backend.h"

namespace statecache {

class StagingCache {
 public:
  // Exclusive use of one cached buffer; gives it back on destruction.
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : cache_(other.cache_), buffer_(std::move(other.buffer_)), host_(other.host_) {}
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    ~Lease();
    // Backend (Get) or host staging (GetHost) memory of at least the
    // requested bytes, 256-byte aligned.
    uint8_t* data() const { return buffer_->data(); }
    int64_t capacity() const { return buffer_->size(); }

   private:
    friend class StagingCache;
    Lease(StagingCache* cache, std::unique_ptr<BackendBuffer> buffer, bool host)
        : cache_(cache), buffer_(std::move(buffer)), host_(host) {}
    StagingCache* cache_;
    std::unique_ptr<BackendBuffer> buffer_;
    bool host_;
  };

  StagingCache(Backend* backend, int64_t max_cached_bytes)
      : backend_(backend), max_cached_bytes_(max_cached_bytes) {}
  StagingCache(const StagingCache&) = delete;
  StagingCache& operator=(const StagingCache&) = delete;

  // A buffer of at least max(bytes, 1) bytes; the backend's error
  // (kResourceExhausted) when a new one cannot be allocated.
  absl::StatusOr<Lease> Get(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // A host staging buffer of at least max(bytes, 1) bytes (contents
  // undefined); kResourceExhausted when a new one cannot be allocated.
  absl::StatusOr<Lease> GetHost(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes of the buffers waiting in the cache (both kinds); Allocate and
  // host staging allocations so far.
  int64_t cached_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t allocations() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static constexpr int kMinClassLog2 = 12;  // 4 KiB
  static constexpr int kClasses = 40;       // up to 2^51 bytes

  absl::StatusOr<Lease> Take(int64_t bytes, bool host) ABSL_LOCKS_EXCLUDED(mu_);
  void Put(std::unique_ptr<BackendBuffer> buffer, bool host) ABSL_LOCKS_EXCLUDED(mu_);

  Backend* const backend_;
  const int64_t max_cached_bytes_;
  mutable absl::Mutex mu_;
  // [0]: backend buffers, [1]: host staging buffers.
  std::vector<std::unique_ptr<BackendBuffer>> free_[2][kClasses] ABSL_GUARDED_BY(mu_);
  int64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t allocations_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_STAGING_CACHE_H_
