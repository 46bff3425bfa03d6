#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/backend/batch_validation.h"
#include "kernels/backend/stream_ops.h"
#include "kernels/common/status_macros.h"
#include "kernels/cuda/internal/cuda_model.h"
#include "kernels/cuda/internal/cuda_runtime.h"
#include "kernels/cuda/internal/cuda_stream_ops.h"
#include "kernels/cuda/internal/kernel_params.h"
#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/stepquant_params.h"

namespace statecache {
namespace {

namespace ci = cuda_internal;
using ci::CudaPreparedModel;
using ci::CudaStatus;
using ci::EnqueueRecurrenceOn;
using ci::ErrorBlockStatus;
using ci::PoolOf;

class DeviceBuffer : public BackendBuffer {
 public:
  DeviceBuffer(uint8_t* data, int64_t size) : data_(data), size_(size) {}
  ~DeviceBuffer() override { ci::Free(data_); }
  uint8_t* data() const override { return data_; }
  int64_t size() const override { return size_; }

 private:
  uint8_t* data_;
  int64_t size_;
};

int64_t BitmapBytes(int64_t num_slots) { return ((num_slots + 31) / 32) * 4; }

// The validation field a DecodeQueue's abort word is reported in (unused by
// decode validation otherwise).
constexpr int kErrAborted = ci::kErrDstSlotRange;

// Validation kernels of a decode / prefill on `stream`: slot range and
// duplicates (bitmap: ceil(num_slots / 32) zeroed words), finite q, k, v,
// g <= 0, beta in [0, 2]. `errors` must have been reset (0x7f bytes).
absl::Status EnqueueInputValidation(const StateLayout& layout, const PoolView& pool, int batch,
                                    int tokens, const int32_t* slots, DType dtype, const void* q,
                                    const void* k, const void* v, const float* g,
                                    const float* beta, uint32_t* bitmap, int32_t* errors,
                                    void* stream, const void* abort_word = nullptr) {
  int rc = ci::LaunchValidateSlots(slots, batch, pool.num_slots, true, bitmap, errors,
                                   ci::kErrSlotRange, ci::kErrSlotDuplicate, stream);
  ci::ValueChecks checks = ci::TokenValueChecks(layout, batch, tokens, dtype, q, k, v, g, beta);
  // A DecodeQueue's abort word (a finite float unless a prologue aborted):
  // reported in a field decode never uses otherwise.
  if (abort_word != nullptr) checks.check[checks.n++] = {0, abort_word, 1, 0, kErrAborted};
  if (rc == 0) rc = ci::LaunchValidateValuesBatch(checks, errors, stream);
  return CudaStatus(rc, "validation kernels");
}

constexpr int64_t kErrorBytes = 4 * ci::kNumValidationFields;

// A device slot bitmap of at least `num_slots` bits (4 bytes minimum):
// reallocated when *bitmap is smaller (the caller made sure no enqueued work
// still reads the old one). Zeroing is the caller's (stream-ordered).
absl::Status EnsureBitmap(int64_t num_slots, uint32_t** bitmap, int64_t* bytes) {
  const int64_t want = std::max<int64_t>(4, BitmapBytes(num_slots));
  if (want <= *bytes) return absl::OkStatus();
  if (*bitmap != nullptr) ci::Free(*bitmap);
  *bitmap = nullptr;
  *bytes = 0;
  void* p = nullptr;
  if (ci::Malloc(&p, want) != 0) {
    return absl::ResourceExhaustedError("cuda: cannot allocate the slot bitmap");
  }
  *bitmap = static_cast<uint32_t*>(p);
  *bytes = want;
  return absl::OkStatus();
}

// The device state one synchronous call of the binding works with: its own
// non-blocking stream, the validation error block (device, plus a pinned
// read-back copy), the slot bitmap and an ordering event. A context serves
// one call at a time (CudaBackend::Lease); calls holding different contexts
// share nothing mutable and run concurrently. Every call leaves its
// context's stream idle when it returns OK (it synchronized it).
class CallContext {
 public:
  static absl::StatusOr<std::unique_ptr<CallContext>> Create() {
    std::unique_ptr<CallContext> c(new CallContext());
    RETURN_IF_ERROR(CudaStatus(ci::StreamCreate(&c->stream_), "create call stream"));
    void* errors = nullptr;
    RETURN_IF_ERROR(CudaStatus(ci::Malloc(&errors, kErrorBytes), "allocate error block"));
    c->errors_ = static_cast<int32_t*>(errors);
    void* host = nullptr;
    RETURN_IF_ERROR(CudaStatus(ci::HostAllocPinned(&host, kErrorBytes), "allocate pinned"));
    c->host_errors_ = static_cast<int32_t*>(host);
    RETURN_IF_ERROR(CudaStatus(ci::EventCreate(&c->order_event_, /*timing=*/false),
                               "create order event"));
    return c;
  }

  ~CallContext() {
    if (stream_ != nullptr) {
      ci::StreamSynchronize(stream_);
      ci::StreamDestroy(stream_);
    }
    if (order_event_ != nullptr) ci::EventDestroy(order_event_);
    if (errors_ != nullptr) ci::Free(errors_);
    if (bitmap_ != nullptr) ci::Free(bitmap_);
    if (host_errors_ != nullptr) ci::HostFreePinned(host_errors_);
  }

