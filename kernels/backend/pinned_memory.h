// PinnedMemory: the optional capability of a Backend (Backend::pinned_memory(),
// nullptr when a backend has none) that hands out host memory its CopyIn /
// CopyOut move at the full speed of the host link: page-locked memory on
// CUDA (cudaMallocHost: the copies are DMA transfers on a stream with no
// pageable bounce buffer), plain 256-byte-aligned memory on the CPU backend
// (whose memory is host memory: CopyIn / CopyOut are memcpy).
//
// For host-side stores of backend data (the checkpoint store's host tier):
// allocate large chunks once and reuse them; page-locking is slow (a
// cudaMallocHost costs about as much as the copy of its bytes) and takes
// memory the OS can no longer swap.
//
// Thread-safe. Buffers must be destroyed before the backend.
//
//   PinnedMemory* pinned = backend->pinned_memory();  // may be null
//   ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> chunk, pinned->AllocatePinned(256 << 20));
//   RETURN_IF_ERROR(backend->CopyIn(device_dst, chunk->data(), bytes));
#ifndef STATECACHE_KERNELS_BACKEND_PINNED_MEMORY_H_
#define STATECACHE_KERNELS_BACKEND_PINNED_MEMORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace statecache {

class BackendBuffer;  // kernels/backend/backend.h

class PinnedMemory {
 public:
  virtual ~PinnedMemory() = default;
  // Host memory of `bytes` (>= 0; 0 gives a 256-byte buffer), 256-byte
  // aligned, contents unspecified, freed when the buffer is destroyed.
  // kInvalidArgument for negative bytes; kResourceExhausted when the memory
  // cannot be allocated (or page-locked).
  virtual absl::StatusOr<std::unique_ptr<BackendBuffer>> AllocatePinned(int64_t bytes) = 0;
  // True when the memory is page-locked (CUDA), false for plain memory (CPU).
  virtual bool page_locked() const = 0;
};

// Plain host memory as PinnedMemory (page_locked() false): the CPU backend's
// capability, and what callers use when a backend has none.
class PlainHostMemory : public PinnedMemory {
 public:
  absl::StatusOr<std::unique_ptr<BackendBuffer>> AllocatePinned(int64_t bytes) override;
  bool page_locked() const override { return false; }
};

// `backend_pinned` when not null, else a process-wide PlainHostMemory.
PinnedMemory* PinnedOrPlain(PinnedMemory* backend_pinned);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_BACKEND_PINNED_MEMORY_H_
