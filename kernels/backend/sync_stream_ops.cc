#include "kernels/backend/sync_stream_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/backend/batch_validation.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

constexpr uint32_t kHostRecordMagic = 0x53435231;  // "SCR1"

// The host record: the first failure's op, layer and message, and the number
// of failed calls since the last reset.
struct HostRecord {
  uint32_t magic;
  int32_t op;  // StreamOp
  int32_t layer;
  int32_t message_bytes;
  int64_t failed_calls;
  int32_t code;  // absl::StatusCode of the first failure
  char message[484];
};
static_assert(sizeof(HostRecord) == 512, "host record size");

HostRecord* RecordOf(const OpRecord& record) { return static_cast<HostRecord*>(record.data); }

// kFailedPrecondition when the pool's fence word is set (the call must write
// nothing), else `run()`.
template <typename F>
absl::Status UnlessFenced(const PoolView& pool, F run) {
  if (pool.fence != nullptr && *pool.fence != 0) {
    return absl::FailedPreconditionError(
        "pool: fenced (the attached session was detached or its lease expired)");
  }
  return run();
}

// Destinations unique, in range, not a source; sources in range; pairs with a
// -1 skipped.
absl::Status ValidateCopyPairs(const PoolView& pool, const int32_t* src, const int32_t* dst,
                               int n) {
  std::vector<char> is_src(static_cast<size_t>(pool.num_slots), 0);
  std::vector<char> is_dst(static_cast<size_t>(pool.num_slots), 0);
  const auto in_range = [&](int32_t s) { return s >= 0 && s < pool.num_slots; };
  for (int i = 0; i < n; ++i) {
    if (src[i] == -1 || dst[i] == -1) continue;
    if (!in_range(src[i])) {
      return absl::InvalidArgumentError(absl::StrCat("src_slots[", i, "]: ", src[i],
                                                     " is outside 0..", pool.num_slots - 1));
    }
    if (!in_range(dst[i])) {
      return absl::InvalidArgumentError(absl::StrCat("dst_slots[", i, "]: ", dst[i],
                                                     " is outside 0..", pool.num_slots - 1));
    }
    is_src[src[i]] = 1;
  }
  for (int i = 0; i < n; ++i) {
    if (src[i] == -1 || dst[i] == -1) continue;
    if (is_dst[dst[i]]) {
      return absl::InvalidArgumentError(
          absl::StrCat("dst_slots[", i, "]: slot ", dst[i], " appears twice in one batch"));
    }
    is_dst[dst[i]] = 1;
    if (is_src[dst[i]]) {
      return absl::InvalidArgumentError(
          absl::StrCat("dst_slots[", i, "]: slot ", dst[i], " is also a source of this call"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t SyncStreamOps::RecordBytes(int64_t /*num_slots*/) const { return sizeof(HostRecord); }

absl::Status SyncStreamOps::InitRecord(const OpRecord& record, void* /*stream*/) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, 0));
  HostRecord* r = RecordOf(record);
  std::memset(r, 0, sizeof(*r));
  r->magic = kHostRecordMagic;
  return absl::OkStatus();
}

absl::Status SyncStreamOps::Record(const OpRecord& record, StreamOp op, int layer,
                                   absl::Status st) {
  if (st.ok() || (st.code() != absl::StatusCode::kInvalidArgument &&
                  st.code() != absl::StatusCode::kFailedPrecondition)) {
    return st;
  }
  HostRecord* r = RecordOf(record);
  if (r->failed_calls++ == 0) {
    r->code = static_cast<int32_t>(st.code());
    r->op = static_cast<int32_t>(op);
    r->layer = layer;
    const absl::string_view m = st.message();
    const size_t bytes = std::min(m.size(), sizeof(r->message));
    std::memcpy(r->message, m.data(), bytes);
    r->message_bytes = static_cast<int32_t>(bytes);
  }
  return absl::OkStatus();
}

absl::Status SyncStreamOps::EnqueueDecode(const PreparedModel& model, const PoolView& pool,
                                          int layer, const DecodeInputs& in,
                                          const OpRecord& record, void* /*stream*/) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, pool.num_slots));
  RETURN_IF_ERROR(ValidatePoolAndLayer(model.layout(), pool, layer));
  RETURN_IF_ERROR(
      CheckTokenPointers(in.batch, 1, in.slots, in.dtype, in.q, in.k, in.v, in.g, in.beta));
  if (in.batch > 0 && in.o == nullptr) return absl::InvalidArgumentError("o: null");
  return Record(record, StreamOp::kDecode, layer, UnlessFenced(pool, [&] {
                  return backend_.DecodeUpdate(model, pool, layer, in);
                }));
}

