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
#include "kernels/backend/pinned_memory.h"
#include "kernels/backend/stream_ops.h"
#include "kernels/common/status_macros.h"
#include "kernels/cuda/internal/call_context.h"
#include "kernels/cuda/internal/cuda_decode_queue.h"
#include "kernels/cuda/internal/cuda_model.h"
#include "kernels/cuda/internal/cuda_runtime.h"
#include "kernels/cuda/internal/cuda_stream_ops.h"
#include "kernels/cuda/internal/kernel_params.h"
#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/stepquant_params.h"
#include "kernels/cuda_ipc/cuda_interprocess.h"

namespace statecache {
namespace {

namespace ci = cuda_internal;
using ci::CallContext;
using ci::CudaPreparedModel;
using ci::CudaStatus;
using ci::EnqueueInputValidation;
using ci::EnqueueRecurrenceOn;
using ci::ErrorBlockStatus;
using ci::PoolOf;

// CopyOutThenIn's chunk: about 1/16 of the copy (the two directions overlap
// but for one chunk), at least 1 MiB (a DMA copy's fixed cost stays small
// beside its bytes), in 64 KiB units.
int64_t SwapChunkBytes(int64_t bytes) {
  constexpr int64_t kUnit = int64_t{64} << 10;
  const int64_t chunk = std::max<int64_t>(int64_t{1} << 20, (bytes + 15) / 16);
  return (chunk + kUnit - 1) / kUnit * kUnit;
}

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

// Page-locked host memory (cudaMallocHost), freed with cudaFreeHost.
class PinnedBuffer : public BackendBuffer {
 public:
  PinnedBuffer(uint8_t* data, int64_t size) : data_(data), size_(size) {}
  ~PinnedBuffer() override { ci::HostFreePinned(data_); }
  uint8_t* data() const override { return data_; }
  int64_t size() const override { return size_; }

