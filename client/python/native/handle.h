// The C ABI's handle (dataplane_c_api.h ScAttached) and its error helper,
// shared by the attached-mode and engine-op halves of the ABI.
#ifndef STATECACHE_CLIENT_PYTHON_NATIVE_HANDLE_H_
#define STATECACHE_CLIENT_PYTHON_NATIVE_HANDLE_H_

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cpp/dataplane_client.h"
#include "client/cpp/local_pool.h"
#include "client/cpp/statecache_client.h"
#include "kernels/backend/backend.h"

// Either an attached session (client, session, attached) or a local pool
// over caller memory (local).
struct ScAttached {
  std::unique_ptr<statecache::StateCacheClient> client;
  std::unique_ptr<statecache::DataPlaneSession> session;
  std::unique_ptr<statecache::AttachedSession> attached;
  std::unique_ptr<statecache::LocalPool> local;
  std::vector<statecache::SlotHandle> slots;  // reused per call
  bool cuda = false;
};

namespace statecache {
namespace native {

// Writes s's message into err (NUL-terminated, truncated to err_len) and
// returns its code.
inline int Fail(const absl::Status& s, char* err, int err_len) {
  if (err != nullptr && err_len > 0) {
    const std::string m(s.message());
    const size_t n = std::min(m.size(), static_cast<size_t>(err_len - 1));
    std::memcpy(err, m.data(), n);
    err[n] = '\0';
  }
  return static_cast<int>(s.code());
}

// What the engine ops use, from either kind of handle.
inline Backend& BackendOf(ScAttached* a) {
  return a->local ? a->local->backend() : a->attached->backend();
}
inline const PreparedModel& PreparedOf(const ScAttached* a) {
  return a->local ? a->local->prepared() : a->attached->prepared();
}
inline const PoolView& EnginePoolOf(const ScAttached* a) {
  return a->local ? a->local->pool() : a->attached->engine_pool();
}
inline const StateLayout& LayoutOf(const ScAttached* a) {
  return a->local ? a->local->layout() : a->attached->layout();
}
// OK for a local pool; an attached session's lease check otherwise.
inline absl::Status CheckUsable(const ScAttached* a) {
  return a->local ? absl::OkStatus() : a->attached->CheckAttached();
}
// FAILED_PRECONDITION naming `call` for a local pool (attached-mode calls).
inline absl::Status CheckAttachedHandle(const ScAttached* a, const char* call) {
  if (!a->local) return absl::OkStatus();
  return absl::FailedPreconditionError(
      std::string(call) + ": a local pool has no attached slots (index the pool directly)");
}

// A DecodeInputs / PrefillInputs's token tensors from the ABI's pointers.
template <typename Inputs>
void SetTokenInputs(int dtype, const void* q, const void* k, const void* v, const float* g,
                    const float* beta, float* o, Inputs* in) {
  in->dtype = static_cast<DType>(dtype);
  in->q = q;
  in->k = k;
  in->v = v;
  in->g = g;
  in->beta = beta;
  in->o = o;
}

}  // namespace native
}  // namespace statecache

#endif  // STATECACHE_CLIENT_PYTHON_NATIVE_HANDLE_H_
