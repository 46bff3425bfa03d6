#include "kernels/backend/stream_ops.h"

#include "absl/strings/str_cat.h"
#include "kernels/backend/batch_validation.h"
#include "kernels/common/status_macros.h"

namespace statecache {

const char* StreamOpName(StreamOp op) {
  switch (op) {
    case StreamOp::kNone: return "none";
    case StreamOp::kDecode: return "decode";
    case StreamOp::kPrefill: return "prefill";
    case StreamOp::kPack: return "pack";
    case StreamOp::kUnpack: return "unpack";
    case StreamOp::kCopySlots: return "copy_slots";
  }
  return "unknown op";
}

absl::Status RecordedFailure(StreamOp op, int layer, absl::StatusCode code,
                             absl::string_view detail, int64_t failed_calls) {
  const bool layered = op == StreamOp::kDecode || op == StreamOp::kPrefill;
  return absl::Status(code, absl::StrCat(
      StreamOpName(op), layered ? absl::StrCat(" layer ", layer) : std::string(), ": ", detail,
      " (", failed_calls, failed_calls == 1 ? " call" : " calls",
      " failed and wrote nothing)"));
}

absl::Status CheckTokenPointers(int batch, int tokens, const int32_t* slots, DType dtype,
                                const void* q, const void* k, const void* v, const float* g,
                                const float* beta) {
  if (batch < 0) return absl::InvalidArgumentError(absl::StrCat("batch: ", batch, " is negative"));
  if (tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tokens: ", tokens, " (must be >= 1)"));
  }
  if (dtype != DType::kFp32 && dtype != DType::kBf16 && dtype != DType::kFp16) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype: unknown code ", static_cast<int>(dtype)));
  }
  if (batch == 0) return absl::OkStatus();
  if (slots == nullptr) return absl::InvalidArgumentError("slots: null");
  if (q == nullptr) return absl::InvalidArgumentError("q: null");
  if (k == nullptr) return absl::InvalidArgumentError("k: null");
  if (v == nullptr) return absl::InvalidArgumentError("v: null");
  if (g == nullptr) return absl::InvalidArgumentError("g: null");
  if (beta == nullptr) return absl::InvalidArgumentError("beta: null");
  return absl::OkStatus();
}

absl::Status CheckPackArgs(const PreparedModel& model, const PoolView& pool, const int32_t* slots,
                           int n, const void* states) {
  RETURN_IF_ERROR(ValidatePoolAndLayer(model.layout(), pool, 0));
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("n: ", n, " is negative"));
  if (n > 0 && slots == nullptr) return absl::InvalidArgumentError("slots: null");
  if (n > 0 && states == nullptr) return absl::InvalidArgumentError("states: null");
  return absl::OkStatus();
}

absl::Status CheckCopyArgs(const PoolView& pool, const int32_t* src_slots,
                           const int32_t* dst_slots, int n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("n: ", n, " is negative"));
  if (n == 0) return absl::OkStatus();
  if (src_slots == nullptr) return absl::InvalidArgumentError("src_slots: null");
  if (dst_slots == nullptr) return absl::InvalidArgumentError("dst_slots: null");
  if (pool.base == nullptr) return absl::InvalidArgumentError("pool: base is null");
  return absl::OkStatus();
}

absl::Status CheckRecordSize(const StreamOps& ops, const OpRecord& record, int64_t num_slots) {
  if (record.data == nullptr) return absl::InvalidArgumentError("record: null");
  if (reinterpret_cast<uintptr_t>(record.data) % 16 != 0) {
    return absl::InvalidArgumentError("record: not 16-byte aligned");
  }
  const int64_t want = ops.RecordBytes(num_slots);
  if (record.bytes < want) {
    return absl::InvalidArgumentError(absl::StrCat("record: ", record.bytes, " bytes; a pool of ",
                                                   num_slots, " slots needs ", want));
  }
  return absl::OkStatus();
}

}  // namespace statecache
