// Update and Prefill: the compute operations (server/ops/state_ops.h).

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/backend/batch_validation.h"
#include "kernels/common/status_macros.h"
#include "server/host_update.h"
#include "server/ops/checks.h"
#include "server/ops/host_staging.h"
#include "server/ops/state_ops.h"
#include "server/proto_convert.h"

namespace statecache {
namespace ops {
namespace {

void Observe(const Context& ctx, const char* op, double seconds, int batch) {
  if (ctx.observe) ctx.observe(op, seconds, batch);
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

// Prefill of tokens from inline bytes.
absl::Status PrefillTokens(const Context& ctx, Model& m, const v1::PrefillRequest& req,
                           v1::PrefillResponse* resp) {
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
  ASSIGN_OR_RETURN(TensorBytes q,
                   CheckTensor(t.q(), "tokens.q", kInputDTypes, {b, tokens, g.h_qk, g.d_k}));
  ASSIGN_OR_RETURN(TensorBytes k,
                   CheckTensor(t.k(), "tokens.k", {q.dtype}, {b, tokens, g.h_qk, g.d_k}));
  ASSIGN_OR_RETURN(TensorBytes v,
                   CheckTensor(t.v(), "tokens.v", {q.dtype}, {b, tokens, g.h_v, g.d_v}));
  std::vector<int64_t> g_shape = {b, tokens, g.h_v};
  if (g.arch == Arch::kKda) g_shape.push_back(g.d_k);
  ASSIGN_OR_RETURN(TensorBytes gt, CheckTensor(t.g(), "tokens.g", kFp32Only, g_shape));
  ASSIGN_OR_RETURN(TensorBytes bt,
                   CheckTensor(t.beta(), "tokens.beta", kFp32Only, {b, tokens, g.h_v}));
  std::vector<float> gates = Floats(gt), betas = Floats(bt);
  std::string q_clean, k_clean, v_clean;
  if (t.sanitize_non_finite()) {
    resp->set_sanitized_values(SanitizeTensor(&q, &q_clean) + SanitizeTensor(&k, &k_clean) +
                               SanitizeTensor(&v, &v_clean) + SanitizeFloats(&gates) +
                               SanitizeFloats(&betas));
  }
  RETURN_IF_ERROR(ValidateFinite("tokens.q", q.dtype, q.data, q.count));
  RETURN_IF_ERROR(ValidateFinite("tokens.k", k.dtype, k.data, k.count));
  RETURN_IF_ERROR(ValidateFinite("tokens.v", v.dtype, v.data, v.count));
  RETURN_IF_ERROR(CheckMagnitudes("tokens.", q, k, v, g.d_k, limits.max_abs_value));
  {
    absl::Status gate_status = ValidateGates(gates.data(), gt.count, betas.data(), bt.count);
    if (!gate_status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tokens.", gate_status.message()));
    }
  }

  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m.slots->Acquire(HandlesFromProto(req.slots()), "slots"));
  const int64_t o_count = t.want_output() ? int64_t{b} * tokens * g.h_v * g.d_v : 0;
  HostStaging st;
  const int s_idx = st.Add(access.indices().data(), b * sizeof(int32_t));
  const int s_q = st.Add(q.data, q.bytes), s_k = st.Add(k.data, k.bytes),
            s_v = st.Add(v.data, v.bytes);
  const int s_g = st.Add(gates.data(), gt.bytes), s_b = st.Add(betas.data(), bt.bytes);
  const int s_o = st.Add(nullptr, o_count * 4);
  RETURN_IF_ERROR(st.Commit(*ctx.backend, *ctx.staging));
  PrefillInputs in;
  in.batch = b;
  in.tokens = static_cast<int>(tokens);
  in.slots = st.at<int32_t>(s_idx);
  in.dtype = q.dtype;
  in.q = st.at<void>(s_q);
  in.k = st.at<void>(s_k);
  in.v = st.at<void>(s_v);
  in.g = st.at<float>(s_g);
  in.beta = st.at<float>(s_b);
  in.o = t.want_output() ? st.at<float>(s_o) : nullptr;
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(ctx.backend->Prefill(*m.prepared, m.slots->view(), t.layer(), in));
  const double kernel = SecondsSince(start);
  if (t.want_output()) {
    v1::Tensor* o = resp->mutable_o();
    o->set_dtype(v1::DTYPE_FP32);
    for (int64_t d : {int64_t{b}, tokens, int64_t{g.h_v}, int64_t{g.d_v}}) o->add_shape(d);
    std::string* data = o->mutable_data();
    data->resize(o_count * 4);
    RETURN_IF_ERROR(ctx.backend->CopyOut(data->data(), in.o, o_count * 4));
  }
  resp->set_kernel_micros(static_cast<int64_t>(kernel * 1e6));
  Observe(ctx, "prefill", kernel, b);
  return absl::OkStatus();
}

}  // namespace

DataPlane::ComputeLimits ComputeLimitsOf(const Limits& l) {
  DataPlane::ComputeLimits c;
  c.max_batch = l.max_batch;
  c.max_work_heads = l.max_work_heads;
  c.max_prefill_tokens = l.max_prefill_tokens;
  const float max_abs_value = l.max_abs_value;
  c.host_value_check = [max_abs_value](absl::string_view prefix, const TensorBytes& q,
                                       const TensorBytes& k, const TensorBytes& v, int d_k) {
    return CheckMagnitudes(prefix, q, k, v, d_k, max_abs_value);
  };
  return c;
}

absl::Status CheckNotAttached(const Context& ctx, const Model& m,
                              const google::protobuf::RepeatedPtrField<v1::SlotHandle>& slots,
                              absl::string_view field) {
  if (ctx.dataplane == nullptr) return absl::OkStatus();
  return ctx.dataplane->CheckNotAttached(m, HandlesFromProto(slots), field);
}

absl::Status CheckNotAttached(const Context& ctx, const Model& m, const v1::SlotHandle& slot,
                              absl::string_view field) {
  if (ctx.dataplane == nullptr) return absl::OkStatus();
  return ctx.dataplane->CheckNotAttached(m, {HandleFromProto(slot)}, field);
}

absl::Status Update(const Context& ctx, const std::string& tenant, Model& m,
                    const v1::UpdateRequest& req, v1::UpdateResponse* resp) {
  if (ctx.dataplane != nullptr && DataPlane::UsesBuffers(req)) {
    return ctx.dataplane->Update(tenant, m, req, ComputeLimitsOf(ctx.limits), ctx.observe, resp);
  }
  const ModelGeometry& g = m.layout.geometry();
  const Limits& limits = ctx.limits;
  RETURN_IF_ERROR(CheckLayer(req.layer(), g.layers, "layer"));
  const int b = req.slots_size();
  RETURN_IF_ERROR(CheckBatch(b, limits.max_batch, "slots"));
  RETURN_IF_ERROR(CheckWork(int64_t{b} * g.h_v, limits.max_work_heads, "slots"));
  ASSIGN_OR_RETURN(TensorBytes q, CheckTensor(req.q(), "q", kInputDTypes, {b, g.h_qk, g.d_k}));
  ASSIGN_OR_RETURN(TensorBytes k, CheckTensor(req.k(), "k", {q.dtype}, {b, g.h_qk, g.d_k}));
  ASSIGN_OR_RETURN(TensorBytes v, CheckTensor(req.v(), "v", {q.dtype}, {b, g.h_v, g.d_v}));
  std::vector<int64_t> g_shape = {b, g.h_v};
  if (g.arch == Arch::kKda) g_shape.push_back(g.d_k);
  ASSIGN_OR_RETURN(TensorBytes gt, CheckTensor(req.g(), "g", kFp32Only, g_shape));
  ASSIGN_OR_RETURN(TensorBytes bt, CheckTensor(req.beta(), "beta", kFp32Only, {b, g.h_v}));
  std::vector<float> gates = Floats(gt), betas = Floats(bt);
  std::string q_clean, k_clean, v_clean;
  if (req.sanitize_non_finite()) {
    resp->set_sanitized_values(SanitizeTensor(&q, &q_clean) + SanitizeTensor(&k, &k_clean) +
                               SanitizeTensor(&v, &v_clean) + SanitizeFloats(&gates) +
                               SanitizeFloats(&betas));
  }
  RETURN_IF_ERROR(ValidateFinite("q", q.dtype, q.data, q.count));
  RETURN_IF_ERROR(ValidateFinite("k", k.dtype, k.data, k.count));
  RETURN_IF_ERROR(ValidateFinite("v", v.dtype, v.data, v.count));
  RETURN_IF_ERROR(CheckMagnitudes("", q, k, v, g.d_k, limits.max_abs_value));
  RETURN_IF_ERROR(ValidateGates(gates.data(), gt.count, betas.data(), bt.count));

  RETURN_IF_ERROR(CheckNotAttached(ctx, m, req.slots(), "slots"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m.slots->Acquire(HandlesFromProto(req.slots()), "slots"));
  // o is written straight into the response (no staging on a host-memory
  // backend); the inputs are read from the request's bytes.
  v1::Tensor* o = resp->mutable_o();
  o->set_dtype(v1::DTYPE_FP32);
  for (int64_t d : {int64_t{b}, int64_t{g.h_v}, int64_t{g.d_v}}) o->add_shape(d);
  std::string* data = o->mutable_data();
  data->resize(int64_t{b} * g.h_v * g.d_v * 4);
  HostUpdate u;
  u.batch = b;
  u.slots = access.indices().data();
  u.dtype = q.dtype;
  u.q = q.data;
  u.k = k.data;
  u.v = v.data;
  u.g = gates.data();
  u.beta = betas.data();
  u.o = reinterpret_cast<float*>(data->data());
  UpdateCoalescer::Launch launch;
  if (ctx.coalescer != nullptr) {
    RETURN_IF_ERROR(ctx.coalescer->Run(*m.prepared, m.slots->view(), req.layer(), u, &launch));
  } else {
    RETURN_IF_ERROR(RunHostUpdate(*ctx.backend, *ctx.staging, *m.prepared, m.slots->view(),
                                  req.layer(), u, &launch.kernel_seconds));
    launch.batch = b;
    launch.calls = 1;
    launch.leader = true;
  }
  resp->set_kernel_micros(static_cast<int64_t>(launch.kernel_seconds * 1e6));
  // Once per launch: its batch is every merged call's slots.
  if (launch.leader) Observe(ctx, "decode_update", launch.kernel_seconds, launch.batch);
  return absl::OkStatus();
}

absl::Status Prefill(const Context& ctx, const std::string& tenant, Model& m,
                     const v1::PrefillRequest& req, v1::PrefillResponse* resp) {
  RETURN_IF_ERROR(CheckBatch(req.slots_size(), ctx.limits.max_batch, "slots"));
  if (ctx.dataplane != nullptr && DataPlane::UsesBuffers(req)) {
    return ctx.dataplane->Prefill(tenant, m, req, ComputeLimitsOf(ctx.limits), ctx.observe, resp);
  }
  RETURN_IF_ERROR(CheckNotAttached(ctx, m, req.slots(), "slots"));
  if (req.input_case() == v1::PrefillRequest::kStates) return PrefillStates(ctx, m, req, resp);
  if (req.input_case() != v1::PrefillRequest::kTokens) {
    return absl::InvalidArgumentError("input: set tokens or states");
  }
  return PrefillTokens(ctx, m, req, resp);
}

}  // namespace ops
}  // namespace statecache
