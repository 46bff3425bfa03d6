// Staging of small host arrays (slot indices) into backend memory.
//
// Backend calls take every pointer in the backend's memory space
// (kernels/backend/backend.h), slot index arrays included, so the pool and the
// service copy them in first.
//
//   ASSIGN_OR_RETURN(auto idx, StageInts(backend, indices));
//   RETURN_IF_ERROR(backend->ZeroSlots(view, StagedData<int32_t>(*idx), n));
#ifndef STATECACHE_SERVER_POOL_STAGING_H_
#define STATECACHE_SERVER_POOL_STAGING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend/backend.h"

namespace statecache {

// A backend buffer holding a copy of `values` (at least 4 bytes, so an empty
// span still yields a valid pointer).
absl::StatusOr<std::unique_ptr<BackendBuffer>> StageInts(Backend& backend,
                                                         absl::Span<const int32_t> values);

// A backend buffer holding `bytes` bytes copied from `host` (at least 16).
absl::StatusOr<std::unique_ptr<BackendBuffer>> StageBytes(Backend& backend, const void* host,
                                                          int64_t bytes);

template <typename T>
T* StagedData(const BackendBuffer& buffer) {
  return reinterpret_cast<T*>(buffer.data());
}

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_STAGING_H_
