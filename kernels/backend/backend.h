// Backend: the one interface that hides CUDA vs CPU.
//
// A backend owns memory in its own space (device memory for CUDA, aligned
// host memory for CPU) and runs the state operations on packed pools:
// the fused decode update, prefill, pack / unpack of FP32 states, slot copies
// (snapshot / restore) and zeroing. Every pointer passed to a backend call
// points into that backend's memory space (use Allocate + CopyIn / CopyOut to
// stage host data). Calls are synchronous: when a call returns, its outputs
// are written (DecodeQueue, below, is the optional asynchronous decode path;
// stream_ops() the engines' stream-ordered, graph-capturable entry points).
// A backend is thread-safe and takes no backend-wide lock: concurrent calls
// on disjoint slots run concurrently; concurrent calls must not touch the
// same slots (the pool above guarantees that: its exclusive-slot rule is the
// only ordering between callers).
//
// Every compute call is a "binding" in the FlashInfer sense: it checks shapes,
// ranges and inputs and returns kInvalidArgument naming the field before
// anything is written.
//
//   ASSIGN_OR_RETURN(auto backend, CreateBackend("auto"));  // kernels/create_backend
//   ASSIGN_OR_RETURN(auto model, backend->Prepare(layout));
//   RETURN_IF_ERROR(backend->DecodeUpdate(*model, pool, layer, inputs));
#ifndef STATECACHE_KERNELS_BACKEND_BACKEND_H_
#define STATECACHE_KERNELS_BACKEND_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/backend/pool_view.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

// Element type of q, k, v inputs. g, beta are always FP32 (decay precision);
// outputs o are FP32.
enum class DType : uint8_t { kFp32 = 0, kBf16 = 1, kFp16 = 2 };
inline int DTypeSize(DType t) { return t == DType::kFp32 ? 4 : 2; }
const char* DTypeName(DType t);

// One decode step of one layer for a batch of slots. All pointers are in
// backend memory; tensors are dense, row-major.
struct DecodeInputs {
  int batch = 0;
  const int32_t* slots = nullptr;  // [batch]; -1 = skip (its o is zeroed)
  DType dtype = DType::kFp32;      // of q, k, v
  const void* q = nullptr;         // [batch, h_qk, d_k], natural key order
  const void* k = nullptr;         // [batch, h_qk, d_k]
  const void* v = nullptr;         // [batch, h_v, d_v]
  const float* g = nullptr;        // GDN [batch, h_v]; KDA [batch, h_v, d_k] (log decay <= 0)
  const float* beta = nullptr;     // [batch, h_v], in (0, 1)
  float* o = nullptr;              // [batch, h_v, d_v] output, value order
};

// T tokens of one layer for a batch of slots: the recurrence runs in FP32 from
// the stored state and the result is quantized once at the end.
struct PrefillInputs {
  int batch = 0;
  int tokens = 0;
  const int32_t* slots = nullptr;  // [batch]; -1 = skip
  DType dtype = DType::kFp32;
  const void* q = nullptr;         // [batch, tokens, h_qk, d_k]
  const void* k = nullptr;         // [batch, tokens, h_qk, d_k]
  const void* v = nullptr;         // [batch, tokens, h_v, d_v]
  const float* g = nullptr;        // [batch, tokens, h_v] or [batch, tokens, h_v, d_k]
  const float* beta = nullptr;     // [batch, tokens, h_v]
  float* o = nullptr;              // [batch, tokens, h_v, d_v] or nullptr (no readout)
};

// Backend-resident constants of one StateLayout (permutations, value maps).
class PreparedModel {
 public:
  virtual ~PreparedModel() = default;
  virtual const StateLayout& layout() const = 0;
};

// Memory owned by a backend; freed on destruction.
class BackendBuffer {
 public:
  virtual ~BackendBuffer() = default;
  virtual uint8_t* data() const = 0;
  virtual int64_t size() const = 0;
};

