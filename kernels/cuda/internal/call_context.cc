#include "kernels/cuda/internal/call_context.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/cuda/internal/cuda_model.h"
#include "kernels/cuda/internal/cuda_runtime.h"
#include "kernels/cuda/internal/launchers.h"

namespace statecache {
namespace cuda_internal {

absl::Status EnqueueInputValidation(const StateLayout& layout, const PoolView& pool, int batch,
                                    int tokens, const int32_t* slots, DType dtype, const void* q,
                                    const void* k, const void* v, const float* g,
                                    const float* beta, uint32_t* bitmap, int32_t* errors,
                                    void* stream, const void* abort_word) {
  int rc = LaunchValidateSlots(slots, batch, pool.num_slots, true, bitmap, errors, kErrSlotRange,
                               kErrSlotDuplicate, stream);
  ValueChecks checks = TokenValueChecks(layout, batch, tokens, dtype, q, k, v, g, beta);
  // A DecodeQueue's abort word (a finite float unless a prologue aborted):
  // reported in a field decode never uses otherwise.
  if (abort_word != nullptr) checks.check[checks.n++] = {0, abort_word, 1, 0, kErrAborted};
  if (rc == 0) rc = LaunchValidateValuesBatch(checks, errors, stream);
  return CudaStatus(rc, "validation kernels");
}

absl::Status EnsureBitmap(int64_t num_slots, uint32_t** bitmap, int64_t* bytes) {
  const int64_t want = std::max<int64_t>(4, BitmapBytes(num_slots));
  if (want <= *bytes) return absl::OkStatus();
  if (*bitmap != nullptr) Free(*bitmap);
  *bitmap = nullptr;
  *bytes = 0;
  void* p = nullptr;
  if (Malloc(&p, want) != 0) {
    return absl::ResourceExhaustedError("cuda: cannot allocate the slot bitmap");
  }
  *bitmap = static_cast<uint32_t*>(p);
  *bytes = want;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CallContext>> CallContext::Create() {
  std::unique_ptr<CallContext> c(new CallContext());
  RETURN_IF_ERROR(CudaStatus(StreamCreate(&c->stream_), "create call stream"));
  void* errors = nullptr;
  RETURN_IF_ERROR(CudaStatus(Malloc(&errors, kErrorBytes), "allocate error block"));
  c->errors_ = static_cast<int32_t*>(errors);
  void* host = nullptr;
  RETURN_IF_ERROR(CudaStatus(HostAllocPinned(&host, kErrorBytes), "allocate pinned"));
  c->host_errors_ = static_cast<int32_t*>(host);
  RETURN_IF_ERROR(
      CudaStatus(EventCreate(&c->order_event_, /*timing=*/false), "create order event"));
  return c;
}

CallContext::~CallContext() {
  if (stream_ != nullptr) {
    StreamSynchronize(stream_);
    StreamDestroy(stream_);
  }
  if (order_event_ != nullptr) EventDestroy(order_event_);
  if (errors_ != nullptr) Free(errors_);
  if (bitmap_ != nullptr) Free(bitmap_);
  if (host_errors_ != nullptr) HostFreePinned(host_errors_);
}

absl::Status CallContext::OrderAfter(void* stream) {
  const int q = StreamQuery(stream);
  if (q == 0) return absl::OkStatus();
  if (q != kErrorNotReady) return CudaStatus(q, "query backend stream");
  RETURN_IF_ERROR(CudaStatus(EventRecord(order_event_, stream), "record order event"));
  return CudaStatus(StreamWaitEvent(stream_, order_event_), "order after backend stream");
}

absl::Status CallContext::BeginValidation(int64_t num_slots) {
  // The stream is idle here (the previous call synchronized it), so no
  // enqueued work reads the old bitmap.
  RETURN_IF_ERROR(EnsureBitmap(num_slots, &bitmap_, &bitmap_bytes_));
  RETURN_IF_ERROR(CudaStatus(MemsetAsync(errors_, 0x7f, kErrorBytes, stream_), "reset"));
  return ClearBitmap(num_slots);
}

absl::Status CallContext::ClearBitmap(int64_t num_slots) {
  return CudaStatus(
      MemsetAsync(bitmap_, 0, std::max<int64_t>(4, BitmapBytes(num_slots)), stream_),
      "clear bitmap");
}

absl::Status CallContext::FinishValidation(const int32_t* slots, const int32_t* dst_slots,
                                           int64_t num_slots, int64_t dst_num_slots) {
  RETURN_IF_ERROR(EnqueueErrorReadback());
  return Verdict(slots, dst_slots, num_slots, dst_num_slots);
}

absl::Status CallContext::EnqueueErrorReadback() {
  return CudaStatus(CopyDeviceToHostAsync(host_errors_, errors_, kErrorBytes, stream_),
                    "read errors");
}

absl::Status CallContext::Verdict(const int32_t* slots, const int32_t* dst_slots,
                                  int64_t num_slots, int64_t dst_num_slots) {
  RETURN_IF_ERROR(CudaStatus(StreamSynchronize(stream_), "validation"));
  int32_t e[kNumValidationFields];
  std::memcpy(e, host_errors_, sizeof(e));
  return ErrorBlockStatus(e, slots, dst_slots, num_slots, dst_num_slots,
                          [](const int32_t* arr, int32_t i) -> std::string {
                            int32_t v = 0;
                            if (CopyDeviceToHost(&v, arr + i, 4) != 0) return "?";
                            return absl::StrCat(v);
                          });
}

absl::Status CallContext::Synchronize(absl::string_view what) {
  return CudaStatus(StreamSynchronize(stream_), what);
}

absl::StatusOr<CallContextPool::Lease> CallContextPool::Acquire(void* order_after) {
  std::unique_ptr<CallContext> ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      ctx = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (ctx == nullptr) {
    ASSIGN_OR_RETURN(ctx, CallContext::Create());
    std::lock_guard<std::mutex> lock(mu_);
    ++created_;
  }
  Lease lease(this, std::move(ctx));
  RETURN_IF_ERROR(lease->OrderAfter(order_after));
  return lease;
}

int64_t CallContextPool::created() const {
  std::lock_guard<std::mutex> lock(mu_);
  return created_;
}

void CallContextPool::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  free_.clear();
}

void CallContextPool::GiveBack(std::unique_ptr<CallContext> ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(std::move(ctx));
}

}  // namespace cuda_internal
}  // namespace statecache
