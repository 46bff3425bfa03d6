// The operations layer: every state operation of statecache as one
// transport-free function (absl::Status, proto messages in and out, no gRPC
// types). The gRPC service (server/statecache_service.h) and tests call
// these; the service adds authentication, admission and the grpc::Status
// conversion at the edge.
//
// Each operation validates its request completely (layer, shapes, dtypes,
// byte sizes, NaN/Inf, handles) before it touches a slot, so a bad request
// writes nothing: kInvalidArgument naming the field, kNotFound for unknown
// handles / prefix keys, kFailedPrecondition for stale handles, attached
// slots and incompatible states, kResourceExhausted for full pools. Slots are
// held exclusively for the duration of a call (SlotPool::Acquire).
//
// Where an Update's / Prefill's tensors live (the tensor source): inline
// request bytes are checked on the host and run through server/host_update.h
// (or the UpdateCoalescer); a request naming a registered buffer anywhere is
// resolved by the data plane (DataPlane::Update / Prefill: references,
// worker events, bounds of the registered bytes). Both share the checks of
// server/ops/checks.h, so a request fails the same way whatever its source.
//
//   ops::Context ctx{backend, &staging, /*coalescer=*/nullptr, dataplane, limits, observe};
//   RETURN_IF_ERROR(ops::Update(ctx, tenant, *model, req, &resp));
#ifndef STATECACHE_SERVER_OPS_STATE_OPS_H_
#define STATECACHE_SERVER_OPS_STATE_OPS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "kernels/backend/backend.h"
#include "proto/statecache/v1/statecache.pb.h"
#include "server/dataplane/data_plane.h"
#include "server/model_registry.h"
#include "server/pool/staging_cache.h"
#include "server/update_coalescer.h"

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
};

// Backend time of one operation: (op, seconds, batch). op is one of
// "decode_update" (once per launch; batch = its slots), "prefill",
// "pack_states", "unpack_states", "copy_slots".
using KernelObserver = std::function<void(const char* op, double seconds, int batch)>;

// What the operations run against; every pointer must outlive the calls.
struct Context {
  Backend* backend = nullptr;
  StagingCache* staging = nullptr;      // staging memory of every compute call
  UpdateCoalescer* coalescer = nullptr; // null: each Update launches alone
  DataPlane* dataplane = nullptr;       // null: no registered buffers, no attached slots
  Limits limits;
  KernelObserver observe;               // may be empty
};

// The data plane's bounds for the same limits (value contract included).
DataPlane::ComputeLimits ComputeLimitsOf(const Limits& limits);

// kFailedPrecondition naming field[i] when a slot is attached to a data-plane
// session; OK without a data plane.
absl::Status CheckNotAttached(const Context& ctx, const Model& m,
                              const google::protobuf::RepeatedPtrField<v1::SlotHandle>& slots,
                              absl::string_view field);
absl::Status CheckNotAttached(const Context& ctx, const Model& m, const v1::SlotHandle& slot,
                              absl::string_view field);

// One decode step of one layer on req.slots; o into resp (inline bytes, or
// the o_ref it names). `tenant` owns the registered buffers it may name.
absl::Status Update(const Context& ctx, const std::string& tenant, Model& m,
                    const v1::UpdateRequest& req, v1::UpdateResponse* resp);
// Prefill of tokens (one layer, T tokens) or of states (all layers).
absl::Status Prefill(const Context& ctx, const std::string& tenant, Model& m,
                     const v1::PrefillRequest& req, v1::PrefillResponse* resp);
// Copies a slot into the model's checkpoint store under a prefix key.
absl::Status Snapshot(const Context& ctx, Model& m, const v1::SnapshotRequest& req,
                      v1::SnapshotResponse* resp);
// Copies a leased checkpoint into a slot.
absl::Status Restore(const Context& ctx, Model& m, const v1::RestoreRequest& req,
                     v1::RestoreResponse* resp);
// The longest cached prefix among the candidates, leased on a hit.
absl::Status LookupPrefix(const Context& ctx, Model& m, const v1::LookupPrefixRequest& req,
                          v1::LookupPrefixResponse* resp);
// A slot's packed bytes with the compatibility tags of its layout.
absl::Status Export(const Context& ctx, Model& m, const v1::ExportRequest& req,
                    v1::ExportResponse* resp);
// Packed bytes (checked against the tags, decoded and validated in a scratch
// slot first) into a slot.
absl::Status Import(const Context& ctx, Model& m, const v1::ImportRequest& req);

}  // namespace ops
}  // namespace statecache

#endif  // STATECACHE_SERVER_OPS_STATE_OPS_H_
