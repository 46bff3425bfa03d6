#include "kernels/cuda/internal/cuda_model.h"

#include "kernels/common/status_macros.h"

namespace statecache {
namespace cuda_internal {

absl::StatusOr<const CudaPreparedModel*> AsCudaModel(const PreparedModel& model) {
  const auto* m = dynamic_cast<const CudaPreparedModel*>(&model);
  if (m == nullptr) {
    return absl::InvalidArgumentError("model: was not prepared by the CUDA backend");
  }
  return m;
}

PoolParams PoolOf(const PoolView& pool) {
  return PoolParams{pool.base, pool.stride(), pool.layers, pool.num_slots};
}

absl::Status EnqueueRecurrenceOn(const CudaPreparedModel& m, const PoolView& pool, int layer,
                                 int batch, int tokens, const int32_t* slots, DType dtype,
                                 const void* q, const void* k, const void* v, const float* g,
                                 const float* beta, float* o, const int32_t* abort_if_error,
                                 RecurrenceStart start, const LaunchOptions& options,
                                 void* stream) {
  // The token inputs have the same names in both kernels' parameters.
  const auto set_inputs = [&](auto& kp) {
    kp.layer = layer;
    kp.batch = batch;
    kp.tokens = tokens;
    kp.slots = slots;
    kp.dtype = static_cast<int>(dtype);
    kp.q = q;
    kp.k = k;
    kp.v = v;
    kp.g = g;
    kp.beta = beta;
    kp.o = o;
    kp.abort_if_error = abort_if_error;
  };
  if (IsStepQuantFormat(m.layout().format().format)) {
    StepKernelParams sp = m.StepParams(pool);
    set_inputs(sp);
    return CudaStatus(LaunchStepRecurrence(sp, options, stream), "stepquant recurrence kernel");
  }
  RecurrenceParams p;
  p.geo = m.Geometry();
  p.maps = m.Maps(layer);
  p.pool = PoolOf(pool);
  set_inputs(p);
  p.early_heads = start == RecurrenceStart::kEarlyHeads;
  p.defer_writes = start == RecurrenceStart::kDeferWrites && abort_if_error != nullptr;
  return CudaStatus(LaunchRecurrence(p, options, stream), "recurrence kernel");
}

ValueChecks TokenValueChecks(const StateLayout& layout, int batch, int tokens, DType dtype,
                             const void* q, const void* k, const void* v, const float* g,
                             const float* beta) {
  const ModelGeometry& geo = layout.geometry();
  const int64_t rows = int64_t{batch} * tokens;
  const int dt = static_cast<int>(dtype);
  ValueChecks checks;
  checks.check[0] = {dt, q, rows * geo.h_qk * geo.d_k, 0, kErrQ};
  checks.check[1] = {dt, k, rows * geo.h_qk * geo.d_k, 0, kErrK};
  checks.check[2] = {dt, v, rows * geo.h_v * geo.d_v, 0, kErrV};
  checks.check[3] = {0, g, rows * geo.h_v * geo.GateWidth(), 1, kErrG};
  checks.check[4] = {0, beta, rows * geo.h_v, 2, kErrBeta};
  checks.n = 5;
  return checks;
}

// The first error of a read-back validation block `e` as a status naming the
// field and index (OK when none). `slot_value(arr, i)` prints a slot entry.
absl::Status ErrorBlockStatus(const int32_t* e, const int32_t* slots, const int32_t* dst_slots,
                              int64_t num_slots, int64_t dst_num_slots,
                              const std::function<std::string(const int32_t*, int32_t)>& slot_value) {
  const char* range_name = dst_slots != nullptr ? "src_slots" : "slots";
  if (e[kErrSlotRange] != kNoError) {
    const int32_t i = e[kErrSlotRange];
    return absl::InvalidArgumentError(absl::StrCat(range_name, "[", i, "]: ",
                                                   slot_value(slots, i), " is outside 0..",
                                                   num_slots - 1));
  }
  if (e[kErrSlotDuplicate] != kNoError) {
    const int32_t i = e[kErrSlotDuplicate];
    return absl::InvalidArgumentError(absl::StrCat(range_name, "[", i, "]: slot ",
                                                   slot_value(slots, i),
                                                   " appears twice in one batch"));
  }
  if (e[kErrDstSlotRange] != kNoError) {
    const int32_t i = e[kErrDstSlotRange];
    return absl::InvalidArgumentError(absl::StrCat("dst_slots[", i, "]: ",
                                                   slot_value(dst_slots, i), " is outside 0..",
                                                   dst_num_slots - 1));
  }
  if (e[kErrDstSlotDuplicate] != kNoError) {
    const int32_t i = e[kErrDstSlotDuplicate];
    return absl::InvalidArgumentError(absl::StrCat("dst_slots[", i, "]: slot ",
                                                   slot_value(dst_slots, i),
                                                   " appears twice in one batch"));
  }
  static constexpr struct {
    int field;
    const char* name;
    const char* what;
  } kValueFields[] = {
      {kErrQ, "q", "is not finite"},
      {kErrK, "k", "is not finite"},
      {kErrV, "v", "is not finite"},
      {kErrG, "g", "is not finite or is positive (g is a log decay, must be <= 0)"},
      {kErrBeta, "beta", "is not finite or is outside [0, 2]"},
      {kErrStates, "states", "is not finite or exceeds the state magnitude bound |x| <= 2^64"},
  };
  for (const auto& f : kValueFields) {
    if (e[f.field] != kNoError) {
      return absl::InvalidArgumentError(absl::StrCat(f.name, "[", e[f.field], "]: ", f.what));
    }
  }
  return absl::OkStatus();
}

}  // namespace cuda_internal
}  // namespace statecache
