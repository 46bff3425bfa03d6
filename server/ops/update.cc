// Update and Prefill: the compute operations (server/ops/state_ops.h), one
// sequence over a TensorSource.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/backend/batch_validation.h"
#include "kernels/common/status_macros.h"
#include "server/ops/checks.h"
#include "server/ops/host_staging.h"
#include "server/ops/state_ops.h"
#include "server/core/proto_convert.h"

namespace statecache {
namespace ops {
namespace {

void Observe(const Context& ctx, const char* op, double seconds, int batch) {
  if (ctx.observe) ctx.observe(op, seconds, batch);
}

const v1::BufferRef* RefOrNull(bool has_ref, const v1::BufferRef& ref) {
  return has_ref ? &ref : nullptr;
}

void SetOutputShape(std::initializer_list<int64_t> shape, v1::Tensor* out) {
  out->set_dtype(v1::DTYPE_FP32);
  for (int64_t d : shape) out->add_shape(d);
}

// Prefill of states: FP32 states of every layer packed into the slots.
absl::Status PrefillStates(const Context& ctx, Model& m, const v1::PrefillRequest& req,
                           v1::PrefillResponse* resp) {
  const ModelGeometry& g = m.layout.geometry();
  const int b = req.slots_size();
  RETURN_IF_ERROR(CheckWork(int64_t{b} * g.layers * g.h_v, ctx.limits.max_work_heads, "states"));
  ASSIGN_OR_RETURN(TensorBytes states, CheckTensor(req.states(), "states", kFp32Only,
                                                   {b, g.layers, g.h_v, g.d_k, g.d_v}));
  RETURN_IF_ERROR(
      ValidateStateValues("states", static_cast<const float*>(states.data), states.count));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m.slots->Acquire(HandlesFromProto(req.slots()), "slots"));
  HostStaging st;
  const int s_idx = st.Add(access.indices().data(), b * sizeof(int32_t));
  const int s_states = st.Add(states.data, states.bytes);
  RETURN_IF_ERROR(st.Commit(*ctx.backend, *ctx.staging));
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(ctx.backend->PackStates(*m.prepared, m.slots->view(), st.at<int32_t>(s_idx), b,
                                          st.at<float>(s_states)));
  const double kernel = SecondsSince(start);
  resp->set_kernel_micros(static_cast<int64_t>(kernel * 1e6));
  Observe(ctx, "pack_states", kernel, b);
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckNotAttached(const Context& ctx, const Model& m,
                              const google::protobuf::RepeatedPtrField<v1::SlotHandle>& slots,
                              absl::string_view field) {
  if (!ctx.not_attached) return absl::OkStatus();
  return ctx.not_attached(m, HandlesFromProto(slots), field);
}

absl::Status CheckNotAttached(const Context& ctx, const Model& m, const v1::SlotHandle& slot,
                              absl::string_view field) {
  if (!ctx.not_attached) return absl::OkStatus();
  return ctx.not_attached(m, {HandleFromProto(slot)}, field);
}

absl::Status PrepareUpdate(const Context& ctx, TensorSource& source, const Model& m,
                           const v1::UpdateRequest& req, ComputeTensors* t,
                           v1::UpdateResponse* resp) {
  const ModelGeometry& g = m.layout.geometry();
  RETURN_IF_ERROR(CheckLayer(req.layer(), g.layers, "layer"));
  const int b = req.slots_size();
  RETURN_IF_ERROR(CheckBatch(b, ctx.limits.max_batch, "slots"));
  RETURN_IF_ERROR(CheckWork(int64_t{b} * g.h_v, ctx.limits.max_work_heads, "slots"));
  RETURN_IF_ERROR(source.CheckSanitize(req.sanitize_non_finite(), ""));
  ASSIGN_OR_RETURN(t->q, source.Input(req.q(), "q", kInputDTypes, {b, g.h_qk, g.d_k}));
  const DType dtype = t->q.dtype;
  ASSIGN_OR_RETURN(t->k, source.Input(req.k(), "k", {dtype}, {b, g.h_qk, g.d_k}));
  ASSIGN_OR_RETURN(t->v, source.Input(req.v(), "v", {dtype}, {b, g.h_v, g.d_v}));
  std::vector<int64_t> g_shape = {b, g.h_v};
  if (g.arch == Arch::kKda) g_shape.push_back(g.d_k);
  ASSIGN_OR_RETURN(t->g, source.Input(req.g(), "g", kFp32Only, g_shape));
  ASSIGN_OR_RETURN(t->beta, source.Input(req.beta(), "beta", kFp32Only, {b, g.h_v}));
  ASSIGN_OR_RETURN(t->o, source.Output(RefOrNull(req.has_o_ref(), req.o_ref()), "o",
                                       int64_t{b} * g.h_v * g.d_v, resp->mutable_o()));
  int64_t sanitized = 0;
  RETURN_IF_ERROR(source.Ready(ctx, "", req.sanitize_non_finite(), g.d_k, t, &sanitized));
  if (req.sanitize_non_finite()) resp->set_sanitized_values(sanitized);
  return absl::OkStatus();
}

absl::Status Update(const Context& ctx, TensorSource& source, Model& m,
                    const v1::UpdateRequest& req, v1::UpdateResponse* resp) {
  PhaseClock total(ctx.phases), clock(ctx.phases);
  ComputeTensors t;
  RETURN_IF_ERROR(PrepareUpdate(ctx, source, m, req, &t, resp));
  clock.Lap(UpdatePhases::kChecks);
  RETURN_IF_ERROR(CheckNotAttached(ctx, m, req.slots(), "slots"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m.slots->Acquire(HandlesFromProto(req.slots()), "slots"));
  clock.Lap(UpdatePhases::kSlots);
  ASSIGN_OR_RETURN(Launch launch, source.RunUpdate(ctx, m, req.layer(), access.indices(), t));
  const ModelGeometry& g = m.layout.geometry();
  v1::Tensor* out = resp->mutable_o();
  SetOutputShape({req.slots_size(), g.h_v, g.d_v}, out);
  RETURN_IF_ERROR(source.Finish(t, RefOrNull(req.has_o_ref(), req.o_ref()), out));
  resp->set_kernel_micros(static_cast<int64_t>(launch.kernel_seconds * 1e6));
  // Once per launch: its batch is every merged call's slots.
  if (launch.leader) Observe(ctx, "decode_update", launch.kernel_seconds, launch.batch);
  total.Lap(UpdatePhases::kTotal);
  return absl::OkStatus();
}

absl::Status PrefillTokens(const Context& ctx, TensorSource& source, Model& m,
                           const v1::PrefillRequest& req, v1::PrefillResponse* resp) {
  const ModelGeometry& g = m.layout.geometry();
  const Limits& limits = ctx.limits;
  const int b = req.slots_size();
  const v1::PrefillTokens& t = req.tokens();
  RETURN_IF_ERROR(CheckLayer(t.layer(), g.layers, "tokens.layer"));
  if (t.q().shape_size() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens.q.shape: ",
        ShapeString(std::vector<int64_t>(t.q().shape().begin(), t.q().shape().end())),
        ", want [B, T, h_qk, d_k]"));
  }
  const int64_t tokens = t.q().shape(1);
  if (tokens < 1 || tokens > limits.max_prefill_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("tokens.q.shape[1]: T = ", tokens,
                                                   " is outside 1..", limits.max_prefill_tokens));
  }
  RETURN_IF_ERROR(CheckWork(int64_t{b} * tokens * g.h_v, limits.max_work_heads, "tokens"));
  RETURN_IF_ERROR(source.CheckSanitize(t.sanitize_non_finite(), "tokens."));
  ComputeTensors ct;
  ASSIGN_OR_RETURN(ct.q,
                   source.Input(t.q(), "tokens.q", kInputDTypes, {b, tokens, g.h_qk, g.d_k}));
  const DType dtype = ct.q.dtype;
  ASSIGN_OR_RETURN(ct.k, source.Input(t.k(), "tokens.k", {dtype}, {b, tokens, g.h_qk, g.d_k}));
  ASSIGN_OR_RETURN(ct.v, source.Input(t.v(), "tokens.v", {dtype}, {b, tokens, g.h_v, g.d_v}));
  std::vector<int64_t> g_shape = {b, tokens, g.h_v};
  if (g.arch == Arch::kKda) g_shape.push_back(g.d_k);
  ASSIGN_OR_RETURN(ct.g, source.Input(t.g(), "tokens.g", kFp32Only, g_shape));
  ASSIGN_OR_RETURN(ct.beta,
                   source.Input(t.beta(), "tokens.beta", kFp32Only, {b, tokens, g.h_v}));
  if (t.want_output()) {
    ASSIGN_OR_RETURN(ct.o, source.Output(RefOrNull(t.has_o_ref(), t.o_ref()), "tokens.o",
                                         int64_t{b} * tokens * g.h_v * g.d_v, resp->mutable_o()));
  } else if (t.has_o_ref()) {
    return absl::InvalidArgumentError("tokens.o_ref: set want_output to write o");
  }
  int64_t sanitized = 0;
  RETURN_IF_ERROR(source.Ready(ctx, "tokens.", t.sanitize_non_finite(), g.d_k, &ct, &sanitized));
  if (t.sanitize_non_finite()) resp->set_sanitized_values(sanitized);

