// Export and Import: a slot's packed bytes out of and into the server;
// Unpack: a slot or a checkpoint as FP32 states (server/ops/state_ops.h).

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/backend/batch_validation.h"
#include "kernels/common/status_macros.h"
#include "server/ops/checks.h"
#include "server/ops/host_staging.h"
#include "server/ops/state_ops.h"
#include "server/ops/wire_key.h"
#include "server/pool/prefix_key.h"
#include "server/core/proto_convert.h"

namespace statecache {
namespace ops {

absl::Status Export(const Context& ctx, Model& m, const v1::ExportRequest& req,
                    v1::ExportResponse* resp) {
  RETURN_IF_ERROR(CheckNotAttached(ctx, m, req.slot(), "slot"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m.slots->Acquire({HandleFromProto(req.slot())}, "slot"));
  TagsToProto(m.id, m.layout, resp->mutable_tags());
  const int64_t bytes = m.slots->slot_bytes();
  std::string* packed = resp->mutable_packed();
  packed->resize(bytes);
  return ctx.backend->CopyOut(packed->data(), m.slots->view().slot(access.indices()[0]), bytes);
}

absl::Status Import(const Context& ctx, Model& m, const v1::ImportRequest& req) {
  if (!req.has_tags()) return absl::InvalidArgumentError("tags: missing");
  RETURN_IF_ERROR(CheckTagsMatch(req.tags(), m.id, m.layout));
  const int64_t bytes = m.slots->slot_bytes();
  if (static_cast<int64_t>(req.packed().size()) != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed: ", req.packed().size(), " bytes, want ", bytes));
  }
  // Decode the bytes in a scratch slot first: states that do not decode to
  // accepted values (finite, |x| <= kMaxStateMagnitude: whatever the format's
  // values or scales) are rejected before the target slot is touched.
  const ModelGeometry& g = m.layout.geometry();
  PoolView scratch = m.slots->view();
  scratch.num_slots = 1;
  const int64_t values = g.HeadsPerSlot() * g.d_k * g.d_v;
  HostStaging st;
  const int32_t zero = 0;
  const int s_idx = st.Add(&zero, sizeof(zero));
  const int s_slot = st.Add(req.packed().data(), bytes);
  const int s_states = st.Add(nullptr, values * 4);
  RETURN_IF_ERROR(st.Commit(*ctx.backend, *ctx.staging));
  scratch.base = st.at<uint8_t>(s_slot);
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(ctx.backend->UnpackStates(*m.prepared, scratch, st.at<int32_t>(s_idx), 1,
                                            st.at<float>(s_states)));
  if (ctx.observe) ctx.observe("unpack_states", SecondsSince(start), 1);
  std::vector<float> states(values);
  RETURN_IF_ERROR(ctx.backend->CopyOut(states.data(), st.at<float>(s_states), values * 4));
  RETURN_IF_ERROR(ValidateStateValues("packed (decoded state)", states.data(), values));
  RETURN_IF_ERROR(CheckNotAttached(ctx, m, req.slot(), "slot"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m.slots->Acquire({HandleFromProto(req.slot())}, "slot"));
  HostStaging dst;
  const int d_idx = dst.Add(access.indices().data(), sizeof(int32_t));
  RETURN_IF_ERROR(dst.Commit(*ctx.backend, *ctx.staging));
  return ctx.backend->CopySlots(scratch, st.at<int32_t>(s_idx), m.slots->view(),
                                dst.at<int32_t>(d_idx), 1);
}

absl::Status Unpack(const Context& ctx, Model& m, const v1::UnpackRequest& req,
                    v1::UnpackResponse* resp) {
  const ModelGeometry& g = m.layout.geometry();
  const int64_t values = g.HeadsPerSlot() * g.d_k * g.d_v;
  if (values * 4 > ctx.limits.max_unpack_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("states: ", values * 4, " bytes of FP32 states exceed max_unpack_bytes (",
                     ctx.limits.max_unpack_bytes, ")"));
  }
  // Decodes entry `index` of `pool` into resp->states.
  auto unpack = [&](const PoolView& pool, int32_t index) -> absl::Status {
    HostStaging st;
    const int s_idx = st.Add(&index, sizeof(int32_t));
    const int s_states = st.Add(nullptr, values * 4);
    RETURN_IF_ERROR(st.Commit(*ctx.backend, *ctx.staging));
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(ctx.backend->UnpackStates(*m.prepared, pool, st.at<int32_t>(s_idx), 1,
                                              st.at<float>(s_states)));
    if (ctx.observe) ctx.observe("unpack_states", SecondsSince(start), 1);
    std::string* out = resp->mutable_states();
    out->resize(values * 4);
    return ctx.backend->CopyOut(out->data(), st.at<float>(s_states), values * 4);
  };
  switch (req.source_case()) {
    case v1::UnpackRequest::kSlot: {
      if (req.lease_id() != 0) {
        return absl::InvalidArgumentError("lease_id: must be 0 when unpacking a slot");
      }
      RETURN_IF_ERROR(CheckNotAttached(ctx, m, req.slot(), "slot"));
      ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                       m.slots->Acquire({HandleFromProto(req.slot())}, "slot"));
      return unpack(m.slots->view(), access.indices()[0]);
    }
    case v1::UnpackRequest::kKey: {
      ASSIGN_OR_RETURN(const PrefixKey key, WireKey(req.key(), "key"));
      if (m.checkpoints == nullptr) {
        return absl::NotFoundError(absl::StrCat("key: no checkpoint for prefix ",
                                                key.DebugString(),
                                                " (model has no checkpoint memory)"));
      }
      return WireKeyStatus(
          m.checkpoints->Read(SaltKey(m.tenant, key), req.lease_id(), unpack), key,
          req.lease_id());
    }
    default:
      return absl::InvalidArgumentError("source: set slot or key");
  }
}

}  // namespace ops
}  // namespace statecache
