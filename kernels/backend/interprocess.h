// Interprocess: the optional capability of a Backend (Backend::interprocess(),
// nullptr when a backend has none) that the data plane of co-located workers
// needs: memory that two processes on one machine both map, events that
// order their accesses to it, and words one side raises for the other.
//
// Two implementations, chosen by the backend that hands them out:
// - shared memory (kernels/shm; the CPU backend): POSIX shared-memory
//   objects in host memory. The messages themselves order the two
//   processes' accesses, so no events are used (uses_events() is false).
// - CUDA IPC (kernels/cuda_ipc; the CUDA backend): device allocations and
//   interprocess events exported as 64-byte handles; device work is
//   asynchronous, so accesses are ordered by events (uses_events() is true).
//
// Streams are the backend's native streams as void* (cudaStream_t; nullptr =
// the legacy default stream; ignored by shared memory). Thread-safe: objects
// may be used from any thread, one call per object at a time unless stated.
//
//   Interprocess* ipc = backend->interprocess();
//   ASSIGN_OR_RETURN(std::unique_ptr<InterprocessBuffer> b,
//                    ipc->Open(handle, bytes, /*unlink_name=*/true, "shm_name"));
//   RETURN_IF_ERROR(ipc->StoreWord(b->data() + offset, seq, stream));
#ifndef STATECACHE_KERNELS_BACKEND_INTERPROCESS_H_
#define STATECACHE_KERNELS_BACKEND_INTERPROCESS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace statecache {

class BackendBuffer;  // kernels/backend/backend.h

// Memory mapped in this process and another one: allocated here (Allocate:
// handle() names it for the other process) or opened from the other
// process's handle (Open). Unmapped / freed on destruction.
class InterprocessBuffer {
 public:
  virtual ~InterprocessBuffer() = default;
  virtual uint8_t* data() const = 0;
  virtual int64_t size() const = 0;
  // What the other process opens this buffer by (Interprocess::Open): the
  // shared-memory object's name or the 64-byte CUDA IPC memory handle.
  virtual const std::string& handle() const = 0;
  // Host <-> buffer copies of `bytes` at data() + offset (the caller checks
  // the range). Complete on return.
  virtual absl::Status Write(int64_t offset, const void* host, int64_t bytes) = 0;
  virtual absl::Status Read(int64_t offset, void* host, int64_t bytes) const = 0;
  // Removes the name other processes open an allocated buffer by (shared
  // memory: shm_unlink once the other side mapped it; mappings stay valid).
  // Idempotent; nothing for CUDA IPC and opened buffers.
  virtual void Unlink() {}
};

// An event shared between two processes (CUDA: an interprocess cudaEvent
// without timing). Destroyed (or closed) on destruction.
class InterprocessEvent {
 public:
  virtual ~InterprocessEvent() = default;
  // The 64-byte handle the other process opens it by (OpenEvent).
  virtual const std::string& handle() const = 0;
  // Records the event after the work enqueued on `stream` so far.
  virtual absl::Status Record(void* stream) = 0;
  // The host waits for the event's last record.
  virtual absl::Status Synchronize() = 0;
  // Later work on `stream` waits (on the device) for the event's last record.
  virtual absl::Status StreamWait(void* stream) = 0;
  // OK(true) once the last record completed, OK(false) while it has not.
  virtual absl::StatusOr<bool> Query() = 0;
};

// A device-side gate the host can always release: work enqueued on a stream
// after Enqueue(stream, value, ...) waits until the gate reaches `value`
// (cyclic 32-bit comparison, so 64-bit sequence numbers work across
// wrap-around) and, when the abort flag is set by then, stores a NaN float
// into `abort_word` (device memory, e.g. a DecodeQueue's abort word).
class StreamGate {
 public:
  virtual ~StreamGate() = default;
  virtual absl::Status Enqueue(void* stream, uint32_t value, void* abort_word) = 0;
  // Raises the gate to `value` (releases every Enqueue up to it). Any thread.
  virtual void Release(uint32_t value) = 0;
  // Sets the abort flag: gates released from now on abort their work.
  virtual void SetAbort() = 0;
};

class Interprocess {
 public:
  // Which wire fields carry handles (statecache.proto: shm_name vs
  // cuda_ipc_handle / cuda_ipc_event).
  enum class Transport { kSharedMemory, kCudaIpc };

  virtual ~Interprocess() = default;
  virtual Transport transport() const = 0;
  // True when the two processes' accesses are ordered by InterprocessEvents
  // (device memory, asynchronous work); false when each message orders them
  // (host memory: what was written before a message is visible after it).
  virtual bool uses_events() const = 0;
  // True when buffers are this process's ordinary host memory (readable by
  // the host without a copy).
  virtual bool host_accessible() const = 0;
  // Length of every memory and event handle in bytes (0: any length, e.g.
  // shared-memory names).
  virtual int handle_bytes() const = 0;

  // A zero-filled buffer of `bytes` exported to other processes (handle()).
  virtual absl::StatusOr<std::unique_ptr<InterprocessBuffer>> Allocate(int64_t bytes) = 0;
  // Maps the buffer the other process exported as `handle`, of `bytes`.
  // Shared memory: `unlink_name` removes the name once mapped. Errors name
  // `field` (kInvalidArgument for a bad handle, kNotFound for a missing
  // object).
  virtual absl::StatusOr<std::unique_ptr<InterprocessBuffer>> Open(const std::string& handle,
                                                                   int64_t bytes,
                                                                   bool unlink_name,
                                                                   absl::string_view field) = 0;
  // The handle another process opens `buffer` (an allocation of this
  // process's backend, e.g. a slot arena) by. kFailedPrecondition when it
  // was not allocated exportable (shared memory: not by
  // SharedArenaAllocator).
  virtual absl::StatusOr<std::string> Export(const BackendBuffer& buffer) = 0;

  // A new event to export (handle()), or the other process's event.
  virtual absl::StatusOr<std::unique_ptr<InterprocessEvent>> CreateEvent() = 0;
  // OpenEvent errors (kInvalidArgument) name `field`.
  virtual absl::StatusOr<std::unique_ptr<InterprocessEvent>> OpenEvent(
      const std::string& handle, absl::string_view field) = 0;
  // A StreamGate (above); kUnimplemented without device streams.
  virtual absl::StatusOr<std::unique_ptr<StreamGate>> NewGate() = 0;

  // Raises the 8-byte word at `word` (in a buffer, 8-aligned) to `value` (a
  // maximum: it never goes back) once everything enqueued on `stream` before
  // is visible to the other process; no host wait.
  virtual absl::Status StoreWord(void* word, uint64_t value, void* stream) = 0;
  // The same ordered after nothing (a private stream, waited for on the
  // host): releases the waiters of a word whose writer went away.
  virtual absl::Status ReleaseWord(void* word, uint64_t value) = 0;
  // Work enqueued on `stream` afterwards waits (on the device) until the
  // low 32 bits of the word at `word` reach `value` (cyclic comparison).
  // kUnimplemented without device streams (shared memory: the host waits).
  virtual absl::Status StreamWaitWord(void* stream, const void* word, uint32_t value) = 0;
  // Waits for all device work of this process (on any stream) to complete.
  virtual absl::Status SynchronizeDevice() = 0;
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_BACKEND_INTERPROCESS_H_
