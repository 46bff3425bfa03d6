#include "client/model/fp32_state_store.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace statecache {

absl::Status ValidateRecurrentInputs(const ModelGeometry& geometry, int layer,
                                     const RecurrentInputs& in) {
  if (layer < 0 || layer >= geometry.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer: ", layer, " is outside [0, ", geometry.layers, ")"));
  }
  if (in.tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tokens: ", in.tokens, " (need >= 1)"));
  }
  const char* missing = in.q == nullptr      ? "q"
                        : in.k == nullptr    ? "k"
                        : in.v == nullptr    ? "v"
                        : in.g == nullptr    ? "g"
                        : in.beta == nullptr ? "beta"
                                             : nullptr;
  if (missing != nullptr) return absl::InvalidArgumentError(absl::StrCat(missing, ": null"));
  return absl::OkStatus();
}

void Fp32RecurrentStep(Arch arch, int d_k, int d_v, float scale, const float* q, const float* k,
                       const float* v, const float* g, float beta, float* s, float* o) {
  float kv[kMaxHeadDim];  // S_bar^T k, then beta * (v - S_bar^T k)
  std::fill(kv, kv + d_v, 0.0f);
  const float gdn_decay = arch == Arch::kGdn ? std::exp(g[0]) : 0.0f;
  for (int i = 0; i < d_k; ++i) {
    const float decay = arch == Arch::kGdn ? gdn_decay : std::exp(g[i]);
    float* row = s + int64_t{i} * d_v;
    const float ki = k[i];
    for (int j = 0; j < d_v; ++j) {
      row[j] *= decay;
      kv[j] += row[j] * ki;
    }
  }
  for (int j = 0; j < d_v; ++j) kv[j] = (v[j] - kv[j]) * beta;
  std::fill(o, o + d_v, 0.0f);
  for (int i = 0; i < d_k; ++i) {
    float* row = s + int64_t{i} * d_v;
    const float ki = k[i];
    const float qi = q[i] * scale;
    for (int j = 0; j < d_v; ++j) {
      row[j] += ki * kv[j];
      o[j] += row[j] * qi;
    }
  }
}

Fp32StateStore::Fp32StateStore(const ModelGeometry& geometry, ThreadPool* pool)
    : geometry_(geometry), pool_(pool), states_(StateElements(geometry), 0.0f) {}

absl::Status Fp32StateStore::Run(int layer, const RecurrentInputs& in, float* o) {
  RETURN_IF_ERROR(ValidateRecurrentInputs(geometry_, layer, in));
  const ModelGeometry& g = geometry_;
  const int64_t head_elems = int64_t{g.d_k} * g.d_v;
  const float scale = g.EffectiveScale();
  const int gw = g.GateWidth();
  auto head = [&](int64_t h) {
    float* s = states_.data() + (int64_t{layer} * g.h_v + h) * head_elems;
    const int kh = g.KeyHeadOf(static_cast<int>(h));
    float scratch_o[kMaxHeadDim];
    for (int t = 0; t < in.tokens; ++t) {
      const float* q = in.q + (int64_t{t} * g.h_qk + kh) * g.d_k;
      const float* k = in.k + (int64_t{t} * g.h_qk + kh) * g.d_k;
      const float* v = in.v + (int64_t{t} * g.h_v + h) * g.d_v;
      const float* gate = in.g + (int64_t{t} * g.h_v + h) * gw;
      const float beta = in.beta[int64_t{t} * g.h_v + h];
      float* out = o != nullptr ? o + (int64_t{t} * g.h_v + h) * g.d_v : scratch_o;
      Fp32RecurrentStep(g.arch, g.d_k, g.d_v, scale, q, k, v, gate, beta, s, out);
    }
  };
  if (pool_ != nullptr) {
    pool_->ParallelFor(g.h_v, head);
  } else {
    for (int h = 0; h < g.h_v; ++h) head(h);
  }
  return absl::OkStatus();
}

absl::Status Fp32StateStore::Decode(int layer, const RecurrentInputs& in, float* o) {
  if (o == nullptr) return absl::InvalidArgumentError("o: null (decode always reads out)");
  return Run(layer, in, o);
}

absl::Status Fp32StateStore::Prefill(int layer, const RecurrentInputs& in, float* o) {
  return Run(layer, in, o);
}

absl::Status Fp32StateStore::Reset() {
  std::fill(states_.begin(), states_.end(), 0.0f);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Fp32StateStore::ReadStates() { return states_; }

absl::Status Fp32StateStore::WriteStates(const std::vector<float>& states) {
  if (states.size() != states_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("states: ", states.size(), " floats, expected ",
                                                   states_.size()));
  }
  states_ = states;
  return absl::OkStatus();
}

}  // namespace statecache