  RETURN_IF_ERROR(CheckNotAttached(ctx, m, req.slots(), "slots"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m.slots->Acquire(HandlesFromProto(req.slots()), "slots"));
  ASSIGN_OR_RETURN(Launch launch, source.RunPrefill(ctx, m, t.layer(), static_cast<int>(tokens),
                                                    access.indices(), ct));
  if (t.want_output()) {
    v1::Tensor* out = resp->mutable_o();
    SetOutputShape({b, tokens, g.h_v, g.d_v}, out);
    RETURN_IF_ERROR(source.Finish(ct, RefOrNull(t.has_o_ref(), t.o_ref()), out));
  }
  resp->set_kernel_micros(static_cast<int64_t>(launch.kernel_seconds * 1e6));
  Observe(ctx, "prefill", launch.kernel_seconds, launch.batch);
  return absl::OkStatus();
}

absl::Status Prefill(const Context& ctx, Model& m, const v1::PrefillRequest& req,
                     v1::PrefillResponse* resp) {
  RETURN_IF_ERROR(CheckBatch(req.slots_size(), ctx.limits.max_batch, "slots"));
  RETURN_IF_ERROR(CheckNotAttached(ctx, m, req.slots(), "slots"));
  if (req.input_case() == v1::PrefillRequest::kStates) return PrefillStates(ctx, m, req, resp);
  if (req.input_case() != v1::PrefillRequest::kTokens) {
    return absl::InvalidArgumentError("input: set tokens or states");
  }
  RequestBytes source;
  return PrefillTokens(ctx, source, m, req, resp);
}

}  // namespace ops
}  // namespace statecache
