// The operations layer: every state operation of statecache as one
// transport-free function (absl::Status, proto messages in and out, no gRPC
// types). The gRPC service (server/statecache_service.h) and the data plane
// (server/dataplane/data_plane.h) are adapters over these; the service adds
// authentication, admission and the grpc::Status conversion at the edge.
//
// Each operation validates its request completely (layer, shapes, dtypes,
// byte sizes, NaN/Inf, handles) before it touches a slot, so a bad request
// writes nothing: kInvalidArgument naming the field, kNotFound for unknown
// handles / prefix keys, kFailedPrecondition for stale handles, attached
// slots and incompatible states, kResourceExhausted for full pools. Slots are
// held exclusively for the duration of a call (SlotPool::Acquire).
//
// Update and Prefill of tokens run one sequence whatever memory their
// tensors are in; a TensorSource (server/ops/tensor_source.h) resolves them:
// RequestBytes for inline bytes, the data plane's source for registered
// buffers.
//
//   ops::RequestBytes source;
//   RETURN_IF_ERROR(ops::Update(ctx, source, *model, req, &resp));
#ifndef STATECACHE_SERVER_OPS_STATE_OPS_H_
#define STATECACHE_SERVER_OPS_STATE_OPS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "proto/statecache/v1/statecache.pb.h"
#include "server/core/model_registry.h"
#include "server/ops/context.h"
#include "server/ops/tensor_source.h"

namespace statecache {
namespace ops {

// ctx.not_attached over the handles of a request (OK when it is empty).
absl::Status CheckNotAttached(const Context& ctx, const Model& m,
                              const google::protobuf::RepeatedPtrField<v1::SlotHandle>& slots,
                              absl::string_view field);
absl::Status CheckNotAttached(const Context& ctx, const Model& m, const v1::SlotHandle& slot,
                              absl::string_view field);

// One decode step of one layer on req.slots: o into resp->o (bytes, or the
// o_ref it names). Bounds, then the tensors from `source`, then the slots.
absl::Status Update(const Context& ctx, TensorSource& source, Model& m,
                    const v1::UpdateRequest& req, v1::UpdateResponse* resp);
// Everything of an Update before its slots: bounds, the tensors resolved
// into *t and made ready (value contract). For callers that hold and launch
// themselves (the data plane's SubmitUpdates); resp gets sanitized_values.
absl::Status PrepareUpdate(const Context& ctx, TensorSource& source, const Model& m,
                           const v1::UpdateRequest& req, ComputeTensors* t,
                           v1::UpdateResponse* resp);

// Prefill of inline bytes: of tokens (one layer, T tokens) or of states (all
// layers).
absl::Status Prefill(const Context& ctx, Model& m, const v1::PrefillRequest& req,
                     v1::PrefillResponse* resp);
// Prefill of tokens from `source`; the caller checked the batch (CheckBatch)
// and that req.tokens is set.
absl::Status PrefillTokens(const Context& ctx, TensorSource& source, Model& m,
                           const v1::PrefillRequest& req, v1::PrefillResponse* resp);

// Copies a slot into the model's checkpoint store under a prefix key
// (salted with m.tenant).
absl::Status Snapshot(const Context& ctx, Model& m, const v1::SnapshotRequest& req,
                      v1::SnapshotResponse* resp);
// Copies a leased checkpoint into a slot.
absl::Status Restore(const Context& ctx, Model& m, const v1::RestoreRequest& req,
                     v1::RestoreResponse* resp);
// The longest cached prefix among the candidates, leased on a hit (unless
// req.peek). Keys are salted with m.tenant (SaltKey) before the store sees
// them; responses carry the caller's wire keys.
absl::Status LookupPrefix(const Context& ctx, Model& m, const v1::LookupPrefixRequest& req,
                          v1::LookupPrefixResponse* resp);
// Drops a LookupPrefix lease (kNotFound when unknown or expired).
absl::Status ReleaseLease(const Context& ctx, Model& m, const v1::ReleaseLeaseRequest& req);
// Snapshot / Restore / LookupPrefix over req.items in order, one result per
// item: an item that fails gets its code and "items[i].<message>" and fails
// nothing else. The call fails (kInvalidArgument naming "items") only for an
// empty batch, more than ctx.limits.max_batch items, or (lookups) more than
// ctx.limits.max_lookup_tokens candidates in all.
absl::Status BatchSnapshot(const Context& ctx, Model& m, const v1::BatchSnapshotRequest& req,
                           v1::BatchSnapshotResponse* resp);
absl::Status BatchRestore(const Context& ctx, Model& m, const v1::BatchRestoreRequest& req,
                          v1::BatchRestoreResponse* resp);
absl::Status BatchLookupPrefix(const Context& ctx, Model& m,
                               const v1::BatchLookupPrefixRequest& req,
                               v1::BatchLookupPrefixResponse* resp);
// A slot's packed bytes with the compatibility tags of its layout.
absl::Status Export(const Context& ctx, Model& m, const v1::ExportRequest& req,
                    v1::ExportResponse* resp);
// Packed bytes (checked against the tags, decoded and validated in a scratch
// slot first) into a slot.
absl::Status Import(const Context& ctx, Model& m, const v1::ImportRequest& req);
// A slot's or a checkpoint's states decoded to FP32 [layers][h_v][d_k][d_v],
// natural key order (req.source: a slot, or a checkpoint by wire key and
// optional lease, read in place by CheckpointStore::Read; the lease is not
// consumed). kResourceExhausted naming max_unpack_bytes when the states
// exceed ctx.limits.max_unpack_bytes.
absl::Status Unpack(const Context& ctx, Model& m, const v1::UnpackRequest& req,
                    v1::UnpackResponse* resp);

}  // namespace ops
}  // namespace statecache

#endif  // STATECACHE_SERVER_OPS_STATE_OPS_H_