  void* stream() const { return stream_; }
  int32_t* errors() const { return errors_; }
  uint32_t* bitmap() const { return bitmap_; }

  // Later work of this context waits for the work enqueued on `stream` so
  // far (nothing is enqueued when it is idle: the common case).
  absl::Status OrderAfter(void* stream) {
    const int q = ci::StreamQuery(stream);
    if (q == 0) return absl::OkStatus();
    if (q != ci::kErrorNotReady) return CudaStatus(q, "query backend stream");
    RETURN_IF_ERROR(CudaStatus(ci::EventRecord(order_event_, stream), "record order event"));
    return CudaStatus(ci::StreamWaitEvent(stream_, order_event_), "order after backend stream");
  }

  // Resets the error block and a zeroed bitmap for num_slots.
  absl::Status BeginValidation(int64_t num_slots) {
    // The stream is idle here (the previous call synchronized it), so no
    // enqueued work reads the old bitmap.
    RETURN_IF_ERROR(EnsureBitmap(num_slots, &bitmap_, &bitmap_bytes_));
    RETURN_IF_ERROR(CudaStatus(ci::MemsetAsync(errors_, 0x7f, kErrorBytes, stream_), "reset"));
    return ClearBitmap(num_slots);
  }
  absl::Status ClearBitmap(int64_t num_slots) {
    return CudaStatus(
        ci::MemsetAsync(bitmap_, 0, std::max<int64_t>(4, BitmapBytes(num_slots)), stream_),
        "clear bitmap");
  }

  // Reads the error block back (synchronizing the stream) and turns the
  // first error into a status.
  absl::Status FinishValidation(const int32_t* slots, const int32_t* dst_slots, int64_t num_slots,
                                int64_t dst_num_slots) {
    RETURN_IF_ERROR(EnqueueErrorReadback());
    return Verdict(slots, dst_slots, num_slots, dst_num_slots);
  }
  // FinishValidation in two steps (work may go between them): the error
  // block's copy into pinned memory, then the wait and the status.
  absl::Status EnqueueErrorReadback() {
    return CudaStatus(ci::CopyDeviceToHostAsync(host_errors_, errors_, kErrorBytes, stream_),
                      "read errors");
  }
  absl::Status Verdict(const int32_t* slots, const int32_t* dst_slots, int64_t num_slots,
                       int64_t dst_num_slots) {
    RETURN_IF_ERROR(CudaStatus(ci::StreamSynchronize(stream_), "validation"));
    int32_t e[ci::kNumValidationFields];
    std::memcpy(e, host_errors_, sizeof(e));
    return ErrorBlockStatus(e, slots, dst_slots, num_slots, dst_num_slots,
                            [](const int32_t* arr, int32_t i) -> std::string {
                              int32_t v = 0;
                              if (ci::CopyDeviceToHost(&v, arr + i, 4) != 0) return "?";
                              return absl::StrCat(v);
                            });
  }

  absl::Status Synchronize(absl::string_view what) {
    return CudaStatus(ci::StreamSynchronize(stream_), what);
  }

 private:
  CallContext() = default;

  void* stream_ = nullptr;
  int32_t* errors_ = nullptr;       // device [kNumValidationFields]
  int32_t* host_errors_ = nullptr;  // pinned host copy
  uint32_t* bitmap_ = nullptr;      // device slot bitmap
  int64_t bitmap_bytes_ = 0;
  void* order_event_ = nullptr;
};

class CudaDecodeQueue;

class CudaBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const LaunchOptions& options) {
    int count = 0;
    if (ci::GetDeviceCount(&count) != 0 || count == 0) {
      return absl::UnavailableError("cuda: no CUDA device is usable");
    }
    ci::DeviceInfo info;
    RETURN_IF_ERROR(CudaStatus(ci::GetDeviceInfo(0, &info), "device properties"));
    if (info.cc_major != 9 || info.cc_minor != 0) {
      return absl::UnavailableError(absl::StrCat("cuda: device 0 (", info.name,
                                                 ") has compute capability ", info.cc_major, ".",
                                                 info.cc_minor, "; kernels are built for 9.0"));
    }
    RETURN_IF_ERROR(CudaStatus(ci::SetDevice(0), "set device"));
    std::unique_ptr<CudaBackend> b(new CudaBackend(info, options));
    RETURN_IF_ERROR(CudaStatus(ci::StreamCreate(&b->stream_), "create stream"));
    return b;
  }

  ~CudaBackend() override {
    free_contexts_.clear();
    if (stream_ != nullptr) {
      ci::StreamSynchronize(stream_);
      ci::StreamDestroy(stream_);
    }
  }

  const char* name() const override { return "cuda"; }

  std::string Describe() const override {
    return absl::StrFormat("cuda backend, %s, %.1f GiB, %d SMs, L2 %d MiB", info_.name,
                           info_.total_bytes / 1073741824.0, info_.multiprocessors,
                           info_.l2_bytes >> 20);
  }

  absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("bytes: ", bytes, " is negative"));
    const int64_t rounded = std::max<int64_t>(256, (bytes + 255) / 256 * 256);
    void* p = nullptr;
    if (ci::Malloc(&p, rounded) != 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cuda: cannot allocate ", bytes, " bytes of device memory"));
    }
    absl::StatusOr<Lease> c = Acquire();
    absl::Status st = c.status();
    if (st.ok()) st = CudaStatus(ci::MemsetAsync(p, 0, rounded, (*c)->stream()), "zero new buffer");
    if (st.ok()) st = (*c)->Synchronize("zero new buffer");
    if (!st.ok()) {
      ci::Free(p);
      return st;
    }
    return std::unique_ptr<BackendBuffer>(new DeviceBuffer(static_cast<uint8_t*>(p), bytes));
  }

  absl::StatusOr<int64_t> AvailableBytes() const override {
    int64_t free_bytes = 0, total = 0;
    RETURN_IF_ERROR(CudaStatus(ci::MemGetInfo(&free_bytes, &total), "memory info"));
    return free_bytes;
  }

  absl::Status CopyIn(void* dst, const void* src, int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("bytes: negative");
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) return absl::InvalidArgumentError("copy: null pointer");
    ASSIGN_OR_RETURN(Lease c, Acquire());
    RETURN_IF_ERROR(
        CudaStatus(ci::CopyHostToDeviceAsync(dst, src, bytes, c->stream()), "copy in"));
    return c->Synchronize("copy in");
  }

  absl::Status CopyOut(void* dst, const void* src, int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("bytes: negative");
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) return absl::InvalidArgumentError("copy: null pointer");
    ASSIGN_OR_RETURN(Lease c, Acquire());
    RETURN_IF_ERROR(
        CudaStatus(ci::CopyDeviceToHostAsync(dst, src, bytes, c->stream()), "copy out"));
    return c->Synchronize("copy out");
  }

  absl::StatusOr<std::unique_ptr<PreparedModel>> Prepare(const StateLayout& layout) override {
    const ModelGeometry& g = layout.geometry();
    if (IsStepQuantFormat(layout.format().format)) {
      // STEPQuant: per-head sizes (head_offsets) and its own kernels
      // (internal/stepquant_kernel.cu); one CTA holds the FP32 head in
      // shared memory.
      if (!ci::StepShapeSupported(g.d_k, g.d_v)) {
        return absl::UnimplementedError(absl::StrCat(
            "cuda: head shape d_k=", g.d_k, " d_v=", g.d_v, " needs ",
            ci::StepSharedBytes(g.d_k, g.d_v),
            " bytes of shared memory per head for ", FormatSpecName(layout.format()),
            " (limit 227 KiB)"));
      }
      if (layout.head_offsets().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layout: format ", FormatSpecName(layout.format()), " has no head_offsets"));
      }
      auto model = std::make_unique<CudaPreparedModel>(layout);
      RETURN_IF_ERROR(model->Upload());
      return std::unique_ptr<PreparedModel>(std::move(model));
    }
    if (!ci::TilingSupported(g.d_k, g.d_v)) {
      return absl::UnimplementedError(absl::StrCat(
          "cuda: head shape d_k=", g.d_k, " d_v=", g.d_v,
          " needs more than 256 threads per head (d_v/32 * ceil(d_k/64) must be <= 8)"));
    }
    auto model = std::make_unique<CudaPreparedModel>(layout);
    RETURN_IF_ERROR(model->Upload());
    return std::unique_ptr<PreparedModel>(std::move(model));
  }

  absl::Status DecodeUpdate(const PreparedModel& model, const PoolView& pool, int layer,
                            const DecodeInputs& in) override {
    return Decode(model, pool, layer, in, nullptr, nullptr, 0, nullptr, 0);
  }

  absl::Status DecodeUpdateStaged(const PreparedModel& model, const PoolView& pool, int layer,
                                  const DecodeInputs& in, void* staged, const void* host_in,
                                  int64_t in_bytes, void* host_o, int64_t o_bytes) override {
    if (in_bytes < 0 || o_bytes < 0) return absl::InvalidArgumentError("bytes: negative");
    if (in_bytes > 0 && (staged == nullptr || host_in == nullptr)) {
      return absl::InvalidArgumentError("copy: null pointer");
    }
    if (o_bytes > 0 && host_o == nullptr) return absl::InvalidArgumentError("copy: null pointer");
    return Decode(model, pool, layer, in, staged, host_in, in_bytes, host_o, o_bytes);
  }

  absl::Status Prefill(const PreparedModel& model, const PoolView& pool, int layer,
                       const PrefillInputs& in) override {
    ASSIGN_OR_RETURN(const CudaPreparedModel* m, Cast(model));
    const StateLayout& layout = m->layout();
    RETURN_IF_ERROR(ValidatePoolAndLayer(layout, pool, layer));
    if (in.tokens < 1) {
      return absl::InvalidArgumentError(absl::StrCat("tokens: ", in.tokens, " (must be >= 1)"));
    }
    RETURN_IF_ERROR(CheckTokenPointers(in.batch, in.tokens, in.slots, in.dtype, in.q, in.k, in.v,
                                       in.g, in.beta));
    if (in.batch == 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(Lease c, Acquire());
    RETURN_IF_ERROR(ValidateOnDevice(*c, layout, pool, in.batch, in.tokens, in.slots, in.dtype,
                                     in.q, in.k, in.v, in.g, in.beta));
    RETURN_IF_ERROR(EnqueueRecurrenceOn(*m, pool, layer, in.batch, in.tokens, in.slots, in.dtype,
                                        in.q, in.k, in.v, in.g, in.beta, in.o, c->errors(),
                                        ci::RecurrenceStart::kEarlyHeads, options_, c->stream()));
    return c->FinishValidation(in.slots, nullptr, pool.num_slots, 0);
  }

  absl::Status PackStates(const PreparedModel& model, const PoolView& pool, const int32_t* slots,
                          int n, const float* states) override {
    return PackOrUnpack(model, pool, slots, n, const_cast<float*>(states), true);
  }

  absl::Status UnpackStates(const PreparedModel& model, const PoolView& pool,
                            const int32_t* slots, int n, float* states) override {
    return PackOrUnpack(model, pool, slots, n, states, false);
  }

  absl::Status CopySlots(const PoolView& src, const int32_t* src_slots, const PoolView& dst,
                         const int32_t* dst_slots, int n) override {
    if (src.slot_bytes() != dst.slot_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pool: slot sizes differ (", src.slot_bytes(), " vs ", dst.slot_bytes(), " bytes)"));
    }
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("n: ", n, " is negative"));
    if (n == 0) return absl::OkStatus();
    if (src_slots == nullptr) return absl::InvalidArgumentError("src_slots: null");
    if (dst_slots == nullptr) return absl::InvalidArgumentError("dst_slots: null");
    if (src.base == nullptr) return absl::InvalidArgumentError("src: pool base is null");
    if (dst.base == nullptr) return absl::InvalidArgumentError("dst: pool base is null");
    ASSIGN_OR_RETURN(Lease c, Acquire());
    RETURN_IF_ERROR(c->BeginValidation(std::max(src.num_slots, dst.num_slots)));
    RETURN_IF_ERROR(CudaStatus(
        ci::LaunchValidateSlots(src_slots, n, src.num_slots, false, c->bitmap(), c->errors(),
                                ci::kErrSlotRange, ci::kErrSlotDuplicate, c->stream()),
        "validate src slots"));
    RETURN_IF_ERROR(c->ClearBitmap(dst.num_slots));
    RETURN_IF_ERROR(CudaStatus(
        ci::LaunchValidateSlots(dst_slots, n, dst.num_slots, false, c->bitmap(), c->errors(),
                                ci::kErrDstSlotRange, ci::kErrDstSlotDuplicate, c->stream()),
        "validate dst slots"));
    RETURN_IF_ERROR(c->FinishValidation(src_slots, dst_slots, src.num_slots, dst.num_slots));
    RETURN_IF_ERROR(CudaStatus(ci::LaunchCopySlots(src.base, src_slots, dst.base, dst_slots,
                                                   src.slot_bytes(), n, c->stream()),
                               "copy slots"));
    return c->Synchronize("copy slots");
  }

  absl::StatusOr<std::unique_ptr<DecodeQueue>> NewDecodeQueue() override;

  StreamOps& stream_ops() override { return stream_ops_; }

  absl::Status ZeroSlots(const PoolView& pool, const int32_t* slots, int n) override {
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("n: ", n, " is negative"));
    if (n == 0) return absl::OkStatus();
    if (slots == nullptr) return absl::InvalidArgumentError("slots: null");
    if (pool.base == nullptr) return absl::InvalidArgumentError("pool: base is null");
    ASSIGN_OR_RETURN(Lease c, Acquire());
    RETURN_IF_ERROR(c->BeginValidation(pool.num_slots));
    RETURN_IF_ERROR(CudaStatus(
        ci::LaunchValidateSlots(slots, n, pool.num_slots, true, c->bitmap(), c->errors(),
                                ci::kErrSlotRange, ci::kErrSlotDuplicate, c->stream()),
        "validate slots"));
    RETURN_IF_ERROR(c->FinishValidation(slots, nullptr, pool.num_slots, 0));
    RETURN_IF_ERROR(CudaStatus(
        ci::LaunchZeroSlots(pool.base, slots, pool.slot_bytes(), n, c->stream()), "zero slots"));
    return c->Synchronize("zero slots");
  }

  // ---- Benchmark hooks (on the backend stream) -----------------------------
  absl::Status EnqueueDecodeUnchecked(const PreparedModel& model, const PoolView& pool, int layer,
                                      const DecodeInputs& in, bool early_heads) {
    ASSIGN_OR_RETURN(const CudaPreparedModel* m, Cast(model));
    return EnqueueRecurrenceOn(*m, pool, layer, in.batch, 1, in.slots, in.dtype, in.q, in.k, in.v,
                               in.g, in.beta, in.o, nullptr,
                               early_heads ? ci::RecurrenceStart::kEarlyHeads
                                           : ci::RecurrenceStart::kWaitFirst,
                               options_, stream_);
  }
  absl::Status EnqueueCopyUnchecked(const PoolView& src, const int32_t* src_slots,
                                    const PoolView& dst, const int32_t* dst_slots, int n) {
    return CudaStatus(ci::LaunchCopySlots(src.base, src_slots, dst.base, dst_slots,
                                          src.slot_bytes(), n, stream_),
                      "copy slots");
  }
  absl::Status Synchronize() {
    return CudaStatus(ci::StreamSynchronize(stream_), "synchronize");
  }
  void* stream() const { return stream_; }

  // Contexts made so far (each one served at least one call).
  int64_t contexts_created() const {
    std::lock_guard<std::mutex> lock(contexts_mu_);
    return contexts_created_;
  }

 private:
  friend class CudaDecodeQueue;

  // Exclusive use of one CallContext for the duration of a call; gives it
  // back to the backend's free list on destruction.
  class Lease {
   public:
    Lease(CudaBackend* backend, std::unique_ptr<CallContext> ctx)
        : backend_(backend), ctx_(std::move(ctx)) {}
    Lease(Lease&& other) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    ~Lease() {
      if (ctx_ != nullptr) backend_->GiveBack(std::move(ctx_));
    }
    CallContext* operator->() const { return ctx_.get(); }
    CallContext& operator*() const { return *ctx_; }

   private:
    CudaBackend* backend_;
    std::unique_ptr<CallContext> ctx_;
  };

  CudaBackend(const ci::DeviceInfo& info, const LaunchOptions& options)
      : info_(info), options_(options), stream_ops_(options) {}

  static absl::StatusOr<const CudaPreparedModel*> Cast(const PreparedModel& model) {
    return ci::AsCudaModel(model);
  }

  // A free context (a new one when every context is in use), ordered after
  // the work enqueued on the backend stream so far (benchmark hooks, and
  // the waits an attached session puts there: AttachedSession::OrderAfter).
  absl::StatusOr<Lease> Acquire() {
    std::unique_ptr<CallContext> ctx;
    {
      std::lock_guard<std::mutex> lock(contexts_mu_);
      if (!free_contexts_.empty()) {
        ctx = std::move(free_contexts_.back());
        free_contexts_.pop_back();
      }
    }
    if (ctx == nullptr) {
      ASSIGN_OR_RETURN(ctx, CallContext::Create());
      std::lock_guard<std::mutex> lock(contexts_mu_);
      ++contexts_created_;
    }
    Lease lease(this, std::move(ctx));
    RETURN_IF_ERROR(lease->OrderAfter(stream_));
    return lease;
  }

  void GiveBack(std::unique_ptr<CallContext> ctx) {
    std::lock_guard<std::mutex> lock(contexts_mu_);
    free_contexts_.push_back(std::move(ctx));
  }

  // DecodeUpdate on one context: the optional copy in, validation, the
  // kernel (it writes nothing if validation failed, so one read-back at the
  // end reports the error), the optional copy of o out, one host wait.
  absl::Status Decode(const PreparedModel& model, const PoolView& pool, int layer,
                      const DecodeInputs& in, void* staged, const void* host_in,
                      int64_t in_bytes, void* host_o, int64_t o_bytes) {
    ASSIGN_OR_RETURN(const CudaPreparedModel* m, Cast(model));
    const StateLayout& layout = m->layout();
    RETURN_IF_ERROR(ValidatePoolAndLayer(layout, pool, layer));
    RETURN_IF_ERROR(CheckTokenPointers(in.batch, 1, in.slots, in.dtype, in.q, in.k, in.v, in.g,
                                       in.beta));
    if (in.batch > 0 && in.o == nullptr) return absl::InvalidArgumentError("o: null");
    if (in.batch == 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(Lease c, Acquire());
    if (in_bytes > 0) {
      RETURN_IF_ERROR(CudaStatus(ci::CopyHostToDeviceAsync(staged, host_in, in_bytes, c->stream()),
                                 "copy in"));
    }
    RETURN_IF_ERROR(ValidateOnDevice(*c, layout, pool, in.batch, 1, in.slots, in.dtype, in.q,
                                     in.k, in.v, in.g, in.beta));
    RETURN_IF_ERROR(EnqueueRecurrenceOn(*m, pool, layer, in.batch, 1, in.slots, in.dtype, in.q,
                                        in.k, in.v, in.g, in.beta, in.o, c->errors(),
                                        ci::RecurrenceStart::kEarlyHeads, options_, c->stream()));
    RETURN_IF_ERROR(c->EnqueueErrorReadback());
    if (o_bytes > 0) {
      // Behind the kernel on the same stream (returns once done: pageable
      // memory); o is only meaningful when the verdict is OK.
      RETURN_IF_ERROR(
          CudaStatus(ci::CopyDeviceToHostAsync(host_o, in.o, o_bytes, c->stream()), "copy out"));
    }
    return c->Verdict(in.slots, nullptr, pool.num_slots, 0);
  }

  absl::Status ValidateOnDevice(CallContext& c, const StateLayout& layout, const PoolView& pool,
                                int batch, int tokens, const int32_t* slots, DType dtype,
                                const void* q, const void* k, const void* v, const float* g,
                                const float* beta) {
    RETURN_IF_ERROR(c.BeginValidation(pool.num_slots));
    return EnqueueInputValidation(layout, pool, batch, tokens, slots, dtype, q, k, v, g, beta,
                                  c.bitmap(), c.errors(), c.stream());
  }

  absl::Status PackOrUnpack(const PreparedModel& model, const PoolView& pool,
                            const int32_t* slots, int n, float* states, bool pack) {
    ASSIGN_OR_RETURN(const CudaPreparedModel* m, Cast(model));
    const StateLayout& layout = m->layout();
    RETURN_IF_ERROR(ValidatePoolAndLayer(layout, pool, 0));
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("n: ", n, " is negative"));
    if (n == 0) return absl::OkStatus();
    if (slots == nullptr) return absl::InvalidArgumentError("slots: null");
    if (states == nullptr) return absl::InvalidArgumentError("states: null");
    const ModelGeometry& geo = layout.geometry();
    const int64_t values = int64_t{n} * geo.HeadsPerSlot() * geo.d_k * geo.d_v;
    ASSIGN_OR_RETURN(Lease c, Acquire());
    void* stream = c->stream();
    RETURN_IF_ERROR(c->BeginValidation(pool.num_slots));
    int rc = ci::LaunchValidateSlots(slots, n, pool.num_slots, true, c->bitmap(), c->errors(),
                                     ci::kErrSlotRange, ci::kErrSlotDuplicate, stream);
    if (rc == 0 && pack) {
      rc = ci::LaunchValidateValues(0, states, values, 3, c->errors(), ci::kErrStates, stream);
    }
    RETURN_IF_ERROR(CudaStatus(rc, "validation kernels"));
    RETURN_IF_ERROR(c->FinishValidation(slots, nullptr, pool.num_slots, 0));
    if (IsStepQuantFormat(layout.format().format)) {
      ci::StepKernelParams sp = m->StepParams(pool);
      sp.slots = slots;
      sp.n = n;
      sp.states = states;
      RETURN_IF_ERROR(CudaStatus(pack ? ci::LaunchStepPack(sp, stream)
                                      : ci::LaunchStepUnpack(sp, stream),
                                 pack ? "stepquant pack kernel" : "stepquant unpack kernel"));
      return c->Synchronize(pack ? "pack" : "unpack");
    }
    ci::PackParams p;
    p.geo = m->Geometry();
    p.key_perm = m->key_perm();
    p.value_order = m->value_order();
    p.value_scale = m->value_scale();
    p.pool = PoolOf(pool);
    p.slots = slots;
    p.n = n;
    p.states = states;
    RETURN_IF_ERROR(CudaStatus(pack ? ci::LaunchPack(p, stream) : ci::LaunchUnpack(p, stream),
                               pack ? "pack kernel" : "unpack kernel"));
    return c->Synchronize(pack ? "pack" : "unpack");
  }

  const ci::DeviceInfo info_;
  const LaunchOptions options_;  // every launch of this backend and its queues
  // The backend stream: benchmark hooks and CudaStreamOf; every call's
  // context orders itself after it (Acquire).
  void* stream_ = nullptr;
  mutable std::mutex contexts_mu_;
  std::vector<std::unique_ptr<CallContext>> free_contexts_;  // guarded by contexts_mu_
  int64_t contexts_created_ = 0;                             // guarded by contexts_mu_
  ci::CudaStreamOps stream_ops_;
};

