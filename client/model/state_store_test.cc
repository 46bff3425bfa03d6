// RecurrentStateStore implementations: Fp32StateStore against a
// double-precision oracle, BackendStateStore (CPU backend) against
// Fp32StateStore, decode vs prefill semantics, state read/write, bad input.
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "client/model/backend_state_store.h"
#include "client/model/fp32_state_store.h"
#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"

namespace statecache {
namespace {

using absl::StatusCode;

struct Inputs {
  std::vector<float> q, k, v, g, beta;
  RecurrentInputs view(int t0, int tokens, const ModelGeometry& geo) const {
    RecurrentInputs in;
    in.tokens = tokens;
    in.q = q.data() + static_cast<size_t>(t0) * geo.h_qk * geo.d_k;
    in.k = k.data() + static_cast<size_t>(t0) * geo.h_qk * geo.d_k;
    in.v = v.data() + static_cast<size_t>(t0) * geo.h_v * geo.d_v;
    in.g = g.data() + static_cast<size_t>(t0) * geo.h_v * geo.GateWidth();
    in.beta = beta.data() + static_cast<size_t>(t0) * geo.h_v;
    return in;
  }
};

Inputs RandomInputs(const ModelGeometry& geo, int tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  Inputs in;
  auto unit = [&](std::vector<float>& x, int heads, int d) {
    x.resize(static_cast<size_t>(tokens) * heads * d);
    for (size_t r = 0; r < x.size() / d; ++r) {
      double ss = 0;
      for (int i = 0; i < d; ++i) ss += std::pow(x[r * d + i] = nd(rng), 2);
      for (int i = 0; i < d; ++i) x[r * d + i] /= std::sqrt(ss);
    }
  };
  unit(in.q, geo.h_qk, geo.d_k);
  unit(in.k, geo.h_qk, geo.d_k);
  in.v.resize(static_cast<size_t>(tokens) * geo.h_v * geo.d_v);
  for (float& x : in.v) x = nd(rng);
  in.g.resize(static_cast<size_t>(tokens) * geo.h_v * geo.GateWidth());
  for (float& x : in.g) x = std::log(0.5f + 0.5f * ud(rng));
  in.beta.resize(static_cast<size_t>(tokens) * geo.h_v);
  for (float& x : in.beta) x = 0.05f + 0.9f * ud(rng);
  return in;
}

double MaxAbs(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double{a[i]} - b[i]));
  return m;
}

// Double-precision oracle of DESIGN.md section 2 for one layer.
std::vector<double> Oracle(const ModelGeometry& geo, const Inputs& in, int tokens,
                           std::vector<double>* state) {
  std::vector<double> out;
  const double scale = geo.EffectiveScale();
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < geo.h_v; ++h) {
      const int kh = h / (geo.h_v / geo.h_qk);
      double* S = &(*state)[static_cast<size_t>(h) * geo.d_k * geo.d_v];
      const float* q = &in.q[(static_cast<size_t>(t) * geo.h_qk + kh) * geo.d_k];
      const float* k = &in.k[(static_cast<size_t>(t) * geo.h_qk + kh) * geo.d_k];
      const float* v = &in.v[(static_cast<size_t>(t) * geo.h_v + h) * geo.d_v];
      const float* g = &in.g[(static_cast<size_t>(t) * geo.h_v + h) * geo.GateWidth()];
      const double beta = in.beta[static_cast<size_t>(t) * geo.h_v + h];
      for (int i = 0; i < geo.d_k; ++i) {
        const double a = std::exp(double{geo.arch == Arch::kKda ? g[i] : g[0]});
        for (int j = 0; j < geo.d_v; ++j) S[i * geo.d_v + j] *= a;
      }
      for (int j = 0; j < geo.d_v; ++j) {
        double pred = 0;
        for (int i = 0; i < geo.d_k; ++i) pred += S[i * geo.d_v + j] * k[i];
        const double u = beta * (v[j] - pred);
        for (int i = 0; i < geo.d_k; ++i) S[i * geo.d_v + j] += k[i] * u;
      }
      for (int j = 0; j < geo.d_v; ++j) {
        double acc = 0;
        for (int i = 0; i < geo.d_k; ++i) acc += S[i * geo.d_v + j] * scale * q[i];
        out.push_back(acc);
      }
    }
  }
  return out;
}

const ModelGeometry kGdn{Arch::kGdn, 2, 2, 4, 64, 64};
const ModelGeometry kKda{Arch::kKda, 2, 4, 4, 64, 64};

class StoreTest : public ::testing::TestWithParam<ModelGeometry> {};

TEST_P(StoreTest, Fp32MatchesDoubleOracle) {
  const ModelGeometry geo = GetParam();
  ThreadPool pool(2);
  Fp32StateStore store(geo, &pool);
  const int T = 40;
  Inputs in = RandomInputs(geo, T, 1);
  std::vector<float> o(static_cast<size_t>(T) * geo.h_v * geo.d_v);
  ASSERT_TRUE(store.Decode(1, in.view(0, T, geo), o.data()).ok());
  std::vector<double> state(static_cast<size_t>(geo.h_v) * geo.d_k * geo.d_v, 0.0);
  std::vector<double> ref = Oracle(geo, in, T, &state);
  ASSERT_EQ(ref.size(), o.size());
  double err = 0;
  for (size_t i = 0; i < o.size(); ++i) err = std::max(err, std::fabs(o[i] - ref[i]));
  EXPECT_LT(err, 2e-5);
  auto states = store.ReadStates();
  ASSERT_TRUE(states.ok());
  const size_t per_layer = state.size();
  double serr = 0, layer0 = 0;
  for (size_t i = 0; i < per_layer; ++i) {
    serr = std::max(serr, std::fabs((*states)[per_layer + i] - state[i]));
    layer0 = std::max(layer0, std::fabs(double{(*states)[i]}));
  }
  EXPECT_LT(serr, 2e-5);
  EXPECT_EQ(layer0, 0.0) << "layer 0 was never touched";
}

