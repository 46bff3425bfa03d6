#include "client/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/model/linear.h"
#include "kernels/common/status_macros.h"

namespace statecache {

namespace {

// Reads tensors by name with shape checks and remembers which were used, so
// unexpected extra tensors (a different architecture) are reported too.
class WeightReader {
 public:
  explicit WeightReader(const SafetensorsFile& f) : f_(f) {}

  absl::StatusOr<std::vector<float>> Take(const std::string& name,
                                          const std::vector<int64_t>& shape) {
    if (!f_.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.safetensors: missing tensor \"", name, "\""));
    }
    used_.insert(name);
    auto v = f_.ToFloat32(name, shape);
    if (!v.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.safetensors: ", v.status().message()));
    }
    return v;
  }

  // Shape of a tensor (kInvalidArgument when missing).
  absl::StatusOr<std::vector<int64_t>> Shape(const std::string& name) const {
    auto t = f_.tensor(name);
    if (!t.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.safetensors: missing tensor \"", name, "\""));
    }
    return t->shape;
  }

  absl::Status CheckAllUsed() const {
    std::vector<std::string> extra;
    for (const std::string& n : f_.names()) {
      if (used_.count(n) == 0) extra.push_back(n);
    }
    if (extra.empty()) return absl::OkStatus();
    if (extra.size() > 5) extra.resize(5);
    return absl::InvalidArgumentError(absl::StrCat(
        "model.safetensors: unexpected tensors for this config (", absl::StrJoin(extra, ", "),
        ")"));
  }

 private:
  const SafetensorsFile& f_;
  std::set<std::string> used_;
};

void Append(std::vector<float>& dst, const std::vector<float>& src) {
  dst.insert(dst.end(), src.begin(), src.end());
}

inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
inline float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// y = x / sqrt(mean(x^2) + eps) * w over n values.
void RmsNorm(const float* x, const float* w, int n, float eps, float* y) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

// x / sqrt(sum(x^2) + eps), in place.
void L2Normalize(float* x, int n, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss + eps);
  for (int i = 0; i < n; ++i) x[i] *= r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LanguageModel>> LanguageModel::Load(const std::string& dir,
                                                   const Options& options) {
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir + "/config.json"));
  ASSIGN_OR_RETURN(SafetensorsFile weights, SafetensorsFile::Open(dir + "/model.safetensors"));
  return FromParts(config, weights, options);
}

