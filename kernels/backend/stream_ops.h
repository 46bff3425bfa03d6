// StreamOps: the engines' entry points into a backend (issue 25): every call
// is enqueued on the caller's stream and never waits for the host, so an
// engine's decode step can run them back to back and capture them in a CUDA
// graph (replayed with new contents in the same input and index buffers).
//
// Contract shared by every backend:
// - Host-checkable mistakes (null pointers, negative sizes, an unknown dtype,
//   a layer out of range, a pool that does not match the model, a record too
//   small for the pool) return kInvalidArgument at once and enqueue nothing.
// - Everything that lives in the caller's buffers (slot indices, input
//   values) is validated where the data is (CUDA: one validation kernel per
//   call, ahead of the op's kernel). A call that fails validation writes
//   nothing (no slot, no output) and leaves every other slot untouched; its
//   error goes into the caller's OpRecord. The record keeps the first failed
//   call (op, layer, field, index, slot value) and counts failed calls until
//   CheckRecord reads it.
// - Slot indices are int32 in backend memory; -1 is padding (decode / prefill:
//   its o is zeroed, unpack: its states are zeroed, pack / copy: skipped).
// - One record serves one stream at a time: calls that share a record must be
//   ordered (the same stream, or streams ordered by events). Calls on
//   disjoint slots may run concurrently on different streams with different
//   records; calls that touch the same slot must be ordered by the caller.
// - CUDA: `stream` is a cudaStream_t as void* (nullptr = legacy default
//   stream). CPU: calls run synchronously on the calling thread and `stream`
//   is ignored; the record semantics are the same.
//
//   StreamOps* ops = backend->stream_ops();
//   OpRecord rec{record_memory, ops->RecordBytes(pool.num_slots)};
//   RETURN_IF_ERROR(ops->InitRecord(rec, stream));
//   RETURN_IF_ERROR(ops->EnqueueDecode(model, pool, layer, in, rec, stream));  // per layer
//   RETURN_IF_ERROR(ops->CheckRecord(rec, stream, /*reset=*/true));   // when the engine chooses
#ifndef STATECACHE_KERNELS_BACKEND_STREAM_OPS_H_
#define STATECACHE_KERNELS_BACKEND_STREAM_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/pool_view.h"

namespace statecache {

// Caller-owned memory of an error record, in the backend's memory space
// (device memory on CUDA, host memory on the CPU), at least
// StreamOps::RecordBytes(pool.num_slots) bytes, 16-byte aligned, written
// only by the backend's calls.
struct OpRecord {
  void* data = nullptr;
  int64_t bytes = 0;
};

// The op a record entry names.
enum class StreamOp : int32_t {
  kNone = 0,
  kDecode = 1,
  kPrefill = 2,
  kPack = 3,
  kUnpack = 4,
  kCopySlots = 5,
};
const char* StreamOpName(StreamOp op);

class StreamOps {
 public:
  virtual ~StreamOps() = default;

  // Bytes of a record for pools of up to `num_slots` slots (it holds a slot
  // bitmap on CUDA). Monotonic in num_slots.
  virtual int64_t RecordBytes(int64_t num_slots) const = 0;
  // Writes an empty record (no error) on `stream`. Must precede the first
  // call that uses the record.
  virtual absl::Status InitRecord(const OpRecord& record, void* stream) = 0;

  // The fused decode step of `layer` (Backend::DecodeUpdate's math and bytes)
  // for in.batch slots (in.slots in backend memory, -1 = padding).
  virtual absl::Status EnqueueDecode(const PreparedModel& model, const PoolView& pool, int layer,
                                     const DecodeInputs& in, const OpRecord& record,
                                     void* stream) = 0;
  // in.tokens tokens of `layer` from the stored states, quantized once
  // (Backend::Prefill's math and bytes).
  virtual absl::Status EnqueuePrefill(const PreparedModel& model, const PoolView& pool, int layer,
                                      const PrefillInputs& in, const OpRecord& record,
                                      void* stream) = 0;
  // FP32 states [n, layers, h_v, d_k, d_v] (natural order) -> slots (each
  // fully overwritten; states must be finite), and back.
  virtual absl::Status EnqueuePack(const PreparedModel& model, const PoolView& pool,
                                   const int32_t* slots, int n, const float* states,
                                   const OpRecord& record, void* stream) = 0;
  virtual absl::Status EnqueueUnpack(const PreparedModel& model, const PoolView& pool,
                                     const int32_t* slots, int n, float* states,
                                     const OpRecord& record, void* stream) = 0;
  // pool slot dst_slots[i] <- pool slot src_slots[i] (a pair with a -1 is
  // skipped). Sources may repeat; destinations may not, and no destination
  // may be a source of the same call.
  virtual absl::Status EnqueueCopySlots(const PoolView& pool, const int32_t* src_slots,
                                        const int32_t* dst_slots, int n, const OpRecord& record,
                                        void* stream) = 0;

  // Waits for the work enqueued on `stream` so far (the one host
  // synchronization of this interface), then returns OK, or the first failed
  // call since the last reset (RecordedFailure: kInvalidArgument naming the
  // field, "decode layer 3: q[17]: is not finite (2 calls failed ...)", or
  // kFailedPrecondition for a fenced pool). reset = true empties the record.
  virtual absl::Status CheckRecord(const OpRecord& record, void* stream, bool reset) = 0;
};

// A record's first failure as CheckRecord returns it: `code`
// (kInvalidArgument for bad data, kFailedPrecondition for a fenced pool) and
// "<op> layer L: <detail> (N calls failed ...)" (no layer for pack / unpack /
// copy).
absl::Status RecordedFailure(StreamOp op, int layer, absl::StatusCode code,
                             absl::string_view detail, int64_t failed_calls);

// The checks every backend makes on the host before enqueueing a decode or
// prefill (batch >= 0, known dtype, non-null pointers when batch > 0,
// tokens >= 1 for prefill, o for decode) and before any call with a record.
absl::Status CheckTokenPointers(int batch, int tokens, const int32_t* slots, DType dtype,
                                const void* q, const void* k, const void* v, const float* g,
                                const float* beta);
absl::Status CheckRecordSize(const StreamOps& ops, const OpRecord& record, int64_t num_slots);
// Pack / unpack: the pool matches the model, n >= 0, slots and states set.
absl::Status CheckPackArgs(const PreparedModel& model, const PoolView& pool, const int32_t* slots,
                           int n, const void* states);
// Copy: n >= 0; slot lists and the pool base set when n > 0.
absl::Status CheckCopyArgs(const PoolView& pool, const int32_t* src_slots,
                           const int32_t* dst_slots, int n);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_BACKEND_STREAM_OPS_H_
