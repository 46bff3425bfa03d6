// RequestBytes: the inline-bytes TensorSource (server/ops/tensor_source.h).

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/backend/batch_validation.h"
#include "kernels/common/status_macros.h"
#include "server/core/host_update.h"
#include "server/ops/checks.h"
#include "server/ops/host_staging.h"
#include "server/ops/tensor_source.h"
#include "server/core/proto_convert.h"

namespace statecache {
namespace ops {
namespace {

TensorBytes View(const SourcedTensor& t) { return {t.dtype, t.data, t.count, t.bytes}; }

}  // namespace

absl::StatusOr<SourcedTensor> RequestBytes::Input(const v1::Tensor& t, absl::string_view field,
                                                  absl::Span<const DType> allowed,
                                                  absl::Span<const int64_t> shape) {
  ASSIGN_OR_RETURN(TensorBytes b, CheckTensor(t, field, allowed, shape));
  return SourcedTensor{b.dtype, const_cast<void*>(b.data), b.count, b.bytes};
}

absl::StatusOr<SourcedTensor> RequestBytes::Output(const v1::BufferRef*, absl::string_view,
                                                   int64_t count, v1::Tensor* out) {
  std::string* data = out->mutable_data();
  data->resize(count * 4);
  return SourcedTensor{DType::kFp32, data->data(), count, count * 4};
}

absl::Status RequestBytes::Ready(const Context& ctx, absl::string_view prefix, bool sanitize,
                                 int d_k, ComputeTensors* t, int64_t* sanitized) {
  TensorBytes q = View(t->q), k = View(t->k), v = View(t->v);
  gates_ = Floats(View(t->g));
  betas_ = Floats(View(t->beta));
  if (sanitize) {
    *sanitized = SanitizeTensor(&q, &q_clean_) + SanitizeTensor(&k, &k_clean_) +
                 SanitizeTensor(&v, &v_clean_) + SanitizeFloats(&gates_) + SanitizeFloats(&betas_);
  }
  if (!ValuesPassQuickly(q, k, v, d_k, ctx.limits.max_abs_value)) {
    // The exact checks, in order: the verdict and the first error.
    RETURN_IF_ERROR(ValidateFinite(absl::StrCat(prefix, "q"), q.dtype, q.data, q.count));
    RETURN_IF_ERROR(ValidateFinite(absl::StrCat(prefix, "k"), k.dtype, k.data, k.count));
    RETURN_IF_ERROR(ValidateFinite(absl::StrCat(prefix, "v"), v.dtype, v.data, v.count));
    RETURN_IF_ERROR(CheckMagnitudes(prefix, q, k, v, d_k, ctx.limits.max_abs_value));
  }
  absl::Status gates = ValidateGates(gates_.data(), t->g.count, betas_.data(), t->beta.count);
  if (!gates.ok()) {
    return prefix.empty() ? gates
                          : absl::InvalidArgumentError(absl::StrCat(prefix, gates.message()));
  }
  t->q.data = const_cast<void*>(q.data);
  t->k.data = const_cast<void*>(k.data);
  t->v.data = const_cast<void*>(v.data);
  t->g.data = gates_.data();
  t->beta.data = betas_.data();
  return absl::OkStatus();
}

absl::StatusOr<Launch> RequestBytes::RunUpdate(const Context& ctx, Model& m, int layer,
                                               const std::vector<int32_t>& slots,
                                               const ComputeTensors& t) {
  HostUpdate u;
  u.batch = static_cast<int>(slots.size());
  u.slots = slots.data();
  u.dtype = t.q.dtype;
  u.q = t.q.data;
  u.k = t.k.data;
  u.v = t.v.data;
  u.g = static_cast<const float*>(t.g.data);
  u.beta = static_cast<const float*>(t.beta.data);
  u.o = static_cast<float*>(t.o.data);
  Launch launch;
  if (ctx.coalescer != nullptr) {
    UpdateCoalescer::Launch merged;
    RETURN_IF_ERROR(ctx.coalescer->Run(*m.prepared, m.slots->view(), layer, u, &merged));
    launch.kernel_seconds = merged.kernel_seconds;
    launch.batch = merged.batch;
    launch.leader = merged.leader;
  } else {
    RETURN_IF_ERROR(RunHostUpdate(*ctx.backend, *ctx.staging, *m.prepared, m.slots->view(), layer,
                                  u, &launch.kernel_seconds, ctx.phases));
    launch.batch = u.batch;
  }
  return launch;
}

absl::StatusOr<Launch> RequestBytes::RunPrefill(const Context& ctx, Model& m, int layer,
                                                int tokens, const std::vector<int32_t>& slots,
                                                const ComputeTensors& t) {
  const int b = static_cast<int>(slots.size());
  const int64_t o_count = t.o.data != nullptr ? t.o.count : 0;
  HostStaging st;
  const int s_idx = st.Add(slots.data(), b * sizeof(int32_t));
  const int s_q = st.Add(t.q.data, t.q.bytes), s_k = st.Add(t.k.data, t.k.bytes),
            s_v = st.Add(t.v.data, t.v.bytes);
  const int s_g = st.Add(t.g.data, t.g.bytes), s_b = st.Add(t.beta.data, t.beta.bytes);
  const int s_o = st.Add(nullptr, o_count * 4);
  RETURN_IF_ERROR(st.Commit(*ctx.backend, *ctx.staging));
  PrefillInputs in;
  in.batch = b;
  in.tokens = tokens;
  in.slots = st.at<int32_t>(s_idx);
  in.dtype = t.q.dtype;
  in.q = st.at<void>(s_q);
  in.k = st.at<void>(s_k);
  in.v = st.at<void>(s_v);
  in.g = st.at<float>(s_g);
  in.beta = st.at<float>(s_b);
  in.o = t.o.data != nullptr ? st.at<float>(s_o) : nullptr;
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(ctx.backend->Prefill(*m.prepared, m.slots->view(), layer, in));
  Launch launch;
  launch.kernel_seconds = SecondsSince(start);
  launch.batch = b;
  if (t.o.data != nullptr) RETURN_IF_ERROR(ctx.backend->CopyOut(t.o.data, in.o, o_count * 4));
  return launch;
}

}  // namespace ops
}  // namespace statecache