// DecodeQueue on its own non-blocking stream, with its own validation block,
// slot bitmap and a ring of pinned read-back blocks (one per update in
// flight): nothing is shared with the backend's synchronous calls or other
// queues but the read-only prepared models. Per update the stream gets:
// reset error block + bitmap, validation kernels, the fused kernel (exits
// untouched on any error), an async copy of the 44-byte block into the
// update's pinned entry, the caller's epilogue, an event. A completion
// thread waits for the events in order, turns the block into a status and
// runs `done`; the host never waits on the producer side (except when
// kRing updates are in flight).
class CudaDecodeQueue : public DecodeQueue {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDecodeQueue>> Create(const LaunchOptions& options) {
    std::unique_ptr<CudaDecodeQueue> q(new CudaDecodeQueue(options));
    RETURN_IF_ERROR(CudaStatus(ci::StreamCreate(&q->stream_), "create queue stream"));
    void* errors = nullptr;
    RETURN_IF_ERROR(CudaStatus(ci::Malloc(&errors, kErrorBytes), "allocate error block"));
    q->errors_ = static_cast<int32_t*>(errors);
    void* host = nullptr;
    RETURN_IF_ERROR(
        CudaStatus(ci::HostAllocPinned(&host, kRing * kErrorBytes), "allocate pinned blocks"));
    q->host_errors_ = static_cast<int32_t*>(host);
    void* abort_word = nullptr;
    RETURN_IF_ERROR(CudaStatus(ci::Malloc(&abort_word, 256), "allocate abort word"));
    q->abort_word_ = abort_word;
    RETURN_IF_ERROR(CudaStatus(ci::MemsetAsync(abort_word, 0, 256, q->stream_), "zero abort word"));
    for (int i = 0; i < kRing; ++i) {
      RETURN_IF_ERROR(CudaStatus(ci::EventCreate(&q->events_[i]), "create queue event"));
    }
    q->thread_ = std::thread([p = q.get()] { p->CompletionLoop(); });
    return q;
  }

