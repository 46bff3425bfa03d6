// HostUpdate: one decode step of one layer whose inputs and output live in
// host memory (an Update request's validated bytes and its response), and
// RunHostUpdate, which runs it as one Backend::DecodeUpdate.
//
// On a backend whose memory is host memory (Backend::host_memory(), the CPU
// backend) the arrays are read and o written in place when each is aligned
// to its element type (no staging copy: the request's bytes go straight to
// the kernel, o straight into the response). Otherwise every input is packed
// into one host staging block (StagingCache::GetHost: pinned on CUDA, reused
// across calls) and the update runs as one Backend::DecodeUpdateStaged (CUDA:
// one copy in of that block, validation, kernel, one copy of o out into the
// same block, one host wait), after which o is copied into u.o. Tensor bytes
// are copied twice on the host (pack, o out) and once each way to the device.
//
//   HostUpdate u{.batch = b, .slots = access.indices().data(), ...};
//   RETURN_IF_ERROR(RunHostUpdate(*backend, staging, *m->prepared, view, layer, u, &seconds));
#ifndef STATECACHE_SERVER_HOST_UPDATE_H_
#define STATECACHE_SERVER_HOST_UPDATE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend/backend.h"
#include "kernels/layout/geometry.h"
#include "server/core/update_phases.h"
#include "server/pool/staging_cache.h"

namespace statecache {

struct HostUpdate {
  int batch = 0;
  const int32_t* slots = nullptr;  // [batch] arena indices, each held by the caller
  DType dtype = DType::kFp32;      // of q, k, v
  const void* q = nullptr;         // [batch, h_qk, d_k]
  const void* k = nullptr;         // [batch, h_qk, d_k]
  const void* v = nullptr;         // [batch, h_v, d_v]
  const float* g = nullptr;        // [batch, h_v, GateWidth()]
  const float* beta = nullptr;     // [batch, h_v]
  float* o = nullptr;              // [batch, h_v, d_v], written on OK
};

// Bytes of each array per batch item.
struct HostUpdateRow {
  int64_t slot = 4, qk = 0, v = 0, g = 0, beta = 0, o = 0;
};
HostUpdateRow RowBytesOf(const ModelGeometry& g, DType dtype);

// Runs `u` on `backend` (see above). The DecodeUpdate's status is returned
// unchanged (kInvalidArgument naming the field: nothing was written);
// staging errors (kResourceExhausted) before it. *kernel_seconds: the wall
// time of the backend's update call (with its copies when
// DecodeUpdateStaged does them). `phases` (may be null) gets the stage,
// backend and copy_out phases.
absl::Status RunHostUpdate(Backend& backend, StagingCache& staging, const PreparedModel& model,
                           const PoolView& pool, int layer, const HostUpdate& u,
                           double* kernel_seconds, UpdatePhases* phases = nullptr);

}  // namespace statecache

#endif  // STATECACHE_SERVER_HOST_UPDATE_H_
