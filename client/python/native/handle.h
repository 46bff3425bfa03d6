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
#include "client/cpp/statecache_client.h"
#include "kernels/backend/backend.h"

struct ScAttached {
  std::unique_ptr<statecache::StateCacheClient> client;
  std::unique_ptr<statecache::DataPlaneSession> session;
  std::unique_ptr<statecache::AttachedSession> attached;
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