  ~CudaDecodeQueue() override {
    if (thread_.joinable()) {
      Drain();
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
    if (stream_ != nullptr) {
      ci::StreamSynchronize(stream_);
      ci::StreamDestroy(stream_);
    }
    for (void* e : events_) {
      if (e != nullptr) ci::EventDestroy(e);
    }
    if (errors_ != nullptr) ci::Free(errors_);
    if (bitmap_ != nullptr) ci::Free(bitmap_);
    if (abort_word_ != nullptr) ci::Free(abort_word_);
    if (host_errors_ != nullptr) ci::HostFreePinned(host_errors_);
  }

  void* native_stream() const override { return stream_; }

  absl::Status EnqueueDecodeUpdate(const PreparedModel& model, const PoolView& pool, int layer,
                                   const DecodeInputs& in, const Prologue& prologue,
                                   const Epilogue& epilogue, Done done) override {
    ASSIGN_OR_RETURN(const CudaPreparedModel* m, CudaBackend::Cast(model));
    const StateLayout& layout = m->layout();
    RETURN_IF_ERROR(ValidatePoolAndLayer(layout, pool, layer));
    RETURN_IF_ERROR(CheckTokenPointers(in.batch, 1, in.slots, in.dtype, in.q, in.k,
                                                    in.v, in.g, in.beta));
    if (in.batch > 0 && in.o == nullptr) return absl::InvalidArgumentError("o: null");
    if (in.batch == 0) {
      if (prologue) {
        // Its device work may wait (a gate): keep it in the order.
        absl::Status p = prologue(stream_, abort_word_);
        if (!p.ok()) {
          return EnqueueCompletion(epilogue, [p, done = std::move(done)](absl::Status) {
            done(p);
          });
        }
      }
      return EnqueueCompletion(epilogue, std::move(done));
    }
    // A bigger pool than seen so far: the bitmap grows once (after the
    // stream's earlier work, which may still read the old one).
    const int64_t bitmap_bytes = std::max<int64_t>(4, BitmapBytes(pool.num_slots));
    if (bitmap_bytes > bitmap_bytes_) {
      RETURN_IF_ERROR(CudaStatus(ci::StreamSynchronize(stream_), "queue sync"));
      RETURN_IF_ERROR(EnsureBitmap(pool.num_slots, &bitmap_, &bitmap_bytes_));
    }
    const int entry = TakeEntry();
    Pending pending;
    pending.entry = entry;
    pending.update = true;
    pending.slots = in.slots;
    pending.num_slots = pool.num_slots;
    pending.done = std::move(done);
    // From here on the update has its place in the order: CUDA and
    // prologue errors become its status (and nothing more is enqueued).
    absl::Status st = prologue ? prologue(stream_, abort_word_) : absl::OkStatus();
    if (st.ok()) {
      int rc = ci::MemsetAsync(errors_, 0x7f, kErrorBytes, stream_);
      if (rc == 0) rc = ci::MemsetAsync(bitmap_, 0, bitmap_bytes, stream_);
      st = CudaStatus(rc, "reset validation");
    }
    if (st.ok()) {
      st = EnqueueInputValidation(layout, pool, in.batch, 1, in.slots, in.dtype, in.q, in.k, in.v,
                                  in.g, in.beta, bitmap_, errors_, stream_, abort_word_);
    }
    if (st.ok()) {
      st = EnqueueRecurrenceOn(*m, pool, layer, in.batch, 1, in.slots, in.dtype, in.q, in.k, in.v,
                               in.g, in.beta, in.o, errors_, ci::RecurrenceStart::kEarlyHeads,
                               options_, stream_);
    }
    if (st.ok()) {
      st = CudaStatus(ci::CopyDeviceToHostAsync(host_errors_ + entry * ci::kNumValidationFields,
                                                errors_, kErrorBytes, stream_),
                      "read errors");
    }
    pending.status = st;
    Finish(std::move(pending), epilogue);
    return absl::OkStatus();
  }

  absl::Status EnqueueCompletion(const Epilogue& epilogue, Done done) override {
    Pending pending;
    pending.entry = TakeEntry();
    pending.done = std::move(done);
    Finish(std::move(pending), epilogue);
    return absl::OkStatus();
  }

  void Drain() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return queue_.empty() && !running_; });
  }

 private:
  // Updates (pinned blocks, events) in flight at most; the producer waits
  // for a free entry beyond that.
  static constexpr int kRing = 256;

  struct Pending {
    int entry = 0;
    bool update = false;
    const int32_t* slots = nullptr;  // device; read only for an error message
    int64_t num_slots = 0;
    absl::Status status;  // an enqueue or epilogue error, else the block decides
    bool event_ok = false;
    Done done;
  };

  explicit CudaDecodeQueue(const LaunchOptions& options) : options_(options) {}

  int TakeEntry() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return in_flight_ < kRing; });
    ++in_flight_;
    const int e = next_entry_;
    next_entry_ = (next_entry_ + 1) % kRing;
    return e;
  }

  // Epilogue, event, hand-off to the completion thread.
  void Finish(Pending pending, const Epilogue& epilogue) {
    if (epilogue) {
      absl::Status e = epilogue(stream_);
      if (pending.status.ok()) pending.status = e;
    }
    absl::Status ev = CudaStatus(ci::EventRecord(events_[pending.entry], stream_), "record event");
    if (pending.status.ok()) pending.status = ev;
    pending.event_ok = ev.ok();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(pending));
    }
    cv_.notify_all();
  }

  void CompletionLoop() {
    for (;;) {
      Pending p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty() || stop_; });
        if (queue_.empty()) return;
        p = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
      }
      // Entries complete in order (one stream): this event also covers the
      // block copy and the epilogue of this update.
      absl::Status st = p.status;
      const absl::Status synced = CudaStatus(
          p.event_ok ? ci::EventSynchronize(events_[p.entry]) : ci::StreamSynchronize(stream_),
          "queue completion");
      if (st.ok()) st = synced;
      if (st.ok() && p.update) {
        int32_t e[ci::kNumValidationFields];
        std::memcpy(e, host_errors_ + p.entry * ci::kNumValidationFields, sizeof(e));
        st = e[kErrAborted] != ci::kNoError
                 ? absl::AbortedError("aborted by the queue's prologue before it ran; nothing "
                                      "was written")
                 : ErrorBlockStatus(e, p.slots, nullptr, p.num_slots, 0,
                              [](const int32_t* arr, int32_t i) -> std::string {
                                int32_t v = 0;
                                if (ci::CopyDeviceToHost(&v, arr + i, 4) != 0) return "?";
                                return absl::StrCat(v);
                              });
      }
      if (p.done) p.done(std::move(st));
      {
        std::lock_guard<std::mutex> lock(mu_);
        --in_flight_;
        running_ = false;
      }
      cv_.notify_all();
    }
  }

  void* stream_ = nullptr;
  int32_t* errors_ = nullptr;       // device [kNumValidationFields]
  int32_t* host_errors_ = nullptr;  // pinned [kRing][kNumValidationFields]
  uint32_t* bitmap_ = nullptr;      // device slot bitmap (producer thread only)
  void* abort_word_ = nullptr;      // device float, 0 until a prologue aborts
  int64_t bitmap_bytes_ = 0;
  void* events_[kRing] = {};
  std::thread thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;  // enqueued, not yet completed (guarded by mu_)
  int in_flight_ = 0;          // entries taken, callbacks not yet run
  int next_entry_ = 0;
  bool running_ = false;       // a callback is running
  bool stop_ = false;
  const LaunchOptions options_;  // the backend's
};

