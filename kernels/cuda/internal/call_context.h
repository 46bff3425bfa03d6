// The device state of the CUDA backend's synchronous calls (CudaBackend in
// cuda_backend.cc) and of its decode queues (cuda_decode_queue.h): call
// contexts and the pool they are leased from, the slot bitmap and the
// validation kernels of a token batch.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_CALL_CONTEXT_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_CALL_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend/backend.h"
#include "kernels/cuda/internal/kernel_params.h"

namespace statecache {
namespace cuda_internal {

// Bytes of a slot bitmap of num_slots bits (whole 32-bit words).
inline int64_t BitmapBytes(int64_t num_slots) { return ((num_slots + 31) / 32) * 4; }

// The validation field a DecodeQueue's abort word is reported in (unused by
// decode validation otherwise).
inline constexpr int kErrAborted = kErrDstSlotRange;

// Bytes of a validation error block.
inline constexpr int64_t kErrorBytes = 4 * kNumValidationFields;

// Validation kernels of a decode / prefill on `stream`: slot range and
// duplicates (bitmap: ceil(num_slots / 32) zeroed words), finite q, k, v,
// g <= 0, beta in [0, 2]. `errors` must have been reset (0x7f bytes).
// `abort_word` (a DecodeQueue's, or nullptr): a non-finite float there is
// reported in kErrAborted.
absl::Status EnqueueInputValidation(const StateLayout& layout, const PoolView& pool, int batch,
                                    int tokens, const int32_t* slots, DType dtype, const void* q,
                                    const void* k, const void* v, const float* g,
                                    const float* beta, uint32_t* bitmap, int32_t* errors,
                                    void* stream, const void* abort_word = nullptr);

// A device slot bitmap of at least `num_slots` bits (4 bytes minimum):
// reallocated when *bitmap is smaller (the caller made sure no enqueued work
// still reads the old one). Zeroing is the caller's (stream-ordered).
// kResourceExhausted when the allocation fails.
absl::Status EnsureBitmap(int64_t num_slots, uint32_t** bitmap, int64_t* bytes);

// The device state one synchronous call of the binding works with: its own
// non-blocking stream, the validation error block (device, plus a pinned
// read-back copy), the slot bitmap and an ordering event. A context serves
// one call at a time (CallContextPool::Lease); calls holding different
// contexts share nothing mutable and run concurrently. Every call leaves its
// context's stream idle when it returns OK (it synchronized it).
class CallContext {
 public:
  static absl::StatusOr<std::unique_ptr<CallContext>> Create();
  ~CallContext();

  void* stream() const { return stream_; }
  int32_t* errors() const { return errors_; }
  uint32_t* bitmap() const { return bitmap_; }

  // Later work of this context waits for the work enqueued on `stream` so
  // far (nothing is enqueued when it is idle: the common case).
  absl::Status OrderAfter(void* stream);
  // Resets the error block and a zeroed bitmap for num_slots.
  absl::Status BeginValidation(int64_t num_slots);
  absl::Status ClearBitmap(int64_t num_slots);
  // Reads the error block back (synchronizing the stream) and turns the
  // first error into a status.
  absl::Status FinishValidation(const int32_t* slots, const int32_t* dst_slots, int64_t num_slots,
                                int64_t dst_num_slots);
  // FinishValidation in two steps (work may go between them): the error
  // block's copy into pinned memory, then the wait and the status.
  absl::Status EnqueueErrorReadback();
  absl::Status Verdict(const int32_t* slots, const int32_t* dst_slots, int64_t num_slots,
                       int64_t dst_num_slots);
  absl::Status Synchronize(absl::string_view what);

 private:
  CallContext() = default;

  void* stream_ = nullptr;
  int32_t* errors_ = nullptr;       // device [kNumValidationFields]
  int32_t* host_errors_ = nullptr;  // pinned host copy
  uint32_t* bitmap_ = nullptr;      // device slot bitmap
  int64_t bitmap_bytes_ = 0;
  void* order_event_ = nullptr;
};

// The free list of call contexts: a context is made on first need and kept,
// so there are as many as calls ever ran at once. Thread-safe.
class CallContextPool {
 public:
  // Exclusive use of one CallContext for the duration of a call; gives it
  // back to the pool on destruction.
  class Lease {
   public:
    Lease(CallContextPool* pool, std::unique_ptr<CallContext> ctx)
        : pool_(pool), ctx_(std::move(ctx)) {}
    Lease(Lease&& other) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    ~Lease() {
      if (ctx_ != nullptr) pool_->GiveBack(std::move(ctx_));
    }
    CallContext* operator->() const { return ctx_.get(); }
    CallContext& operator*() const { return *ctx_; }

   private:
    CallContextPool* pool_;
    std::unique_ptr<CallContext> ctx_;
  };

  // A free context (a new one when every context is in use), ordered after
  // the work enqueued on `order_after` so far (the backend stream).
  absl::StatusOr<Lease> Acquire(void* order_after);
  // Contexts made so far (each one served at least one call).
  int64_t created() const;
  // Destroys the free contexts (every lease must have ended).
  void Clear();

 private:
  void GiveBack(std::unique_ptr<CallContext> ctx);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<CallContext>> free_;  // guarded by mu_
  int64_t created_ = 0;                              // guarded by mu_
};

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_CALL_CONTEXT_H_