TEST_P(StoreTest, BackendFp32MatchesFp32StoreInBothModes) {
  const ModelGeometry geo = GetParam();
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto layout = StateLayout::Identity(geo, *ParseFormatSpec("fp32"));
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto bstore = BackendStateStore::Create(backend->get(), *layout);
  ASSERT_TRUE(bstore.ok()) << bstore.status();
  Fp32StateStore ref(geo);
  const int T = 24;
  Inputs in = RandomInputs(geo, T, 2);
  const size_t o_size = static_cast<size_t>(T) * geo.h_v * geo.d_v;
  std::vector<float> o1(o_size), o2(o_size);
  // First 10 tokens as a prefill chunk, the rest as decode steps.
  ASSERT_TRUE((*bstore)->Prefill(0, in.view(0, 10, geo), o1.data()).ok());
  ASSERT_TRUE((*bstore)->Decode(0, in.view(10, T - 10, geo),
                                o1.data() + 10 * geo.h_v * geo.d_v).ok());
  ASSERT_TRUE(ref.Decode(0, in.view(0, T, geo), o2.data()).ok());
  EXPECT_LT(MaxAbs(o1, o2), 1e-5);
  EXPECT_LT(MaxAbs(*(*bstore)->ReadStates(), *ref.ReadStates()), 1e-5);
  EXPECT_NE((*bstore)->Describe().find("fp32"), std::string::npos);
}

TEST_P(StoreTest, PackedDecodeRequantizesEveryStepPrefillOnce) {
  const ModelGeometry geo = GetParam();
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto layout = StateLayout::Identity(geo, *ParseFormatSpec("int4"));
  ASSERT_TRUE(layout.ok());
  auto a = BackendStateStore::Create(backend->get(), *layout);
  auto b = BackendStateStore::Create(backend->get(), *layout);
  ASSERT_TRUE(a.ok() && b.ok());
  Fp32StateStore ref(geo);
  const int T = 32;
  Inputs in = RandomInputs(geo, T, 3);
  std::vector<float> oa(static_cast<size_t>(T) * geo.h_v * geo.d_v), ob(oa.size()), oref(oa.size());
  ASSERT_TRUE((*a)->Decode(0, in.view(0, T, geo), oa.data()).ok());
  ASSERT_TRUE((*b)->Prefill(0, in.view(0, T, geo), ob.data()).ok());
  ASSERT_TRUE(ref.Decode(0, in.view(0, T, geo), oref.data()).ok());
  // Prefill reads out from FP32 states all along: equal to the reference.
  EXPECT_LT(MaxAbs(ob, oref), 1e-5);
  // Decode requantizes after every token: visibly different, but close.
  const double dec_err = MaxAbs(oa, oref);
  EXPECT_GT(dec_err, 1e-4);
  EXPECT_LT(dec_err, 0.5);
  // Prefill stores once: its state is the int4 image of the FP32 state.
  auto sb = (*b)->ReadStates();
  auto sr = ref.ReadStates();
  ASSERT_TRUE(sb.ok() && sr.ok());
  EXPECT_GT(MaxAbs(*sb, *sr), 0.0);
  EXPECT_LT(MaxAbs(*sb, *sr), 0.2);
}

TEST_P(StoreTest, WriteReadResetAndBadInput) {
  const ModelGeometry geo = GetParam();
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto layout = StateLayout::Identity(geo, *ParseFormatSpec("fp32"));
  ASSERT_TRUE(layout.ok());
  auto bstore = BackendStateStore::Create(backend->get(), *layout);
  ASSERT_TRUE(bstore.ok());
  Fp32StateStore fstore(geo);
  for (RecurrentStateStore* s : {static_cast<RecurrentStateStore*>(bstore->get()),
                                 static_cast<RecurrentStateStore*>(&fstore)}) {
    std::vector<float> st(StateElements(geo));
    for (size_t i = 0; i < st.size(); ++i) st[i] = std::sin(0.01f * i);
    ASSERT_TRUE(s->WriteStates(st).ok());
    EXPECT_EQ(*s->ReadStates(), st) << s->Describe();
    ASSERT_TRUE(s->Reset().ok());
    EXPECT_EQ(*s->ReadStates(), std::vector<float>(st.size(), 0.0f));
    EXPECT_EQ(s->WriteStates(std::vector<float>(3)).code(), StatusCode::kInvalidArgument);

    Inputs in = RandomInputs(geo, 2, 4);
    std::vector<float> o(2 * geo.h_v * geo.d_v);
    EXPECT_EQ(s->Decode(geo.layers, in.view(0, 2, geo), o.data()).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(s->Decode(-1, in.view(0, 2, geo), o.data()).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s->Decode(0, in.view(0, 0, geo), o.data()).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s->Decode(0, in.view(0, 2, geo), nullptr).code(), StatusCode::kInvalidArgument);
    RecurrentInputs no_beta = in.view(0, 2, geo);
    no_beta.beta = nullptr;
    EXPECT_EQ(s->Prefill(0, no_beta, o.data()).code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(s->Prefill(0, in.view(0, 2, geo), nullptr).ok()) << "prefill without readout";
  }
  EXPECT_EQ(BackendStateStore::Create(nullptr, *layout).status().code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Archs, StoreTest, ::testing::Values(kGdn, kKda),
                         [](const auto& info) { return std::string(ArchName(info.param.arch)); });

}  // namespace
}  // namespace statecache
