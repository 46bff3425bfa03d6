#include "kernels/cuda/internal/cuda_stream_ops.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/backend/batch_validation.h"
#include "kernels/common/status_macros.h"
#include "kernels/cuda/internal/cuda_model.h"
#include "kernels/cuda/internal/op_record.h"
#include "kernels/cuda/internal/op_validation.h"

namespace statecache {
namespace cuda_internal {
namespace {

int32_t* Words(const OpRecord& record) { return static_cast<int32_t*>(record.data); }
const int32_t* Verdict(const OpRecord& record) { return Words(record) + kRecordVerdictWord; }

OpValidationParams ValidationOf(const OpRecord& record, StreamOp op, int layer,
                                const PoolView& pool, const int32_t* slots, int n) {
  OpValidationParams v;
  v.record = Words(record);
  v.op = static_cast<int>(op);
  v.layer = layer;
  v.fence = pool.fence;
  v.slots = slots;
  v.n = n;
  v.num_slots = pool.num_slots;
  return v;
}

// The pack / unpack kernel of `m` (STEPQuant or the uniform formats) behind
// the record's verdict.
absl::Status LaunchPackOrUnpack(const CudaPreparedModel& m, const PoolView& pool,
                                const int32_t* slots, int n, float* states, bool pack,
                                const int32_t* verdict, void* stream) {
  if (IsStepQuantFormat(m.layout().format().format)) {
    StepKernelParams sp = m.StepParams(pool);
    sp.slots = slots;
    sp.n = n;
    sp.states = states;
    sp.abort_if_error = verdict;
    return CudaStatus(pack ? LaunchStepPack(sp, stream) : LaunchStepUnpack(sp, stream),
                      pack ? "stepquant pack kernel" : "stepquant unpack kernel");
  }
  PackParams p;
  p.geo = m.Geometry();
  p.key_perm = m.key_perm();
  p.value_order = m.value_order();
  p.value_scale = m.value_scale();
  p.pool = PoolOf(pool);
  p.slots = slots;
  p.n = n;
  p.states = states;
  p.abort_if_error = verdict;
  return CudaStatus(pack ? LaunchPack(p, stream) : LaunchUnpack(p, stream),
                    pack ? "pack kernel" : "unpack kernel");
}

// Decode (tokens = 1) or prefill after the host checks: the validation
// kernel, then the fused recurrence behind its verdict.
absl::Status EnqueueTokenOp(StreamOp op, const CudaPreparedModel& m, const PoolView& pool,
                            int layer, int batch, int tokens, const int32_t* slots, DType dtype,
                            const void* q, const void* k, const void* v, const float* g,
                            const float* beta, float* o, const OpRecord& record,
                            const LaunchOptions& options, void* stream) {
  if (batch == 0) return absl::OkStatus();
  OpValidationParams p = ValidationOf(record, op, layer, pool, slots, batch);
  p.values = TokenValueChecks(m.layout(), batch, tokens, dtype, q, k, v, g, beta);
  RETURN_IF_ERROR(CudaStatus(LaunchValidateOp(p, stream), "validation kernel"));
  return EnqueueRecurrenceOn(m, pool, layer, batch, tokens, slots, dtype, q, k, v, g, beta, o,
                             Verdict(record), RecurrenceStart::kDeferWrites, options, stream);
}

}  // namespace

int64_t CudaStreamOps::RecordBytes(int64_t num_slots) const { return CudaRecordBytes(num_slots); }

absl::Status CudaStreamOps::InitRecord(const OpRecord& record, void* stream) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, 0));
  // The largest capacity the record's bytes cover.
  int64_t capacity = (record.bytes / 4 - kRecordBitmapWord) / 2 * 32;
  if (capacity > INT32_MAX) capacity = INT32_MAX;
  return CudaStatus(LaunchInitRecord(Words(record), capacity, stream), "init record");
}

absl::Status CudaStreamOps::EnqueueDecode(const PreparedModel& model, const PoolView& pool,
                                          int layer, const DecodeInputs& in,
                                          const OpRecord& record, void* stream) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, pool.num_slots));
  ASSIGN_OR_RETURN(const CudaPreparedModel* m, AsCudaModel(model));
  RETURN_IF_ERROR(ValidatePoolAndLayer(m->layout(), pool, layer));
  RETURN_IF_ERROR(
      CheckTokenPointers(in.batch, 1, in.slots, in.dtype, in.q, in.k, in.v, in.g, in.beta));
  if (in.batch > 0 && in.o == nullptr) return absl::InvalidArgumentError("o: null");
  return EnqueueTokenOp(StreamOp::kDecode, *m, pool, layer, in.batch, 1, in.slots, in.dtype, in.q,
                        in.k, in.v, in.g, in.beta, in.o, record, options_, stream);
}

