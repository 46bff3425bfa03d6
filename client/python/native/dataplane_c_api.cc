#include "client/python/native/dataplane_c_api.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/dataplane_client.h"
#include "client/cpp/statecache_client.h"
#include "client/python/native/handle.h"

namespace {

using statecache::native::Fail;

void Handles(const uint64_t* ids, const uint32_t* gens, int n,
             std::vector<statecache::SlotHandle>* out) {
  out->resize(n);
  for (int i = 0; i < n; ++i) (*out)[i] = {ids[i], gens[i]};
}

}  // namespace

extern "C" {

int sc_attach(const char* target, const char* bearer_token, const char* model_id,
              const uint64_t* slot_ids, const uint32_t* slot_generations, int n_slots,
              int64_t lease_ms, ScAttached** out, char* err, int err_len) {
  using statecache::StateCacheClient;
  if (out == nullptr) return Fail(absl::InvalidArgumentError("out: null"), err, err_len);
  *out = nullptr;
  if (target == nullptr || model_id == nullptr) {
    return Fail(absl::InvalidArgumentError("target / model_id: null"), err, err_len);
  }
  if (n_slots < 1 || slot_ids == nullptr || slot_generations == nullptr) {
    return Fail(absl::InvalidArgumentError("slots: no slot handles given"), err, err_len);
  }
  auto a = std::make_unique<ScAttached>();
  StateCacheClient::Options options;
  if (bearer_token != nullptr) options.bearer_token = bearer_token;
  absl::StatusOr<std::unique_ptr<StateCacheClient>> client =
      StateCacheClient::Connect(target, options);
  if (!client.ok()) return Fail(client.status(), err, err_len);
  a->client = *std::move(client);
  auto session =
      statecache::DataPlaneSession::Open(a->client.get(), absl::Milliseconds(lease_ms));
  if (!session.ok()) return Fail(session.status(), err, err_len);
  a->session = *std::move(session);
  Handles(slot_ids, slot_generations, n_slots, &a->slots);
  auto attached = statecache::AttachedSession::Attach(a->session.get(), model_id, a->slots);
  if (!attached.ok()) return Fail(attached.status(), err, err_len);
  a->attached = *std::move(attached);
  // Device memory (CUDA): the caller's tensors are device pointers and its
  // stream orders the updates (OrderAfter).
  a->cuda = !a->attached->backend().host_memory();
  *out = a.release();
  return 0;
}

void sc_attached_geometry(const ScAttached* a, int32_t* geometry, float* scale) {
  const statecache::ModelGeometry& g = statecache::native::LayoutOf(a).geometry();
  geometry[0] = g.arch == statecache::Arch::kKda ? 1 : 0;
  geometry[1] = g.layers;
  geometry[2] = g.h_qk;
  geometry[3] = g.h_v;
  geometry[4] = g.d_k;
  geometry[5] = g.d_v;
  geometry[6] = a->cuda ? 1 : 0;
  if (scale != nullptr) *scale = g.scale;
}

int sc_decode_update(ScAttached* a, int layer, const uint64_t* slot_ids,
                     const uint32_t* slot_generations, int n, int dtype, const void* q,
                     const void* k, const void* v, const float* g, const float* beta, float* o,
                     uintptr_t stream, char* err, int err_len) {
  if (a == nullptr) return Fail(absl::InvalidArgumentError("handle: null"), err, err_len);
  if (absl::Status s = statecache::native::CheckAttachedHandle(a, "decode_update"); !s.ok()) {
    return Fail(s, err, err_len);
  }
  if (n < 1 || slot_ids == nullptr || slot_generations == nullptr) {
    return Fail(absl::InvalidArgumentError("slots: no slot handles given"), err, err_len);
  }
  if (dtype < SC_DTYPE_FP32 || dtype > SC_DTYPE_FP16) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("dtype: ", dtype, " is not 0, 1 or 2")),
                err, err_len);
  }
  Handles(slot_ids, slot_generations, n, &a->slots);
  if (a->cuda) {
    absl::Status s = a->attached->OrderAfter(reinterpret_cast<void*>(stream));
    if (!s.ok()) return Fail(s, err, err_len);
  }
  statecache::DecodeInputs in;
  statecache::native::SetTokenInputs(dtype, q, k, v, g, beta, o, &in);
  absl::Status s = a->attached->DecodeUpdate(layer, a->slots, in);
  return s.ok() ? 0 : Fail(s, err, err_len);
}

int sc_detach(ScAttached* a, char* err, int err_len) {
  if (a == nullptr) return Fail(absl::InvalidArgumentError("handle: null"), err, err_len);
  if (absl::Status s = statecache::native::CheckAttachedHandle(a, "detach"); !s.ok()) {
    return Fail(s, err, err_len);
  }
  absl::Status s = a->attached->Detach();
  return s.ok() ? 0 : Fail(s, err, err_len);
}

void sc_close(ScAttached* a) {
  if (a == nullptr) return;
  a->local.reset();
  a->attached.reset();  // detaches (best effort)
  a->session.reset();   // closes the session
  a->client.reset();
  delete a;
}

}  // extern "C"