absl::StatusOr<std::unique_ptr<DecodeQueue>> CudaBackend::NewDecodeQueue() {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDecodeQueue> q, CudaDecodeQueue::Create(options_));
  return std::unique_ptr<DecodeQueue>(std::move(q));
}

absl::StatusOr<CudaBackend*> AsCuda(Backend& backend) {
  auto* b = dynamic_cast<CudaBackend*>(&backend);
  if (b == nullptr) return absl::InvalidArgumentError("backend: not a CUDA backend");
  return b;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const LaunchOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b, CudaBackend::Create(options));
  return std::unique_ptr<Backend>(std::move(b));
}

absl::Status CudaEnqueueDecodeUnchecked(Backend& backend, const PreparedModel& model,
                                        const PoolView& pool, int layer, const DecodeInputs& in,
                                        bool early_heads) {
  ASSIGN_OR_RETURN(CudaBackend * b, AsCuda(backend));
  return b->EnqueueDecodeUnchecked(model, pool, layer, in, early_heads);
}

absl::Status CudaEnqueueCopySlotsUnchecked(Backend& backend, const PoolView& src,
                                           const int32_t* src_slots, const PoolView& dst,
                                           const int32_t* dst_slots, int n) {
  ASSIGN_OR_RETURN(CudaBackend * b, AsCuda(backend));
  return b->EnqueueCopyUnchecked(src, src_slots, dst, dst_slots, n);
}

absl::Status CudaSynchronize(Backend& backend) {
  ASSIGN_OR_RETURN(CudaBackend * b, AsCuda(backend));
  return b->Synchronize();
}

absl::StatusOr<void*> CudaStreamOf(Backend& backend) {
  ASSIGN_OR_RETURN(CudaBackend * b, AsCuda(backend));
  return b->stream();
}

absl::StatusOr<int64_t> CudaCallContexts(Backend& backend) {
  ASSIGN_OR_RETURN(CudaBackend * b, AsCuda(backend));
  return b->contexts_created();
}

}  // namespace statecache
