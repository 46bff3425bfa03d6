// What the operations of server/ops run against: the backend, staging
// memory, the Update coalescer, request limits, the kernel-time observer,
// the attached-slot check of the data plane and the optional Update phase
// times. Every pointer must outlive the
// calls that use the context.
#ifndef STATECACHE_SERVER_OPS_CONTEXT_H_
#define STATECACHE_SERVER_OPS_CONTEXT_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/backend/backend.h"
#include "server/core/model_registry.h"
#include "server/pool/slot_handle.h"
#include "server/pool/staging_cache.h"
#include "server/core/update_coalescer.h"
#include "server/core/update_phases.h"

namespace statecache {
namespace ops {

// Per-request work bounds (kInvalidArgument naming the field beyond them).
struct Limits {
  int max_batch = 4096;               // slots per Update / Prefill
  int max_allocate = 4096;            // slots per AllocateSlots
  int64_t max_prefill_tokens = 1 << 16;
  int64_t max_aux_bytes = 64 << 20;   // per checkpoint, all layers
  int64_t max_lookup_tokens = 1 << 20;
  // Head updates per request: B x h_v (Update), B x T x h_v (Prefill of
  // tokens), B x layers x h_v (Prefill of states).
  int64_t max_work_heads = int64_t{1} << 24;
  // Largest |v| accepted by Update / Prefill (q and k must be
  // L2-normalized); keeps the recurrence finite. 65504 = fp16 max.
  float max_abs_value = 65504.f;
  bool log_cache_events = false;      // one line per snapshot / restore / lookup
  // Trajectory file bytes per Calibrate call, all messages together
  // (kResourceExhausted naming "max_calibration_bytes" beyond it).
  int64_t max_calibration_bytes = int64_t{1} << 30;
  // FP32 state bytes one Unpack response may carry (layers * h_v * d_k *
  // d_v * 4; kResourceExhausted naming "max_unpack_bytes" beyond it).
  int64_t max_unpack_bytes = int64_t{256} << 20;
};

// Backend time of one operation: (op, seconds, batch). op is one of
// "decode_update" (once per launch; batch = its slots), "prefill",
// "pack_states", "unpack_states", "copy_slots".
using KernelObserver = std::function<void(const char* op, double seconds, int batch)>;

// kFailedPrecondition naming field[i] when handles[i] of `model` is attached
// to a data-plane session (DataPlane::CheckNotAttached).
using AttachCheck = std::function<absl::Status(const Model& model,
                                               absl::Span<const SlotHandle> handles,
                                               absl::string_view field)>;

struct Context {
  Backend* backend = nullptr;
  StagingCache* staging = nullptr;       // staging of inline bytes (null: none staged)
  UpdateCoalescer* coalescer = nullptr;  // null: each Update launches alone
  Limits limits;
  KernelObserver observe;                // may be empty
  AttachCheck not_attached;              // empty: no slot is ever attached
  UpdatePhases* phases = nullptr;        // Update of inline bytes, per phase (null: not timed)
};

}  // namespace ops
}  // namespace statecache

#endif  // STATECACHE_SERVER_OPS_CONTEXT_H_