// Ordered asynchronous decode updates (optional; the CUDA backend has them):
// the host enqueues and returns at once, a callback reports each update's
// status once its device work completed. Work of one queue runs in enqueue
// order on the queue's own stream; different queues (and the backend's
// synchronous calls) run independently, so callers keep the exclusive-slot
// rule across them (hold the slots until `done`). One producer thread per
// queue. Additive to the synchronous interface (SubmitUpdates, issue 10).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<DecodeQueue> q, backend->NewDecodeQueue());
//   RETURN_IF_ERROR(q->EnqueueDecodeUpdate(model, pool, layer, in, /*prologue=*/nullptr,
//                                          /*epilogue=*/nullptr,
//                                          [](absl::Status s) { /* o written iff s.ok() */ }));
//   q->Drain();
class DecodeQueue {
 public:
  // Called on the completion thread, one at a time, in enqueue order; must
  // not call into the queue.
  using Done = std::function<void(absl::Status)>;
  // Enqueues caller work on the queue's native stream before the update's
  // validation (e.g. a device-side wait for the inputs). `abort_word` is 4
  // bytes of device memory the validation reads: a NaN float stored there
  // (bits 0x7fc00000, by device work such as a gate kernel) makes this
  // update and every later one of the queue write nothing and report
  // kAborted. Its error becomes the status (the update itself is then not
  // enqueued; the epilogue and the completion point are).
  using Prologue = std::function<absl::Status(void* native_stream, void* abort_word)>;
  // Enqueues caller work on the queue's native stream before the completion
  // point (e.g. raising a done word); its error becomes the status.
  using Epilogue = std::function<absl::Status(void* native_stream)>;

  // Drains (waits for every enqueued update and runs its callback).
  virtual ~DecodeQueue() = default;
  // CUDA: the queue's cudaStream_t (non-blocking) as void*. Work the caller
  // enqueues there between calls (e.g. cudaStreamWaitEvent) orders the
  // queue's later work after it.
  virtual void* native_stream() const = 0;
  // Host checks as DecodeUpdate: an error returns here, nothing is enqueued
  // and `done` is never called. Otherwise enqueues `prologue` (when set),
  // the device validation, the fused kernel (it writes nothing when
  // validation fails), `epilogue` (when set) and a completion point; `done`
  // then gets the status DecodeUpdate would have returned (kInvalidArgument
  // naming the field; o and the slots written iff OK), kAborted (see
  // Prologue), or the prologue's / epilogue's error.
  virtual absl::Status EnqueueDecodeUpdate(const PreparedModel& model, const PoolView& pool,
                                           int layer, const DecodeInputs& in,
                                           const Prologue& prologue, const Epilogue& epilogue,
                                           Done done) = 0;
  // `epilogue` and a completion point only: `done(OK or the epilogue's
  // error)` runs after everything enqueued before (a request that failed
  // before reaching the backend keeps its place in the order).
  virtual absl::Status EnqueueCompletion(const Epilogue& epilogue, Done done) = 0;
  // Blocks until every callback enqueued so far has run.
  virtual void Drain() = 0;
};

