#include "server/pool/staging_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/backend/pinned_memory.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

// The size class of `bytes`: the smallest c with 2^(kMin + c) >= bytes.
int ClassOf(int64_t bytes, int min_log2) {
  int c = 0;
  while ((int64_t{1} << (min_log2 + c)) < bytes) ++c;
  return c;
}

}  // namespace

StagingCache::Lease::~Lease() {
  if (buffer_ != nullptr) cache_->Put(std::move(buffer_), host_);
}

absl::StatusOr<StagingCache::Lease> StagingCache::Get(int64_t bytes) { return Take(bytes, false); }

absl::StatusOr<StagingCache::Lease> StagingCache::GetHost(int64_t bytes) {
  return Take(bytes, true);
}

absl::StatusOr<StagingCache::Lease> StagingCache::Take(int64_t bytes, bool host) {
  const int c = ClassOf(std::max<int64_t>(bytes, 1), kMinClassLog2);
  if (c >= kClasses) {
    return absl::ResourceExhaustedError(absl::StrCat("staging: ", bytes, " bytes is too large"));
  }
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::unique_ptr<BackendBuffer>>& list = free_[host][c];
    if (!list.empty()) {
      std::unique_ptr<BackendBuffer> b = std::move(list.back());
      list.pop_back();
      cached_bytes_ -= b->size();
      return Lease(this, std::move(b), host);
    }
    ++allocations_;
  }
  const int64_t size = int64_t{1} << (kMinClassLog2 + c);
  ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> b,
                   host ? PinnedOrPlain(backend_->pinned_memory())->AllocatePinned(size)
                        : backend_->Allocate(size));
  return Lease(this, std::move(b), host);
}

void StagingCache::Put(std::unique_ptr<BackendBuffer> buffer, bool host) {
  const int c = ClassOf(buffer->size(), kMinClassLog2);
  {
    absl::MutexLock lock(&mu_);
    if (cached_bytes_ + buffer->size() <= max_cached_bytes_) {
      cached_bytes_ += buffer->size();
      free_[host][c].push_back(std::move(buffer));
      return;
    }
  }
  buffer.reset();  // freed outside the lock
}

int64_t StagingCache::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_bytes_;
}

int64_t StagingCache::allocations() const {
  absl::MutexLock lock(&mu_);
  return allocations_;
}

}  // namespace statecache