 private:
  uint8_t* data_;
  int64_t size_;
};

class CudaPinnedMemory : public PinnedMemory {
 public:
  absl::StatusOr<std::unique_ptr<BackendBuffer>> AllocatePinned(int64_t bytes) override {
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bytes: ", bytes, " is negative"));
    }
    const int64_t rounded = std::max<int64_t>(256, (bytes + 255) / 256 * 256);
    void* p = nullptr;
    if (ci::HostAllocPinned(&p, rounded) != 0 || p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cuda: cannot allocate ", bytes, " bytes of page-locked host memory"));
    }
    return std::unique_ptr<BackendBuffer>(new PinnedBuffer(static_cast<uint8_t*>(p), bytes));
  }
  bool page_locked() const override { return true; }
};

class CudaBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const LaunchOptions& options) {
    int count = 0;
    if (ci::GetDeviceCount(&count) != 0 || count == 0) {
      return absl::UnavailableError("cuda: no CUDA device is usable");
    }
    const int device = options.device;
    if (device < 0 || device >= count) {
      return absl::InvalidArgumentError(absl::StrCat("device: cuda:", device, " is not one of the ",
                                                     count, " CUDA devices"));
    }
    ci::DeviceInfo info;
    RETURN_IF_ERROR(CudaStatus(ci::GetDeviceInfo(device, &info), "device properties"));
    if (info.cc_major != 9 || info.cc_minor != 0) {
      return absl::UnavailableError(absl::StrCat("cuda: device ", device, " (", info.name,
                                                 ") has compute capability ", info.cc_major, ".",
                                                 info.cc_minor, "; kernels are built for 9.0"));
    }
    RETURN_IF_ERROR(CudaStatus(ci::SetDevice(device), "set device"));
    std::unique_ptr<CudaBackend> b(new CudaBackend(info, options));
    RETURN_IF_ERROR(CudaStatus(ci::StreamCreate(&b->stream_), "create stream"));
    return b;
  }

  ~CudaBackend() override {
    contexts_.Clear();
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

  absl::Status CopyWithin(void* dst, const void* src, int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("bytes: negative");
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) return absl::InvalidArgumentError("copy: null pointer");
    ASSIGN_OR_RETURN(Lease c, Acquire());
    RETURN_IF_ERROR(
        CudaStatus(ci::CopyDeviceToDeviceAsync(dst, src, bytes, c->stream()), "copy within"));
    return c->Synchronize("copy within");
  }

  absl::Status CopyOutThenIn(void* host_dst, void* region, const void* host_src,
                             int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("bytes: negative");
    if (bytes == 0) return absl::OkStatus();
    if (host_dst == nullptr || region == nullptr || host_src == nullptr) {
      return absl::InvalidArgumentError("copy: null pointer");
    }
    // Chunk i goes out on one stream and its replacement in on the other
    // once it is out, so chunk i + 1's copy out overlaps chunk i's copy in.
    ASSIGN_OR_RETURN(Lease out, Acquire());
    ASSIGN_OR_RETURN(Lease in, Acquire());
    void* out_done = nullptr;
    RETURN_IF_ERROR(CudaStatus(ci::EventCreate(&out_done, /*timing=*/false), "create event"));
    const int64_t chunk = SwapChunkBytes(bytes);
    auto* dst = static_cast<uint8_t*>(host_dst);
    auto* dev = static_cast<uint8_t*>(region);
    const auto* src = static_cast<const uint8_t*>(host_src);
    int rc = 0;
    for (int64_t off = 0; off < bytes && rc == 0; off += chunk) {
      const int64_t n = std::min(chunk, bytes - off);
      rc = ci::CopyDeviceToHostAsync(dst + off, dev + off, n, out->stream());
      if (rc == 0) rc = ci::EventRecord(out_done, out->stream());
      if (rc == 0) rc = ci::StreamWaitEvent(in->stream(), out_done);
      if (rc == 0) rc = ci::CopyHostToDeviceAsync(dev + off, src + off, n, in->stream());
    }
    // Both streams drain before the host buffers are handed back, also
    // after a failed enqueue.
    absl::Status st = CudaStatus(rc, "copy out then in");
    absl::Status out_sync = out->Synchronize("copy out");
    absl::Status in_sync = in->Synchronize("copy in");
    ci::EventDestroy(out_done);
    if (!st.ok()) return st;
    if (!out_sync.ok()) return out_sync;
    return in_sync;
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
    RETURN_IF_ERROR(CudaStatus(ci::LaunchCopySlots(ci::PoolOf(src), src_slots, ci::PoolOf(dst),
                                                   dst_slots, src.slot_bytes(), n, c->stream()),
                               "copy slots"));
    return c->Synchronize("copy slots");
  }

  absl::StatusOr<std::unique_ptr<DecodeQueue>> NewDecodeQueue() override {
    return ci::NewCudaDecodeQueue(options_);
  }

  StreamOps& stream_ops() override { return stream_ops_; }
  // CUDA IPC (kernels/cuda_ipc/cuda_interprocess.h).
  Interprocess* interprocess() override { return interprocess_.get(); }
  void* native_stream() const override { return stream_; }
  // Page-locked host memory: CopyIn / CopyOut from it are DMA transfers on
  // the call's stream (one host wait), not staged through a pageable buffer.
  PinnedMemory* pinned_memory() override { return &pinned_; }

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
        ci::LaunchZeroSlots(ci::PoolOf(pool), slots, pool.slot_bytes(), n, c->stream()),
        "zero slots"));
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
    return CudaStatus(ci::LaunchCopySlots(ci::PoolOf(src), src_slots, ci::PoolOf(dst), dst_slots,
                                          src.slot_bytes(), n, stream_),
                      "copy slots");
  }
  absl::Status Synchronize() {
    return CudaStatus(ci::StreamSynchronize(stream_), "synchronize");
  }

  // Contexts made so far (each one served at least one call).
  int64_t contexts_created() const {
    return contexts_.created();
  }

 private:
  using Lease = ci::CallContextPool::Lease;

  CudaBackend(const ci::DeviceInfo& info, const LaunchOptions& options)
      : info_(info), options_(options), stream_ops_(options) {}

  static absl::StatusOr<const CudaPreparedModel*> Cast(const PreparedModel& model) {
    return ci::AsCudaModel(model);
  }

  // A free context, ordered after the work enqueued on the backend stream so
  // far (benchmark hooks, and the waits an attached session puts there:
  // AttachedSession::OrderAfter).
  absl::StatusOr<Lease> Acquire() { return contexts_.Acquire(stream_); }

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
      // Behind the kernel on the same stream (pinned host_o: asynchronous,
      // waited for by the verdict; pageable: returns once done); o is only
      // meaningful when the verdict is OK.
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
  // The backend stream: native_stream() and the benchmark hooks; every
  // call's context orders itself after it (Acquire).
  void* stream_ = nullptr;
  const std::unique_ptr<Interprocess> interprocess_ = NewCudaInterprocess();
  CudaPinnedMemory pinned_;
  ci::CallContextPool contexts_;
  ci::CudaStreamOps stream_ops_;
};

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

absl::StatusOr<int64_t> CudaCallContexts(Backend& backend) {
  ASSIGN_OR_RETURN(CudaBackend * b, AsCuda(backend));
  return b->contexts_created();
}

}  // namespace statecache