class StreamOps;     // kernels/backend/stream_ops.h
class Interprocess;  // kernels/backend/interprocess.h
class PinnedMemory;  // kernels/backend/pinned_memory.h

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda".
  virtual const char* name() const = 0;
  // One line: device name, memory, threads.
  virtual std::string Describe() const = 0;

  // Zero-filled memory of `bytes`, 256-byte aligned. kResourceExhausted when
  // the allocation fails.
  virtual absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(int64_t bytes) = 0;
  // Bytes the backend could still allocate (free device memory / host RAM).
  virtual absl::StatusOr<int64_t> AvailableBytes() const = 0;
  // True when backend memory is this process's ordinary host memory (the
  // CPU backend): compute calls then accept host pointers (aligned to their
  // element type) directly, without Allocate + CopyIn staging.
  virtual bool host_memory() const { return false; }
  // Host -> backend and backend -> host copies.
  virtual absl::Status CopyIn(void* backend_dst, const void* host_src, int64_t bytes) = 0;
  virtual absl::Status CopyOut(void* host_dst, const void* backend_src, int64_t bytes) = 0;
  // Backend -> backend copy of `bytes` between non-overlapping regions
  // (e.g. one whole slot into another: PoolView::slot pointers, no index
  // upload, no validation - the caller owns both regions). Returns once the
  // bytes are in place. This default goes through a host buffer (CopyOut +
  // CopyIn); the CPU backend copies in place, CUDA device to device.
  virtual absl::Status CopyWithin(void* backend_dst, const void* backend_src, int64_t bytes) {
    if (bytes < 0) return absl::InvalidArgumentError("bytes: negative");
    std::string host(static_cast<size_t>(bytes), '\0');
    absl::Status st = CopyOut(&host[0], backend_src, bytes);
    if (!st.ok()) return st;
    return CopyIn(backend_dst, host.data(), bytes);
  }

  // An eviction that makes room in place: `bytes` of backend_region are
  // copied to host_dst, then `bytes` of host_src replace them. Returns once
  // both are done; on an error backend_region's and host_dst's contents are
  // unspecified. host_dst and host_src must not overlap. This default runs
  // CopyOut then CopyIn; the CUDA backend overlaps the two directions in
  // chunks on two streams (PCIe is full duplex).
  virtual absl::Status CopyOutThenIn(void* host_dst, void* backend_region, const void* host_src,
                                     int64_t bytes) {
    if (bytes < 0) return absl::InvalidArgumentError("bytes: negative");
    absl::Status st = CopyOut(host_dst, backend_region, bytes);
    if (!st.ok()) return st;
    return CopyIn(backend_region, host_src, bytes);
  }

  // Uploads a layout's maps. The result stays valid while the backend lives.
  virtual absl::StatusOr<std::unique_ptr<PreparedModel>> Prepare(const StateLayout& layout) = 0;

  // The fused decode step (DESIGN.md section 2) for one layer: for each slot
  // in the batch, dequantize, update in FP32, write o from the FP32 state,
  // requantize in place. Slots not in the batch are untouched. Duplicate
  // slots in one batch are kInvalidArgument.
  virtual absl::Status DecodeUpdate(const PreparedModel& model, const PoolView& pool, int layer,
                                    const DecodeInputs& in) = 0;

  // DecodeUpdate with its staging copies in one call (the server's Update of
  // host tensors): `in_bytes` of `host_in` are copied to backend memory at
  // `staged` (where in's input pointers and slots point), the update runs,
  // then `o_bytes` of in.o are copied to `host_o`. Errors as DecodeUpdate
  // (nothing written to the pool; host_o's contents are then unspecified).
  // The CUDA backend does it on one stream with one host wait; this default
  // runs CopyIn, DecodeUpdate and CopyOut.
  virtual absl::Status DecodeUpdateStaged(const PreparedModel& model, const PoolView& pool,
                                          int layer, const DecodeInputs& in, void* staged,
                                          const void* host_in, int64_t in_bytes, void* host_o,
                                          int64_t o_bytes) {
    if (in_bytes > 0) {
      absl::Status st = CopyIn(staged, host_in, in_bytes);
      if (!st.ok()) return st;
    }
    absl::Status st = DecodeUpdate(model, pool, layer, in);
    if (!st.ok() || o_bytes == 0) return st;
    return CopyOut(host_o, in.o, o_bytes);
  }

  virtual absl::Status Prefill(const PreparedModel& model, const PoolView& pool, int layer,
                               const PrefillInputs& in) = 0;

  // FP32 states in natural order [n, layers, h_v, d_k, d_v] -> packed slots
  // (each slot fully overwritten), and back.
  virtual absl::Status PackStates(const PreparedModel& model, const PoolView& pool,
                                  const int32_t* slots, int n, const float* states) = 0;
  virtual absl::Status UnpackStates(const PreparedModel& model, const PoolView& pool,
                                    const int32_t* slots, int n, float* states) = 0;

  // Copies whole slots: dst.slot(dst_slots[i]) <- src.slot(src_slots[i]).
  // Pools must have equal slot_bytes. Used for snapshot and restore.
  virtual absl::Status CopySlots(const PoolView& src, const int32_t* src_slots,
                                 const PoolView& dst, const int32_t* dst_slots, int n) = 0;
  // Sets slots to the zero state (all-zero bytes decode to S = 0 in every format).
  virtual absl::Status ZeroSlots(const PoolView& pool, const int32_t* slots, int n) = 0;

  // A new DecodeQueue (above), or kUnimplemented: the default, for backends
  // whose calls are synchronous only (CPU).
  virtual absl::StatusOr<std::unique_ptr<DecodeQueue>> NewDecodeQueue() {
    return absl::UnimplementedError(
        absl::StrCat(name(), " backend: no asynchronous decode queue (calls are synchronous)"));
  }

  // The engines' stream-ordered entry points (kernels/backend/stream_ops.h),
  // owned by the backend and valid while it lives. Every backend has them.
  virtual StreamOps& stream_ops() = 0;

  // Optional capabilities: what only some backends offer. Callers ask
  // instead of testing name() or downcasting.
  //
  // Memory, events and words shared with another process on this machine
  // (kernels/backend/interprocess.h; the data plane of co-located workers),
  // owned by the backend and valid while it lives; nullptr when the backend
  // shares nothing (the default).
  virtual Interprocess* interprocess() { return nullptr; }
  // The backend stream (CUDA: a cudaStream_t as void*): work enqueued there
  // (an event wait) orders every later synchronous call after it. nullptr
  // (the default) for backends without streams, whose calls are ordered by
  // the calling thread alone.
  virtual void* native_stream() const { return nullptr; }
  // Host memory that CopyIn / CopyOut move at the host link's full speed
  // (kernels/backend/pinned_memory.h: page-locked on CUDA, plain on CPU),
  // owned by the backend and valid while it lives; nullptr (the default)
  // when the backend offers none: callers then use ordinary host memory.
  virtual PinnedMemory* pinned_memory() { return nullptr; }
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_BACKEND_BACKEND_H_