absl::Status SyncStreamOps::EnqueuePrefill(const PreparedModel& model, const PoolView& pool,
                                           int layer, const PrefillInputs& in,
                                           const OpRecord& record, void* /*stream*/) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, pool.num_slots));
  RETURN_IF_ERROR(ValidatePoolAndLayer(model.layout(), pool, layer));
  RETURN_IF_ERROR(CheckTokenPointers(in.batch, in.tokens, in.slots, in.dtype, in.q, in.k, in.v,
                                     in.g, in.beta));
  return Record(record, StreamOp::kPrefill, layer,
                UnlessFenced(pool, [&] { return backend_.Prefill(model, pool, layer, in); }));
}

absl::Status SyncStreamOps::EnqueuePack(const PreparedModel& model, const PoolView& pool,
                                        const int32_t* slots, int n, const float* states,
                                        const OpRecord& record, void* /*stream*/) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, pool.num_slots));
  RETURN_IF_ERROR(CheckPackArgs(model, pool, slots, n, states));
  return Record(record, StreamOp::kPack, -1, UnlessFenced(pool, [&] {
                  return backend_.PackStates(model, pool, slots, n, states);
                }));
}

absl::Status SyncStreamOps::EnqueueUnpack(const PreparedModel& model, const PoolView& pool,
                                          const int32_t* slots, int n, float* states,
                                          const OpRecord& record, void* /*stream*/) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, pool.num_slots));
  RETURN_IF_ERROR(CheckPackArgs(model, pool, slots, n, states));
  return Record(record, StreamOp::kUnpack, -1, UnlessFenced(pool, [&] {
                  return backend_.UnpackStates(model, pool, slots, n, states);
                }));
}

absl::Status SyncStreamOps::EnqueueCopySlots(const PoolView& pool, const int32_t* src_slots,
                                             const int32_t* dst_slots, int n,
                                             const OpRecord& record, void* /*stream*/) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, pool.num_slots));
  RETURN_IF_ERROR(CheckCopyArgs(pool, src_slots, dst_slots, n));
  if (n == 0) return absl::OkStatus();
  absl::Status st =
      UnlessFenced(pool, [&] { return ValidateCopyPairs(pool, src_slots, dst_slots, n); });
  for (int i = 0; st.ok() && i < n; ++i) {
    if (src_slots[i] == -1 || dst_slots[i] == -1) continue;
    st = backend_.CopySlots(pool, src_slots + i, pool, dst_slots + i, 1);
  }
  return Record(record, StreamOp::kCopySlots, -1, st);
}

absl::Status SyncStreamOps::CheckRecord(const OpRecord& record, void* /*stream*/, bool reset) {
  RETURN_IF_ERROR(CheckRecordSize(*this, record, 0));
  HostRecord* r = RecordOf(record);
  if (r->magic != kHostRecordMagic) {
    return absl::InvalidArgumentError("record: not initialized (InitRecord first)");
  }
  absl::Status st;
  if (r->failed_calls > 0) {
    st = RecordedFailure(static_cast<StreamOp>(r->op), r->layer,
                         static_cast<absl::StatusCode>(r->code),
                         absl::string_view(r->message, r->message_bytes), r->failed_calls);
  }
  if (reset) RETURN_IF_ERROR(InitRecord(record, nullptr));
  return st;
}

}  // namespace statecache