absl::StatusOr<std::unique_ptr<LanguageModel>> LanguageModel::FromParts(const ModelConfig& c,
                                                        const SafetensorsFile& file,
                                                        const Options& options) {
  std::unique_ptr<LanguageModel> m(new LanguageModel());
  m->config_ = c;
  const int64_t D = c.hidden_size, dk = c.head_dim, dv = c.value_dim, hk = c.num_heads,
                hv = c.num_v_heads, I = c.intermediate_size, V = c.vocab_size, W = c.conv_size;
  const bool kda = c.arch == Arch::kKda;
  WeightReader r(file);

  ASSIGN_OR_RETURN(m->embeddings_, r.Take("model.embeddings.weight", {V, D}));
  ASSIGN_OR_RETURN(m->final_norm_, r.Take("model.norm.weight", {D}));
  if (c.tie_word_embeddings) {
    m->lm_head_ = m->embeddings_;
  } else {
    ASSIGN_OR_RETURN(m->lm_head_, r.Take("lm_head.weight", {V, D}));
  }
  if (kda) {
    ASSIGN_OR_RETURN(auto s0, r.Shape("model.layers.0.attn.f_proj.0.weight"));
    ASSIGN_OR_RETURN(auto s1, r.Shape("model.layers.0.attn.g_proj.0.weight"));
    if (s0.size() != 2 || s1.size() != 2 || s0[0] < 1 || s1[0] < 1 || s0[0] > 4096 ||
        s1[0] > 4096) {
      return absl::InvalidArgumentError(
          "model.safetensors: f_proj.0 / g_proj.0 of layer 0 are not [rank, hidden] matrices");
    }
    m->f_rank_ = static_cast<int>(s0[0]);
    m->g_rank_ = static_cast<int>(s1[0]);
  }
  const int64_t rf = m->f_rank_, rg = m->g_rank_;
  m->attn_in_rows_ = static_cast<int>(2 * hk * dk + hv * dv + hv +
                                      (kda ? rf + rg : hv + hv * dv));

  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerWeights w;
    ASSIGN_OR_RETURN(w.attn_norm, r.Take(p + "attn_norm.weight", {D}));
    ASSIGN_OR_RETURN(auto q, r.Take(p + "attn.q_proj.weight", {hk * dk, D}));
    ASSIGN_OR_RETURN(auto k, r.Take(p + "attn.k_proj.weight", {hk * dk, D}));
    ASSIGN_OR_RETURN(auto v, r.Take(p + "attn.v_proj.weight", {hv * dv, D}));
    ASSIGN_OR_RETURN(auto b, r.Take(p + "attn.b_proj.weight", {hv, D}));
    Append(w.attn_in, q);
    Append(w.attn_in, k);
    Append(w.attn_in, v);
    Append(w.attn_in, b);
    ASSIGN_OR_RETURN(auto qc, r.Take(p + "attn.q_conv1d.weight", {hk * dk, 1, W}));
    ASSIGN_OR_RETURN(auto kc, r.Take(p + "attn.k_conv1d.weight", {hk * dk, 1, W}));
    ASSIGN_OR_RETURN(auto vc, r.Take(p + "attn.v_conv1d.weight", {hv * dv, 1, W}));
    Append(w.conv, qc);
    Append(w.conv, kc);
    Append(w.conv, vc);
    ASSIGN_OR_RETURN(w.a_log, r.Take(p + "attn.A_log", {hv}));
    if (kda) {
      ASSIGN_OR_RETURN(auto f0, r.Take(p + "attn.f_proj.0.weight", {rf, D}));
      ASSIGN_OR_RETURN(auto g0, r.Take(p + "attn.g_proj.0.weight", {rg, D}));
      Append(w.attn_in, f0);
      Append(w.attn_in, g0);
      ASSIGN_OR_RETURN(w.f_proj1, r.Take(p + "attn.f_proj.1.weight", {hv * dk, rf}));
      ASSIGN_OR_RETURN(w.g_proj1, r.Take(p + "attn.g_proj.1.weight", {hv * dv, rg}));
      ASSIGN_OR_RETURN(w.g_proj1_bias, r.Take(p + "attn.g_proj.1.bias", {hv * dv}));
      ASSIGN_OR_RETURN(w.dt_bias, r.Take(p + "attn.dt_bias", {hv * dk}));
    } else {
      ASSIGN_OR_RETURN(auto a, r.Take(p + "attn.a_proj.weight", {hv, D}));
      ASSIGN_OR_RETURN(auto g, r.Take(p + "attn.g_proj.weight", {hv * dv, D}));
      Append(w.attn_in, a);
      Append(w.attn_in, g);
      ASSIGN_OR_RETURN(w.dt_bias, r.Take(p + "attn.dt_bias", {hv}));
    }
    ASSIGN_OR_RETURN(w.o_norm, r.Take(p + "attn.o_norm.weight", {dv}));
    ASSIGN_OR_RETURN(w.o_proj, r.Take(p + "attn.o_proj.weight", {D, hv * dv}));
    ASSIGN_OR_RETURN(w.mlp_norm, r.Take(p + "mlp_norm.weight", {D}));
    ASSIGN_OR_RETURN(auto gate, r.Take(p + "mlp.gate_proj.weight", {I, D}));
    ASSIGN_OR_RETURN(auto up, r.Take(p + "mlp.up_proj.weight", {I, D}));
    Append(w.gate_up, gate);
    Append(w.gate_up, up);
    ASSIGN_OR_RETURN(w.down_proj, r.Take(p + "mlp.down_proj.weight", {D, I}));
    m->layers_.push_back(std::move(w));
  }
  RETURN_IF_ERROR(r.CheckAllUsed());
  const int threads = options.threads > 0 ? options.threads : ThreadPool::DefaultThreads();
  m->pool_ = std::make_unique<ThreadPool>(threads);
  return m;
}

ModelSession::ModelSession(const LanguageModel* model, RecurrentStateStore* store)
    : model_(model), store_(store) {
  const ModelConfig& c = model_->config();
  conv_state_.assign(c.num_layers,
                     std::vector<float>(static_cast<size_t>(c.ConvChannels()) * (c.conv_size - 1),
                                        0.0f));
}

