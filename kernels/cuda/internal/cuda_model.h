// The CUDA backend's prepared models and the pieces its bindings share
// (CudaBackend in cuda_backend.cc, CudaStreamOps in cuda_stream_ops.cc):
// status conversion, the recurrence launch over a prepared model, the value
// checks of a token batch and the validation block's message.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_MODEL_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_MODEL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/backend/backend.h"
#include "kernels/common/status_macros.h"
#include "kernels/cuda/internal/cuda_runtime.h"
#include "kernels/cuda/internal/kernel_params.h"
#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/stepquant_params.h"
#include "kernels/cuda_ipc/cuda_status.h"

namespace statecache {
namespace cuda_internal {

// kernels/cuda_ipc/cuda_status.h: OK for cudaSuccess (0), else kInternal
// "<what>: <error string> (CUDA error <code>)".
using ::statecache::CudaStatus;

// Device copies of a layout's maps.
class CudaPreparedModel : public PreparedModel {
 public:
  explicit CudaPreparedModel(StateLayout layout) : layout_(std::move(layout)) {}
  ~CudaPreparedModel() override {
    for (void* p : {key_perm_, value_order_, value_scale_, step_heads_, row_impact_,
                    head_offsets_}) {
      if (p != nullptr) Free(p);
    }
  }
  const StateLayout& layout() const override { return layout_; }

  absl::Status Upload() {
    if (!layout_.identity_key_perm()) {
      RETURN_IF_ERROR(UploadVector(layout_.all_key_perms(), &key_perm_));
    }
    RETURN_IF_ERROR(UploadVector(layout_.all_value_orders(), &value_order_));
    RETURN_IF_ERROR(UploadVector(layout_.all_value_scales(), &value_scale_));
    if (IsStepQuantFormat(layout_.format().format)) {
      const ModelGeometry& g = layout_.geometry();
      std::vector<StepHeadLayout> heads;
      heads.reserve(static_cast<size_t>(g.HeadsPerSlot()));
      for (int layer = 0; layer < g.layers; ++layer) {
        for (int h = 0; h < g.h_v; ++h) heads.push_back(layout_.step_head(layer, h));
      }
      RETURN_IF_ERROR(UploadVector(heads, &step_heads_));
      RETURN_IF_ERROR(UploadVector(layout_.all_row_impacts(), &row_impact_));
      RETURN_IF_ERROR(UploadVector(layout_.head_offsets(), &head_offsets_));
    }
    return absl::OkStatus();
  }

  // Kernel parameters of a STEPQuant layout (geometry, device maps, pool).
  StepKernelParams StepParams(const PoolView& pool) const {
    const ModelGeometry& g = layout_.geometry();
    StepKernelParams p;
    p.layers = g.layers;
    p.h_qk = g.h_qk;
    p.h_v = g.h_v;
    p.d_k = g.d_k;
    p.d_v = g.d_v;
    p.kda = g.arch == Arch::kKda;
    p.scale = g.EffectiveScale();
    p.heads = static_cast<const StepHeadLayout*>(step_heads_);
    p.row_impact = static_cast<const float*>(row_impact_);
    p.head_offsets = static_cast<const int64_t*>(head_offsets_);
    p.key_perm = key_perm();
    p.pool_base = pool.base;
    p.slot_stride = pool.stride();
    return p;
  }

  HeadGeometry Geometry() const {
    const ModelGeometry& g = layout_.geometry();
    HeadGeometry h;
    h.format = layout_.format().format;
    h.layout = layout_.head_layout();
    h.h_qk = g.h_qk;
    h.h_v = g.h_v;
    h.d_k = g.d_k;
    h.d_v = g.d_v;
    h.kda = g.arch == Arch::kKda;
    h.scale = g.EffectiveScale();
    return h;
  }
  // All layers: [layers][h_v][d_k] etc.
  const int32_t* key_perm() const { return static_cast<const int32_t*>(key_perm_); }
  const int32_t* value_order() const { return static_cast<const int32_t*>(value_order_); }
  const float* value_scale() const { return static_cast<const float*>(value_scale_); }