absl::Status CudaStreamOps::EnqueuePrefill(const PreparedModel& model, const PoolView& pool,
                                           int layer, const PrefillInputs& in,
                                           const OpRecord& record, void* stream) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, pool.num_slots));
  ASSIGN_OR_RETURN(const CudaPreparedModel* m, AsCudaModel(model));
  RETURN_IF_ERROR(ValidatePoolAndLayer(m->layout(), pool, layer));
  RETURN_IF_ERROR(CheckTokenPointers(in.batch, in.tokens, in.slots, in.dtype, in.q, in.k, in.v,
                                     in.g, in.beta));
  return EnqueueTokenOp(StreamOp::kPrefill, *m, pool, layer, in.batch, in.tokens, in.slots,
                        in.dtype, in.q, in.k, in.v, in.g, in.beta, in.o, record, options_, stream);
}

absl::Status CudaStreamOps::EnqueuePack(const PreparedModel& model, const PoolView& pool,
                                        const int32_t* slots, int n, const float* states,
                                        const OpRecord& record, void* stream) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, pool.num_slots));
  ASSIGN_OR_RETURN(const CudaPreparedModel* m, AsCudaModel(model));
  RETURN_IF_ERROR(CheckPackArgs(*m, pool, slots, n, states));
  if (n == 0) return absl::OkStatus();
  const ModelGeometry& geo = m->layout().geometry();
  OpValidationParams v = ValidationOf(record, StreamOp::kPack, -1, pool, slots, n);
  v.values.check[0] = {0, states, int64_t{n} * geo.HeadsPerSlot() * geo.d_k * geo.d_v, 3,
                       kErrStates};
  v.values.n = 1;
  RETURN_IF_ERROR(CudaStatus(LaunchValidateOp(v, stream), "validation kernel"));
  return LaunchPackOrUnpack(*m, pool, slots, n, const_cast<float*>(states), true, Verdict(record),
                            stream);
}

absl::Status CudaStreamOps::EnqueueUnpack(const PreparedModel& model, const PoolView& pool,
                                          const int32_t* slots, int n, float* states,
                                          const OpRecord& record, void* stream) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, pool.num_slots));
  ASSIGN_OR_RETURN(const CudaPreparedModel* m, AsCudaModel(model));
  RETURN_IF_ERROR(CheckPackArgs(*m, pool, slots, n, states));
  if (n == 0) return absl::OkStatus();
  const OpValidationParams v = ValidationOf(record, StreamOp::kUnpack, -1, pool, slots, n);
  RETURN_IF_ERROR(CudaStatus(LaunchValidateOp(v, stream), "validation kernel"));
  return LaunchPackOrUnpack(*m, pool, slots, n, states, false, Verdict(record), stream);
}

absl::Status CudaStreamOps::EnqueueCopySlots(const PoolView& pool, const int32_t* src_slots,
                                             const int32_t* dst_slots, int n,
                                             const OpRecord& record, void* stream) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, pool.num_slots));
  RETURN_IF_ERROR(CheckCopyArgs(pool, src_slots, dst_slots, n));
  if (n == 0) return absl::OkStatus();
  OpValidationParams v = ValidationOf(record, StreamOp::kCopySlots, -1, pool, src_slots, n);
  v.dst_slots = dst_slots;
  RETURN_IF_ERROR(CudaStatus(LaunchValidateOp(v, stream), "validation kernel"));
  return CudaStatus(LaunchCopySlots(PoolOf(pool), src_slots, PoolOf(pool), dst_slots,
                                    pool.slot_bytes(), n, stream, Verdict(record)),
                    "copy slots");
}

absl::Status CudaStreamOps::CheckRecord(const OpRecord& record, void* stream, bool reset) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, 0));
  int32_t w[kRecordVerdictWord];
  RETURN_IF_ERROR(CudaStatus(StreamSynchronize(stream), "synchronize"));
  RETURN_IF_ERROR(CudaStatus(CopyDeviceToHost(w, record.data, sizeof(w)), "read record"));
  if (w[kRecordMagic] != kCudaRecordMagic) {
    return absl::InvalidArgumentError("record: not initialized (InitRecord first)");
  }
  absl::Status st;
  if (w[kRecordFailedCalls] > 0) {
    const int32_t* f = w + kRecordStickyWord;
    const auto op = static_cast<StreamOp>(w[kRecordFirstOp]);
    const int32_t slot = w[kRecordFirstSlot];
    absl::Status detail;
    if (f[kErrFenced] != kNoError) {
      detail = absl::FailedPreconditionError(
          "pool: fenced (the attached session was detached or its lease expired)");
    } else if (f[kErrDstIsSource] != kNoError) {
      detail = absl::InvalidArgumentError(absl::StrCat("dst_slots[", f[kErrDstIsSource], "]: slot ",
                                                       slot, " is also a source of this call"));
    } else {
      static const int32_t kDstMarker = 0;  // ErrorBlockStatus names src_/dst_slots for copies
      detail = ErrorBlockStatus(f, nullptr, op == StreamOp::kCopySlots ? &kDstMarker : nullptr,
                                w[kRecordFirstPoolSlots], w[kRecordFirstPoolSlots],
                                [slot](const int32_t*, int32_t) { return absl::StrCat(slot); });
    }
    st = RecordedFailure(op, w[kRecordFirstLayer], detail.code(), detail.message(),
                         w[kRecordFailedCalls]);
  }
  if (reset) RETURN_IF_ERROR(InitRecord(record, stream));
  return st;
}

}  // namespace cuda_internal
}  // namespace statecache