absl::Status ModelSession::Reset() {
  for (auto& s : conv_state_) std::fill(s.begin(), s.end(), 0.0f);
  position_ = 0;
  return store_->Reset();
}

int64_t ModelSession::ConvStateBytesPerLayer() const {
  const ModelConfig& c = model_->config();
  return int64_t{c.ConvChannels()} * (c.conv_size - 1) * 4;
}

absl::StatusOr<std::string> ModelSession::ExportConvState(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(conv_state_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("layer: ", layer, " is out of range"));
  }
  const auto& s = conv_state_[layer];
  return std::string(reinterpret_cast<const char*>(s.data()), s.size() * 4);
}

absl::Status ModelSession::ImportConvState(int layer, absl::string_view bytes) {
  if (layer < 0 || layer >= static_cast<int>(conv_state_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("layer: ", layer, " is out of range"));
  }
  auto& s = conv_state_[layer];
  if (bytes.size() != s.size() * 4) {
    return absl::InvalidArgumentError(absl::StrCat("conv state of layer ", layer, ": ",
                                                   bytes.size(), " bytes, expected ",
                                                   s.size() * 4));
  }
  std::memcpy(s.data(), bytes.data(), bytes.size());
  return absl::OkStatus();
}

std::string ModelSession::ExportAuxBytes() const {
  std::string out;
  for (int l = 0; l < static_cast<int>(conv_state_.size()); ++l) out += *ExportConvState(l);
  return out;
}

absl::Status ModelSession::ImportAuxBytes(absl::string_view bytes) {
  const int64_t per = ConvStateBytesPerLayer();
  const int64_t want = per * static_cast<int64_t>(conv_state_.size());
  if (static_cast<int64_t>(bytes.size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("aux bytes: ", bytes.size(), " bytes, expected ", want));
  }
  for (int l = 0; l < static_cast<int>(conv_state_.size()); ++l) {
    RETURN_IF_ERROR(ImportConvState(l, bytes.substr(l * per, per)));
  }
  return absl::OkStatus();
}

absl::Status ModelSession::Forward(absl::Span<const int32_t> tokens, RecurrentMode mode,
                                   std::vector<float>* logits, ForwardTrace* trace) {
  const ModelConfig& c = model_->config();
  if (store_->geometry() != c.Geometry()) {
    return absl::InvalidArgumentError(absl::StrCat("store geometry ",
                                                   store_->geometry().DebugString(),
                                                   " does not match the model's ",
                                                   c.Geometry().DebugString()));
  }
  const int T = static_cast<int>(tokens.size());
  if (T == 0) return absl::InvalidArgumentError("tokens: empty");
  const int D = c.hidden_size;
  for (int t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("tokens[", t, "]: ", tokens[t],
                                                     " is outside [0, ", c.vocab_size, ")"));
    }
  }
  std::vector<float> h(static_cast<size_t>(T) * D);
  for (int t = 0; t < T; ++t) {
    std::memcpy(&h[static_cast<size_t>(t) * D],
                &model_->embeddings()[static_cast<size_t>(tokens[t]) * D], D * sizeof(float));
  }
  if (trace != nullptr) trace->layers.assign(c.num_layers, ForwardTrace::Layer());
  for (int l = 0; l < c.num_layers; ++l) {
    RETURN_IF_ERROR(
        RunLayer(l, T, mode, h, trace != nullptr ? &trace->layers[l] : nullptr));
  }
  position_ += T;
  if (logits != nullptr) {
    std::vector<float> xn(h.size());
    for (int t = 0; t < T; ++t) {
      RmsNorm(&h[static_cast<size_t>(t) * D], model_->final_norm().data(), D, c.norm_eps,
              &xn[static_cast<size_t>(t) * D]);
    }
    logits->assign(static_cast<size_t>(T) * c.vocab_size, 0.0f);
    MatMulTransposed(model_->pool(), xn.data(), T, D, model_->lm_head().data(), c.vocab_size,
                     logits->data());
  }
  return absl::OkStatus();
}