  LayerMaps Maps(int layer) const {
    const ModelGeometry& g = layout_.geometry();
    const int64_t heads_before = int64_t{layer} * g.h_v;
    LayerMaps m;
    if (key_perm_ != nullptr) m.key_perm = key_perm() + heads_before * g.d_k;
    if (value_order_ != nullptr) m.value_order = value_order() + heads_before * g.d_v;
    if (value_scale_ != nullptr) m.value_scale = value_scale() + heads_before * g.d_v;
    return m;
  }

 private:
  template <typename T>
  static absl::Status UploadVector(const std::vector<T>& v, void** out) {
    if (v.empty()) return absl::OkStatus();
    const int64_t bytes = static_cast<int64_t>(v.size() * sizeof(T));
    if (Malloc(out, bytes) != 0) {
      *out = nullptr;
      return absl::ResourceExhaustedError(absl::StrCat("cuda: cannot allocate ", bytes,
                                                       " bytes for layout maps"));
    }
    return CudaStatus(CopyHostToDevice(*out, v.data(), bytes), "upload layout maps");
  }

  StateLayout layout_;
  void* key_perm_ = nullptr;
  void* value_order_ = nullptr;
  void* value_scale_ = nullptr;
  void* step_heads_ = nullptr;    // StepHeadLayout [layers * h_v] (STEPQuant)
  void* row_impact_ = nullptr;    // float [layers * h_v * d_k] (STEPQuant)
  void* head_offsets_ = nullptr;  // int64 [layers * h_v] (STEPQuant)
};

// The model as prepared by the CUDA backend, or kInvalidArgument.
absl::StatusOr<const CudaPreparedModel*> AsCudaModel(const PreparedModel& model);

PoolParams PoolOf(const PoolView& pool);

// How the fused kernel starts relative to the previous kernel of its
// stream (RecurrenceParams, grid_dependency.cuh).
enum class RecurrenceStart {
  kWaitFirst,    // waits before any global access
  kEarlyHeads,   // early_heads: that kernel writes neither slots nor the pool
                 // (this call's validation kernels, or disjoint benchmark steps)
  kDeferWrites,  // defer_writes: that kernel is this call's StreamOps
                 // validation kernel (LaunchValidateOp), abort_if_error its
                 // verdict
};

// The fused decode / prefill kernel on `stream`; it exits without writing
// when an entry of `abort_if_error` (the validation block written earlier on
// the same stream; nullptr = the unchecked benchmark hook) is set. `start`:
// what the previous kernel of the stream guarantees (RecurrenceStart; the
// STEPQuant kernels always wait first). `options`: the backend's launch
// switches.
absl::Status EnqueueRecurrenceOn(const CudaPreparedModel& m, const PoolView& pool, int layer,
                                 int batch, int tokens, const int32_t* slots, DType dtype,
                                 const void* q, const void* k, const void* v, const float* g,
                                 const float* beta, float* o, const int32_t* abort_if_error,
                                 RecurrenceStart start, const LaunchOptions& options,
                                 void* stream);

// The value checks of a decode / prefill batch of `batch` x `tokens` rows:
// finite q, k, v (dtype), g finite and <= 0, beta finite and in [0, 2].
ValueChecks TokenValueChecks(const StateLayout& layout, int batch, int tokens, DType dtype,
                             const void* q, const void* k, const void* v, const float* g,
                             const float* beta);

// The first error of a read-back validation block `e` as a status naming the
// field and index (OK when none). `slot_value(arr, i)` prints a slot entry.
absl::Status ErrorBlockStatus(const int32_t* e, const int32_t* slots, const int32_t* dst_slots,
                              int64_t num_slots, int64_t dst_num_slots,
                              const std::function<std::string(const int32_t*, int32_t)>& slot_value);

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_MODEL_H_
