// The engine-op half of the C ABI (dataplane_c_api.h, "Engine ops"): thin
// adapters from raw pointers to AttachedSession + StreamOps.
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/dataplane_client.h"
#include "client/python/native/dataplane_c_api.h"
#include "client/python/native/handle.h"
#include "kernels/backend/stream_ops.h"

namespace {

using statecache::OpRecord;
using statecache::StreamOps;
using statecache::native::BackendOf;
using statecache::native::CheckAttachedHandle;
using statecache::native::EnginePoolOf;
using statecache::native::Fail;
using statecache::native::PreparedOf;

void* Stream(uintptr_t s) { return reinterpret_cast<void*>(s); }

// The session's ops after the host-side lease check, or an error code.
int Ops(ScAttached* a, StreamOps** ops, char* err, int err_len) {
  if (a == nullptr) return Fail(absl::InvalidArgumentError("handle: null"), err, err_len);
  const absl::Status s = statecache::native::CheckUsable(a);
  if (!s.ok()) return Fail(s, err, err_len);
  *ops = &statecache::native::BackendOf(a).stream_ops();
  return 0;
}

int Done(const absl::Status& s, char* err, int err_len) { return s.ok() ? 0 : Fail(s, err, err_len); }

}  // namespace

extern "C" {

int sc_slot_indices(const ScAttached* a, const uint64_t* slot_ids,
                    const uint32_t* slot_generations, int n, int32_t* out, char* err,
                    int err_len) {
  if (a == nullptr) return Fail(absl::InvalidArgumentError("handle: null"), err, err_len);
  if (absl::Status s = CheckAttachedHandle(a, "slot_indices"); !s.ok()) {
    return Fail(s, err, err_len);
  }
  if (n < 0 || (n > 0 && (slot_ids == nullptr || slot_generations == nullptr || out == nullptr))) {
    return Fail(absl::InvalidArgumentError("slots: no slot handles given"), err, err_len);
  }
  for (int i = 0; i < n; ++i) {
    out[i] = a->attached->IndexOf({slot_ids[i], slot_generations[i]});
    if (out[i] < 0) {
      return Fail(absl::FailedPreconditionError(
                      absl::StrCat("slots[", i, "]: not attached by this session")),
                  err, err_len);
    }
  }
  return 0;
}

int64_t sc_pool_slots(const ScAttached* a) { return EnginePoolOf(a).num_slots; }

int64_t sc_record_bytes(const ScAttached* a) {
  return BackendOf(const_cast<ScAttached*>(a)).stream_ops().RecordBytes(
      EnginePoolOf(a).num_slots);
}

int sc_record_init(ScAttached* a, void* record, int64_t record_bytes, uintptr_t stream,
                   char* err, int err_len) {
  if (a == nullptr) return Fail(absl::InvalidArgumentError("handle: null"), err, err_len);
  return Done(BackendOf(a).stream_ops().InitRecord(OpRecord{record, record_bytes},
                                                            Stream(stream)),
              err, err_len);
}

int sc_record_check(ScAttached* a, void* record, int64_t record_bytes, uintptr_t stream,
                    int reset, char* err, int err_len) {
  if (a == nullptr) return Fail(absl::InvalidArgumentError("handle: null"), err, err_len);
  return Done(BackendOf(a).stream_ops().CheckRecord(OpRecord{record, record_bytes},
                                                             Stream(stream), reset != 0),
              err, err_len);
}

int sc_renew(ScAttached* a, char* err, int err_len) {
  if (a == nullptr) return Fail(absl::InvalidArgumentError("handle: null"), err, err_len);
  if (a->local) return 0;  // nothing to renew
  return Done(a->attached->Renew(), err, err_len);
}

void sc_renew_in_background(ScAttached* a) {
  if (a != nullptr && !a->local) a->attached->RenewInBackground();
}

int sc_op_decode(ScAttached* a, int layer, const int32_t* slots, int n, int dtype, const void* q,
                 const void* k, const void* v, const float* g, const float* beta, float* o,
                 void* record, int64_t record_bytes, uintptr_t stream, char* err, int err_len) {
  StreamOps* ops = nullptr;
  if (int rc = Ops(a, &ops, err, err_len)) return rc;
  statecache::DecodeInputs in;
  in.batch = n;
  in.slots = slots;
  statecache::native::SetTokenInputs(dtype, q, k, v, g, beta, o, &in);
  return Done(ops->EnqueueDecode(PreparedOf(a), EnginePoolOf(a), layer, in,
                                 OpRecord{record, record_bytes}, Stream(stream)),
              err, err_len);
}

int sc_op_prefill(ScAttached* a, int layer, const int32_t* slots, int n, int tokens, int dtype,
                  const void* q, const void* k, const void* v, const float* g, const float* beta,
                  float* o, void* record, int64_t record_bytes, uintptr_t stream, char* err,
                  int err_len) {
  StreamOps* ops = nullptr;
  if (int rc = Ops(a, &ops, err, err_len)) return rc;
  statecache::PrefillInputs in;
  in.batch = n;
  in.tokens = tokens;
  in.slots = slots;
  statecache::native::SetTokenInputs(dtype, q, k, v, g, beta, o, &in);
  return Done(ops->EnqueuePrefill(PreparedOf(a), EnginePoolOf(a), layer, in,
                                  OpRecord{record, record_bytes}, Stream(stream)),
              err, err_len);
}

int sc_op_pack(ScAttached* a, const int32_t* slots, int n, const float* states, void* record,
               int64_t record_bytes, uintptr_t stream, char* err, int err_len) {
  StreamOps* ops = nullptr;
  if (int rc = Ops(a, &ops, err, err_len)) return rc;
  return Done(ops->EnqueuePack(PreparedOf(a), EnginePoolOf(a), slots, n,
                               states, OpRecord{record, record_bytes}, Stream(stream)),
              err, err_len);
}

int sc_op_unpack(ScAttached* a, const int32_t* slots, int n, float* states, void* record,
                 int64_t record_bytes, uintptr_t stream, char* err, int err_len) {
  StreamOps* ops = nullptr;
  if (int rc = Ops(a, &ops, err, err_len)) return rc;
  return Done(ops->EnqueueUnpack(PreparedOf(a), EnginePoolOf(a), slots, n,
                                 states, OpRecord{record, record_bytes}, Stream(stream)),
              err, err_len);
}

int sc_op_copy(ScAttached* a, const int32_t* src_slots, const int32_t* dst_slots, int n,
               void* record, int64_t record_bytes, uintptr_t stream, char* err, int err_len) {
  StreamOps* ops = nullptr;
  if (int rc = Ops(a, &ops, err, err_len)) return rc;
  return Done(ops->EnqueueCopySlots(EnginePoolOf(a), src_slots, dst_slots, n,
                                    OpRecord{record, record_bytes}, Stream(stream)),
              err, err_len);
}

}  // extern "C"