absl::Status ModelSession::RunLayer(int l, int T, RecurrentMode mode, std::vector<float>& h,
                                    ForwardTrace::Layer* trace) {
  const ModelConfig& c = model_->config();
  const LayerWeights& w = model_->layer(l);
  ThreadPool* pool = model_->pool();
  const bool kda = c.arch == Arch::kKda;
  const int D = c.hidden_size, dk = c.head_dim, dv = c.value_dim, hk = c.num_heads,
            hv = c.num_v_heads, I = c.intermediate_size, W = c.conv_size;
  const int nq = hk * dk, nv = hv * dv, C = c.ConvChannels();
  const int N = model_->attn_in_rows();
  const size_t TD = static_cast<size_t>(T) * D;

  // Attention input projections (fused).
  std::vector<float> xn(TD);
  for (int t = 0; t < T; ++t) {
    RmsNorm(&h[static_cast<size_t>(t) * D], w.attn_norm.data(), D, c.norm_eps, &xn[static_cast<size_t>(t) * D]);
  }
  std::vector<float> proj(static_cast<size_t>(T) * N);
  MatMulTransposed(pool, xn.data(), T, D, w.attn_in.data(), N, proj.data());

  // Short causal depthwise conv + SiLU over the q, k, v channels (columns
  // [0, C) of proj), continuing from the stored window.
  std::vector<float> qkv(static_cast<size_t>(T) * C);
  std::vector<float>& win = conv_state_[l];  // [C, W-1], oldest first
  const int H = W - 1;
  for (int ch = 0; ch < C; ++ch) {
    const float* wc = &w.conv[static_cast<size_t>(ch) * W];
    float* state = &win[static_cast<size_t>(ch) * H];
    for (int t = 0; t < T; ++t) {
      // x_{t-W+1+i} for i in [0, W): from the window when before this chunk.
      float acc = 0.0f;
      for (int i = 0; i < W; ++i) {
        const int src = t - (W - 1) + i;
        const float x = src >= 0 ? proj[static_cast<size_t>(src) * N + ch] : state[H + src];
        acc += wc[i] * x;
      }
      qkv[static_cast<size_t>(t) * C + ch] = Silu(acc);
    }
    // New window: the last H inputs of (old window ++ this chunk).
    float next[64];
    for (int j = 0; j < H; ++j) {
      const int src = T - H + j;  // index into this chunk; negative = old window
      next[j] = src >= 0 ? proj[static_cast<size_t>(src) * N + ch] : state[H + src];
    }
    std::memcpy(state, next, H * sizeof(float));
  }

  // Split into q, k, v; L2-normalize q and k per head; gates.
  std::vector<float> q(static_cast<size_t>(T) * nq), k(q.size()), v(static_cast<size_t>(T) * nv);
  std::vector<float> beta(static_cast<size_t>(T) * hv);
  std::vector<float> g(static_cast<size_t>(T) * hv * (kda ? dk : 1));
  std::vector<float> gate(static_cast<size_t>(T) * nv);  // output gate, activated
  const int off_b = C, off_x = C + hv;  // a (GDN) or f_proj.0 (KDA) starts at off_x
  for (int t = 0; t < T; ++t) {
    const float* row = &qkv[static_cast<size_t>(t) * C];
    std::memcpy(&q[static_cast<size_t>(t) * nq], row, nq * sizeof(float));
    std::memcpy(&k[static_cast<size_t>(t) * nq], row + nq, nq * sizeof(float));
    std::memcpy(&v[static_cast<size_t>(t) * nv], row + 2 * nq, nv * sizeof(float));
    for (int hh = 0; hh < hk; ++hh) {
      L2Normalize(&q[static_cast<size_t>(t) * nq + hh * dk], dk, c.l2norm_eps);
      L2Normalize(&k[static_cast<size_t>(t) * nq + hh * dk], dk, c.l2norm_eps);
    }
    const float* p = &proj[static_cast<size_t>(t) * N];
    for (int hh = 0; hh < hv; ++hh) beta[static_cast<size_t>(t) * hv + hh] = Sigmoid(p[off_b + hh]);
    if (!kda) {
      for (int hh = 0; hh < hv; ++hh) {
        g[static_cast<size_t>(t) * hv + hh] =
            -std::exp(w.a_log[hh]) * Softplus(p[off_x + hh] + w.dt_bias[hh]);
      }
      const float* gp = p + off_x + hv;
      for (int i = 0; i < nv; ++i) gate[static_cast<size_t>(t) * nv + i] = Silu(gp[i]);
    }
  }
  if (kda) {
    const int rf = model_->f_rank(), rg = model_->g_rank();
    std::vector<float> f0(static_cast<size_t>(T) * rf), g0(static_cast<size_t>(T) * rg);
    for (int t = 0; t < T; ++t) {
      const float* p = &proj[static_cast<size_t>(t) * N];
      std::memcpy(&f0[static_cast<size_t>(t) * rf], p + off_x, rf * sizeof(float));
      std::memcpy(&g0[static_cast<size_t>(t) * rg], p + off_x + rf, rg * sizeof(float));
    }
    std::vector<float> f1(static_cast<size_t>(T) * hv * dk);
    MatMulTransposed(pool, f0.data(), T, rf, w.f_proj1.data(), hv * dk, f1.data());
    MatMulTransposed(pool, g0.data(), T, rg, w.g_proj1.data(), nv, gate.data());
    for (int t = 0; t < T; ++t) {
      for (int hh = 0; hh < hv; ++hh) {
        const float a = std::exp(w.a_log[hh]);
        for (int i = 0; i < dk; ++i) {
          const size_t j = static_cast<size_t>(hh) * dk + i;
          g[static_cast<size_t>(t) * hv * dk + j] =
              -a * Softplus(f1[static_cast<size_t>(t) * hv * dk + j] + w.dt_bias[j]);
        }
      }
      for (int i = 0; i < nv; ++i) {
        float& x = gate[static_cast<size_t>(t) * nv + i];
        x = Sigmoid(x + w.g_proj1_bias[i]);
      }
    }
  }

  // The recurrence, through the store.
  RecurrentInputs in;
  in.tokens = T;
  in.q = q.data();
  in.k = k.data();
  in.v = v.data();
  in.g = g.data();
  in.beta = beta.data();
  std::vector<float> o(static_cast<size_t>(T) * nv);
  if (mode == RecurrentMode::kDecode) {
    RETURN_IF_ERROR(store_->Decode(l, in, o.data()));
  } else {
    RETURN_IF_ERROR(store_->Prefill(l, in, o.data()));
  }

  // Gated RMSNorm per head, output projection, residual.
  for (int t = 0; t < T; ++t) {
    for (int hh = 0; hh < hv; ++hh) {
      float* oh = &o[static_cast<size_t>(t) * nv + hh * dv];
      RmsNorm(oh, w.o_norm.data(), dv, c.norm_eps, oh);
      const float* gh = &gate[static_cast<size_t>(t) * nv + hh * dv];
      for (int i = 0; i < dv; ++i) oh[i] *= gh[i];
    }
  }
  std::vector<float> attn_out(TD);
  MatMulTransposed(pool, o.data(), T, nv, w.o_proj.data(), D, attn_out.data());
  for (size_t i = 0; i < TD; ++i) h[i] += attn_out[i];

  // SwiGLU MLP.
  for (int t = 0; t < T; ++t) {
    RmsNorm(&h[static_cast<size_t>(t) * D], w.mlp_norm.data(), D, c.norm_eps, &xn[static_cast<size_t>(t) * D]);
  }
  std::vector<float> gu(static_cast<size_t>(T) * 2 * I);
  MatMulTransposed(pool, xn.data(), T, D, w.gate_up.data(), 2 * I, gu.data());
  std::vector<float> act(static_cast<size_t>(T) * I);
  for (int t = 0; t < T; ++t) {
    const float* r = &gu[static_cast<size_t>(t) * 2 * I];
    for (int i = 0; i < I; ++i) act[static_cast<size_t>(t) * I + i] = Silu(r[i]) * r[I + i];
  }
  MatMulTransposed(pool, act.data(), T, I, w.down_proj.data(), D, attn_out.data());
  for (size_t i = 0; i < TD; ++i) h[i] += attn_out[i];

  if (trace != nullptr) {
    trace->q = std::move(q);
    trace->k = std::move(k);
    trace->v = std::move(v);
    trace->g = std::move(g);
    trace->beta = std::move(beta);
  }
  return absl::OkStatus();
}

}  // namespace statecache
