// The shared-memory implementation of the Interprocess capability
// (kernels/backend/interprocess.h), handed out by the CPU backend: POSIX
// shared-memory objects (shm_region.h) in host memory. The messages order
// the two processes' accesses, so it has no events, gates or stream waits
// (kUnimplemented); words are raised with a release CAS.
#ifndef STATECACHE_KERNELS_SHM_SHM_INTERPROCESS_H_
#define STATECACHE_KERNELS_SHM_SHM_INTERPROCESS_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/interprocess.h"

namespace statecache {

std::unique_ptr<Interprocess> NewSharedMemoryInterprocess();

// A slot-arena allocator in POSIX shared memory (host-memory backends only),
// for ModelRegistry::Options: its buffers are what
// NewSharedMemoryInterprocess()->Export accepts.
std::function<absl::StatusOr<std::unique_ptr<BackendBuffer>>(int64_t)> SharedArenaAllocator();

}  // namespace statecache

#endif  // STATECACHE_KERNELS_SHM_SHM_INTERPROCESS_H_
