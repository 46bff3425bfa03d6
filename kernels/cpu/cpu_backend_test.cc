// Contract tests of the CPU backend: the FP32 path against an independent
// naive recurrence and the golden states of the shipped models, permutation
// invariance, prefill == decode, untouched slots, and bad input.
#include "kernels/cpu/cpu_backend.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/formats/numeric.h"
#include "kernels/formats/state_bound.h"
#include "kernels/io/safetensors.h"
#include "kernels/io/test_data.h"
#include "kernels/testing/test_pool.h"
#include "kernels/testing/token_batch.h"

namespace statecache {
namespace {

// ---------------------------------------------------------------------------
// An independent naive recurrence (DESIGN.md section 2), in double precision,
// natural order, no formats: the oracle for the FP32 path.
struct NaiveModel {
  ModelGeometry geo;
  std::vector<double> state;  // [h_v][d_k][d_v]

  explicit NaiveModel(const ModelGeometry& g)
      : geo(g), state(static_cast<size_t>(g.h_v) * g.d_k * g.d_v, 0.0) {}

  // One token; inputs in the Backend's layout for batch = 1.
  std::vector<double> Step(const float* q, const float* k, const float* v, const float* g,
                           const float* beta) {
    std::vector<double> o(static_cast<size_t>(geo.h_v) * geo.d_v, 0.0);
    const double scale = geo.EffectiveScale();
    for (int h = 0; h < geo.h_v; ++h) {
      const int kh = h / (geo.h_v / geo.h_qk);
      double* S = &state[static_cast<size_t>(h) * geo.d_k * geo.d_v];
      const float* kk = k + kh * geo.d_k;
      const float* qq = q + kh * geo.d_k;
      for (int i = 0; i < geo.d_k; ++i) {
        const double a = std::exp(geo.arch == Arch::kKda ? g[h * geo.d_k + i] : g[h]);
        for (int j = 0; j < geo.d_v; ++j) S[i * geo.d_v + j] *= a;
      }
      for (int j = 0; j < geo.d_v; ++j) {
        double pred = 0;
        for (int i = 0; i < geo.d_k; ++i) pred += S[i * geo.d_v + j] * kk[i];
        const double delta = beta[h] * (v[h * geo.d_v + j] - pred);
        for (int i = 0; i < geo.d_k; ++i) S[i * geo.d_v + j] += kk[i] * delta;
      }
      for (int j = 0; j < geo.d_v; ++j) {
        double acc = 0;
        for (int i = 0; i < geo.d_k; ++i) acc += S[i * geo.d_v + j] * scale * qq[i];
        o[h * geo.d_v + j] = acc;
      }
    }
    return o;
  }
};

template <typename A, typename B>
double RelativeError(const A& got, const B& want) {
  double e = 0, r = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    e += (double{got[i]} - double{want[i]}) * (double{got[i]} - double{want[i]});
    r += double{want[i]} * double{want[i]};
  }
  return std::sqrt(e / std::max(r, 1e-300));
}

std::unique_ptr<CpuBackend> Backend2() { return CpuBackend::Create({.threads = 2}); }

// ---------------------------------------------------------------------------
// Golden data of the shipped models.

struct Golden {
  ModelGeometry geo;
  SafetensorsFile file;
};

Golden LoadGolden(const std::string& model, Arch arch, int h_qk) {
  absl::StatusOr<std::string> path = SharedDataPath("models/" + model + "/golden.safetensors");
  EXPECT_TRUE(path.ok()) << path.status();
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(*path);
  EXPECT_TRUE(file.ok()) << file.status();
  ModelGeometry geo{arch, 1, h_qk, 4, 128, 128};
  return Golden{geo, *std::move(file)};
}

class GoldenTest : public ::testing::TestWithParam<std::tuple<std::string, Arch, int>> {};

TEST_P(GoldenTest, Fp32FormatMatchesNaiveRecurrenceAndGoldenFinalStates) {
  const auto& [model, arch, h_qk] = GetParam();
  Golden golden = LoadGolden(model, arch, h_qk);
  ASSERT_GT(golden.file.size(), 0);
  auto backend = Backend2();
  const ModelGeometry& geo = golden.geo;
  StateLayout layout = *StateLayout::Identity(geo, {StateFormat::kFp32, 0});
  for (int layer = 0; layer < 4; ++layer) {
    const std::string p = "layer" + std::to_string(layer) + ".";
    std::vector<float> q = *golden.file.ToFloat32(p + "q"), k = *golden.file.ToFloat32(p + "k"),
                       v = *golden.file.ToFloat32(p + "v"), g = *golden.file.ToFloat32(p + "g"),
                       beta = *golden.file.ToFloat32(p + "beta"),
                       want_state = *golden.file.ToFloat32(p + "final_state");
    const int tokens = 64;
    ASSERT_EQ(q.size(), size_t{tokens} * geo.h_qk * geo.d_k);
    ASSERT_EQ(g.size(), size_t{tokens} * geo.h_v * geo.GateWidth());
    TestPool pool = MakeTestPool(*backend, layout, 1);
    NaiveModel naive(geo);
    const int32_t slot = 0;
    std::vector<float> o(geo.h_v * geo.d_v);
    double worst_out = 0;
    for (int t = 0; t < tokens; ++t) {
      DecodeInputs in{1,
                      &slot,
                      DType::kFp32,
                      &q[t * geo.h_qk * geo.d_k],
                      &k[t * geo.h_qk * geo.d_k],
                      &v[t * geo.h_v * geo.d_v],
                      &g[t * geo.h_v * geo.GateWidth()],
                      &beta[t * geo.h_v],
                      o.data()};
      ASSERT_TRUE(backend->DecodeUpdate(*pool.model, pool.view, 0, in).ok());
      const std::vector<double> want_o =
          naive.Step(in.q ? &q[t * geo.h_qk * geo.d_k] : nullptr, &k[t * geo.h_qk * geo.d_k],
                     &v[t * geo.h_v * geo.d_v], &g[t * geo.h_v * geo.GateWidth()], &beta[t * geo.h_v]);
      worst_out = std::max(worst_out, RelativeError(o, want_o));
    }
    EXPECT_LE(worst_out, 1e-6) << model << " layer " << layer;
    std::vector<float> state(geo.h_v * geo.d_k * geo.d_v);
    ASSERT_TRUE(backend->UnpackStates(*pool.model, pool.view, &slot, 1, state.data()).ok());
    EXPECT_LE(RelativeError(state, naive.state), 1e-6) << model << " layer " << layer;
    // Golden final_state is [H_v, d_k, d_v], our natural layout.
    EXPECT_LE(RelativeError(state, want_state), 1e-6) << model << " layer " << layer;
    EXPECT_LE(RelativeError(naive.state, want_state), 1e-6) << model << " layer " << layer;
  }
}

INSTANTIATE_TEST_SUITE_P(ShippedModels, GoldenTest,
                         ::testing::Values(std::make_tuple("gdn-tiny", Arch::kGdn, 2),
                                           std::make_tuple("kda-tiny", Arch::kKda, 4)),
                         [](const auto& info) { return std::get<1>(info.param) == Arch::kGdn ? "gdn" : "kda"; });

// ---------------------------------------------------------------------------
// Random inputs for small geometries.

// Wider ranges than RandomTokenBatch: decays and beta uniform in [0.05, 0.95).
TokenBatch RandomBatch(const ModelGeometry& geo, int rows, uint64_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.05f, 0.95f);
  TokenBatch b;
  auto unit = [&](std::vector<float>& x, int count, int dim) {
    x.resize(static_cast<size_t>(count) * dim);
    for (int c = 0; c < count; ++c) {
      double n = 0;
      for (int i = 0; i < dim; ++i) n += std::pow(x[c * dim + i] = n01(rng), 2);
      for (int i = 0; i < dim; ++i) x[c * dim + i] /= std::sqrt(n);
    }
  };
  unit(b.q, rows * geo.h_qk, geo.d_k);
  unit(b.k, rows * geo.h_qk, geo.d_k);
  b.v.resize(static_cast<size_t>(rows) * geo.h_v * geo.d_v);
  for (float& x : b.v) x = n01(rng);
  b.g.resize(static_cast<size_t>(rows) * geo.h_v * geo.GateWidth());
  for (float& x : b.g) x = std::log(u(rng));
  b.beta.resize(static_cast<size_t>(rows) * geo.h_v);
  for (float& x : b.beta) x = u(rng);
  return b;
}

const ModelGeometry kGdnSmall{Arch::kGdn, 2, 2, 4, 64, 64};
const ModelGeometry kKdaSmall{Arch::kKda, 2, 3, 3, 64, 32};

std::vector<int32_t> RandomKeyPerms(const ModelGeometry& geo, uint64_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> perms;
  for (int64_t h = 0; h < geo.HeadsPerSlot(); ++h) {
    std::vector<int32_t> p(geo.d_k);
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
    perms.insert(perms.end(), p.begin(), p.end());
  }
  return perms;
}

class ArchTest : public ::testing::TestWithParam<ModelGeometry> {};

TEST_P(ArchTest, KeyPermutationIsInvisibleInFp32) {
  const ModelGeometry geo = GetParam();
  auto backend = Backend2();
  StateLayout plain = *StateLayout::Identity(geo, {StateFormat::kFp32, 0});
  StateLayout permuted =
      *StateLayout::Create(geo, {StateFormat::kFp32, 0}, RandomKeyPerms(geo, 5), {}, {});
  ASSERT_FALSE(permuted.identity_key_perm());
  TestPool a = MakeTestPool(*backend, plain, 2), b = MakeTestPool(*backend, permuted, 2);
  const int steps = 20, batch = 2;
  TokenBatch in = RandomBatch(geo, steps * batch, 11);
  const int32_t slots[2] = {1, 0};
  std::vector<float> oa(batch * geo.h_v * geo.d_v), ob(oa.size());
  for (int t = 0; t < steps; ++t) {
    for (int layer = 0; layer < geo.layers; ++layer) {
      ASSERT_TRUE(backend->DecodeUpdate(*a.model, a.view, layer, DecodeInputsFor(in, geo, slots, batch, oa.data(), t * batch)).ok());
      ASSERT_TRUE(backend->DecodeUpdate(*b.model, b.view, layer, DecodeInputsFor(in, geo, slots, batch, ob.data(), t * batch)).ok());
      ASSERT_LE(RelativeError(ob, oa), 1e-6);
    }
  }
  std::vector<float> sa(2 * geo.HeadsPerSlot() * geo.d_k * geo.d_v), sb(sa.size());
  ASSERT_TRUE(backend->UnpackStates(*a.model, a.view, slots, 2, sa.data()).ok());
  ASSERT_TRUE(backend->UnpackStates(*b.model, b.view, slots, 2, sb.data()).ok());
  EXPECT_LE(RelativeError(sb, sa), 1e-6);
  // The packed bytes do differ: rows really are stored permuted.
  EXPECT_NE(a.Bytes(), b.Bytes());
}

TEST_P(ArchTest, PrefillEqualsTokenByTokenDecodeInFp32) {
  const ModelGeometry geo = GetParam();
  auto backend = Backend2();
  StateLayout layout = *StateLayout::Create(geo, {StateFormat::kFp32, 0}, RandomKeyPerms(geo, 2), {}, {});
  TestPool a = MakeTestPool(*backend, layout, 1), b = MakeTestPool(*backend, layout, 1);
  const int tokens = 9;
  TokenBatch in = RandomBatch(geo, tokens, 3);
  const int32_t slot = 0;
  std::vector<float> o_prefill(tokens * geo.h_v * geo.d_v), o_decode(o_prefill.size());
  PrefillInputs p{1, tokens, &slot, DType::kFp32, in.q.data(), in.k.data(), in.v.data(),
                  in.g.data(), in.beta.data(), o_prefill.data()};
  ASSERT_TRUE(backend->Prefill(*a.model, a.view, 1, p).ok());
  for (int t = 0; t < tokens; ++t) {
    ASSERT_TRUE(backend->DecodeUpdate(*b.model, b.view, 1,
                                      DecodeInputsFor(in, geo, &slot, 1, o_decode.data() + t * geo.h_v * geo.d_v, t)).ok());
  }
  EXPECT_EQ(o_prefill, o_decode);
  EXPECT_EQ(a.Bytes(), b.Bytes());
}

TEST_P(ArchTest, SlotsOutsideTheBatchAndSkippedEntriesAreUntouched) {
  const ModelGeometry geo = GetParam();
  auto backend = Backend2();
  StateLayout layout = *StateLayout::Identity(geo, {StateFormat::kDamp, 8});
  TestPool pool = MakeTestPool(*backend, layout, 5);
  // Give every slot non-zero content first.
  const int32_t all[5] = {0, 1, 2, 3, 4};
  TokenBatch warm = RandomBatch(geo, 5, 1);
  std::vector<float> o(5 * geo.h_v * geo.d_v);
  ASSERT_TRUE(backend->DecodeUpdate(*pool.model, pool.view, 0, DecodeInputsFor(warm, geo, all, 5, o.data())).ok());
  const std::vector<uint8_t> before = pool.Bytes();
  const int32_t batch[3] = {3, -1, 1};
  TokenBatch in = RandomBatch(geo, 3, 2);
  std::fill(o.begin(), o.end(), 7.0f);
  ASSERT_TRUE(backend->DecodeUpdate(*pool.model, pool.view, 0, DecodeInputsFor(in, geo, batch, 3, o.data())).ok());
  const std::vector<uint8_t> after = pool.Bytes();
  const int64_t sb = pool.view.slot_bytes();
  for (int s : {0, 2, 4}) {
    EXPECT_TRUE(std::equal(after.begin() + s * sb, after.begin() + (s + 1) * sb, before.begin() + s * sb)) << s;
  }
  for (int s : {1, 3}) {
    EXPECT_FALSE(std::equal(after.begin() + s * sb, after.begin() + (s + 1) * sb, before.begin() + s * sb)) << s;
  }
  // The skipped entry's output is zeroed; the others are written.
  for (int j = 0; j < geo.h_v * geo.d_v; ++j) EXPECT_EQ(o[geo.h_v * geo.d_v + j], 0.0f);
  EXPECT_NE(o[0], 7.0f);
}

TEST_P(ArchTest, Bf16InputsEqualFp32InputsOfTheRoundedValues) {
  const ModelGeometry geo = GetParam();
  auto backend = Backend2();
  StateLayout layout = *StateLayout::Identity(geo, {StateFormat::kDamp, 16});
  TestPool a = MakeTestPool(*backend, layout, 1), b = MakeTestPool(*backend, layout, 1);
  TokenBatch in = RandomBatch(geo, 1, 9);
  std::vector<uint16_t> q16(in.q.size()), k16(in.k.size()), v16(in.v.size());
  for (size_t i = 0; i < in.q.size(); ++i) in.q[i] = Bf16BitsToFloat(q16[i] = FloatToBf16Bits(in.q[i]));
  for (size_t i = 0; i < in.k.size(); ++i) in.k[i] = Bf16BitsToFloat(k16[i] = FloatToBf16Bits(in.k[i]));
  for (size_t i = 0; i < in.v.size(); ++i) in.v[i] = Bf16BitsToFloat(v16[i] = FloatToBf16Bits(in.v[i]));
  const int32_t slot = 0;
  std::vector<float> oa(geo.h_v * geo.d_v), ob(oa.size());
  ASSERT_TRUE(backend->DecodeUpdate(*a.model, a.view, 0, DecodeInputsFor(in, geo, &slot, 1, oa.data())).ok());
  DecodeInputs bf = DecodeInputsFor(in, geo, &slot, 1, ob.data());
  bf.dtype = DType::kBf16;
  bf.q = q16.data();
  bf.k = k16.data();
  bf.v = v16.data();
  ASSERT_TRUE(backend->DecodeUpdate(*b.model, b.view, 0, bf).ok());
  EXPECT_EQ(oa, ob);
  EXPECT_EQ(a.Bytes(), b.Bytes());
}

TEST_P(ArchTest, PackUnpackRoundTrips) {
  const ModelGeometry geo = GetParam();
  auto backend = Backend2();
  std::mt19937 rng(4);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  const int64_t values = geo.HeadsPerSlot() * geo.d_k * geo.d_v;
  std::vector<float> states(2 * values);
  for (float& x : states) x = n01(rng);
  const int32_t slots[2] = {2, 0};
  for (const char* name : {"fp32", "damp:16", "damp-sr:8", "int4-hadamard"}) {
    const FormatSpec spec = *ParseFormatSpec(name);
    StateLayout layout = spec.format == StateFormat::kDampSr
                             ? *StateLayout::Identity(geo, spec)
                             : *StateLayout::Create(geo, spec, RandomKeyPerms(geo, 8), {}, {});
    TestPool pool = MakeTestPool(*backend, layout, 3);
    ASSERT_TRUE(backend->PackStates(*pool.model, pool.view, slots, 2, states.data()).ok());
    std::vector<float> back(states.size());
    ASSERT_TRUE(backend->UnpackStates(*pool.model, pool.view, slots, 2, back.data()).ok());
    const double want = spec.format == StateFormat::kFp32 ? 0.0
                        : spec.format == StateFormat::kInt4Hadamard ? 0.13 : 8e-3;
    EXPECT_LE(RelativeError(back, states), want) << name;
  }
}

// With every row in FP16 (k_hi = d_k) the transformed-domain recurrence of
// damp (H32) and damp-sr (random value order and scales) must track FP32 to
// FP16 accuracy: a wrong M^T / M^-T would be off by O(1).
TEST_P(ArchTest, ValueTransformsPreserveTheRecurrence) {
  const ModelGeometry geo = GetParam();
  auto backend = Backend2();
  std::mt19937 rng(21);
  std::vector<int32_t> order;
  std::vector<float> scale;
  for (int64_t h = 0; h < geo.HeadsPerSlot(); ++h) {
    std::vector<int32_t> p(geo.d_v);
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
    order.insert(order.end(), p.begin(), p.end());
    for (int j = 0; j < geo.d_v; ++j) scale.push_back(std::exp2(static_cast<float>(rng() % 7) - 3.0f));
  }
  StateLayout ref_layout = *StateLayout::Identity(geo, {StateFormat::kFp32, 0});
  StateLayout damp = *StateLayout::Create(geo, {StateFormat::kDamp, geo.d_k}, RandomKeyPerms(geo, 1), {}, {});
  StateLayout sr = *StateLayout::Create(geo, {StateFormat::kDampSr, geo.d_k}, RandomKeyPerms(geo, 2),
                                        order, scale);
  TestPool ref = MakeTestPool(*backend, ref_layout, 1), a = MakeTestPool(*backend, damp, 1), b = MakeTestPool(*backend, sr, 1);
  const int steps = 16;
  TokenBatch in = RandomBatch(geo, steps, 5);
  const int32_t slot = 0;
  std::vector<float> o_ref(geo.h_v * geo.d_v), o_a(o_ref.size()), o_b(o_ref.size());
  for (int t = 0; t < steps; ++t) {
    ASSERT_TRUE(backend->DecodeUpdate(*ref.model, ref.view, 0, DecodeInputsFor(in, geo, &slot, 1, o_ref.data(), t)).ok());
    ASSERT_TRUE(backend->DecodeUpdate(*a.model, a.view, 0, DecodeInputsFor(in, geo, &slot, 1, o_a.data(), t)).ok());
    ASSERT_TRUE(backend->DecodeUpdate(*b.model, b.view, 0, DecodeInputsFor(in, geo, &slot, 1, o_b.data(), t)).ok());
    EXPECT_LE(RelativeError(o_a, o_ref), 2e-3) << t;
    EXPECT_LE(RelativeError(o_b, o_ref), 2e-3) << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ArchTest, ::testing::Values(kGdnSmall, kKdaSmall),
                         [](const auto& info) { return info.param.arch == Arch::kGdn ? "gdn_gva" : "kda"; });

// ---------------------------------------------------------------------------
// Bad input: kInvalidArgument naming the problem, and nothing written.

TEST(CpuBackendErrorsTest, BadInputIsRejectedAndNothingIsWritten) {
  const ModelGeometry geo = kKdaSmall;
  auto backend = Backend2();
  StateLayout layout = *StateLayout::Identity(geo, {StateFormat::kDamp, 16});
  TestPool pool = MakeTestPool(*backend, layout, 3);
  const int32_t slots[2] = {0, 2};
  TokenBatch good = RandomBatch(geo, 2, 1);
  std::vector<float> o(2 * geo.h_v * geo.d_v);
  ASSERT_TRUE(backend->DecodeUpdate(*pool.model, pool.view, 0, DecodeInputsFor(good, geo, slots, 2, o.data())).ok());
  const std::vector<uint8_t> before = pool.Bytes();

  auto expect_invalid = [&](DecodeInputs in, int layer, const std::string& needle) {
    const absl::Status s = backend->DecodeUpdate(*pool.model, pool.view, layer, in);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle << ": " << s;
    EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s.message();
    EXPECT_EQ(pool.Bytes(), before) << needle;
  };
  for (const char* field : {"q", "k", "v", "g", "beta"}) {
    for (float bad : {std::nanf(""), INFINITY}) {
      TokenBatch b = good;
      std::vector<float>& x = std::string(field) == "q"   ? b.q
                              : std::string(field) == "k" ? b.k
                              : std::string(field) == "v" ? b.v
                              : std::string(field) == "g" ? b.g
                                                          : b.beta;
      x[x.size() - 1] = bad;  // the last head of the last slot
      expect_invalid(DecodeInputsFor(b, geo, slots, 2, o.data()), 0, std::string(field) + "[");
    }
  }
  TokenBatch positive_g = good;
  positive_g.g[3] = 0.5f;
  expect_invalid(DecodeInputsFor(positive_g, geo, slots, 2, o.data()), 0, "g[3]");
  TokenBatch big_beta = good;
  big_beta.beta[1] = 3.0f;
  expect_invalid(DecodeInputsFor(big_beta, geo, slots, 2, o.data()), 0, "beta[1]");
  expect_invalid(DecodeInputsFor(good, geo, slots, 2, o.data()), geo.layers, "layer");
  expect_invalid(DecodeInputsFor(good, geo, slots, 2, o.data()), -1, "layer");
  const int32_t out_of_range[2] = {0, 3};
  expect_invalid(DecodeInputsFor(good, geo, out_of_range, 2, o.data()), 0, "slots[1]");
  const int32_t duplicate[2] = {2, 2};
  expect_invalid(DecodeInputsFor(good, geo, duplicate, 2, o.data()), 0, "twice");
  // A pool whose shape does not match the model (dimension mismatch).
  PoolView wrong = pool.view;
  wrong.head_bytes += 16;
  const absl::Status s = backend->DecodeUpdate(*pool.model, wrong, 0, DecodeInputsFor(good, geo, slots, 2, o.data()));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pool"), absl::string_view::npos);
  EXPECT_EQ(pool.Bytes(), before);
  // NaN in a packed FP32 state.
  std::vector<float> states(geo.HeadsPerSlot() * geo.d_k * geo.d_v, 0.0f);
  states[17] = std::nanf("");
  const absl::Status ps = backend->PackStates(*pool.model, pool.view, slots, 1, states.data());
  EXPECT_EQ(ps.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Bytes(), before);
}

// The entry bound on states (kernels/formats/state_bound.h): PackStates
// refuses values beyond kMaxStateMagnitude (issue 26: a state of 3e38 was
// accepted and the next update wrote Inf), and the worst step its derivation
// allows from a state at the bound (d_k = 256, a Householder key with beta = 2
// concentrating a column of +B into one value, |v| = 65504, no decay, readout
// scale kMaxReadoutScale) stays finite in o and in the stored state.
TEST(CpuBackendErrorsTest, PackStatesEnforcesTheStateMagnitudeBound) {
  ModelGeometry geo{Arch::kGdn, 1, 1, 1, 256, 32};
  geo.scale = kMaxReadoutScale;
  auto backend = Backend2();
  const int64_t values = int64_t{geo.d_k} * geo.d_v;
  for (const FormatSpec& f : {FormatSpec{StateFormat::kFp32, 0}, FormatSpec{StateFormat::kBf16, 0},
                              FormatSpec{StateFormat::kDamp, 16}}) {
    SCOPED_TRACE(FormatSpecName(f));
    StateLayout layout = *StateLayout::Identity(geo, f);
    TestPool pool = MakeTestPool(*backend, layout, 2);
    const int32_t slot = 1;
    const std::vector<uint8_t> before = pool.Bytes();
    auto expect_refused = [&](float x, int64_t at, const std::string& message) {
      std::vector<float> states(values, 1.0f);
      states[at] = x;
      const absl::Status s = backend->PackStates(*pool.model, pool.view, &slot, 1, states.data());
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << x;
      EXPECT_EQ(std::string(s.message()).rfind(message, 0), 0u) << s.message();
      EXPECT_EQ(pool.Bytes(), before);
    };
    expect_refused(3e38f, 0, "states[0]: 3e+38 exceeds the state magnitude bound |x| <= 2^64");
    expect_refused(-std::nextafter(kMaxStateMagnitude, INFINITY), 77, "states[77]: -1.84467e+19 exceeds");
    expect_refused(std::nanf(""), 5, "states[5]: nan is not finite");
    expect_refused(-INFINITY, 6, "states[6]: -inf is not finite");

    std::vector<float> at_bound(values, kMaxStateMagnitude);
    ASSERT_TRUE(backend->PackStates(*pool.model, pool.view, &slot, 1, at_bound.data()).ok());
    TokenBatch in;
    in.q.assign(geo.d_k, 0.0f);
    in.q[0] = 1.0f;
    in.k.assign(geo.d_k, 1.0f / std::sqrt(480.0f));  // (s - ||s|| e_0) / ||.||, s = (1, ..., 1)
    in.k[0] = -15.0f / std::sqrt(480.0f);
    in.v.assign(geo.d_v, -kFp16Max);
    in.g.assign(1, 0.0f);
    in.beta.assign(1, 2.0f);
    std::vector<float> o(geo.d_v);
    ASSERT_TRUE(backend->DecodeUpdate(*pool.model, pool.view, 0,
                                      DecodeInputsFor(in, geo, &slot, 1, o.data()))
                    .ok());
    std::vector<float> after(values);
    ASSERT_TRUE(backend->UnpackStates(*pool.model, pool.view, &slot, 1, after.data()).ok());
    for (int j = 0; j < geo.d_v; ++j) EXPECT_TRUE(std::isfinite(o[j])) << j << ": " << o[j];
    for (int64_t i = 0; i < values; ++i) {
      ASSERT_TRUE(std::isfinite(after[i])) << i << ": " << after[i];
    }
    if (f.format == StateFormat::kFp32) {
      // Row 0 took the column's whole norm: 16 B, read out at scale 2^16.
      EXPECT_NEAR(after[0] / kMaxStateMagnitude, 16.0, 1e-3);
      EXPECT_NEAR(o[0] / (kMaxReadoutScale * kMaxStateMagnitude), 16.0, 1e-3);
    }
  }
}

TEST(CpuBackendCopyTest, CopyWithinCopiesTheBytesAndRefusesNegativeSizes) {
  std::unique_ptr<CpuBackend> backend = Backend2();
  auto buf = backend->Allocate(4096).value();
  for (int i = 0; i < 2048; ++i) buf->data()[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_TRUE(backend->CopyWithin(buf->data() + 2048, buf->data(), 2048).ok());
  EXPECT_EQ(0, std::memcmp(buf->data() + 2048, buf->data(), 2048));
  const absl::Status s = backend->CopyWithin(buf->data(), buf->data() + 2048, -1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bytes"), absl::string_view::npos) << s;
}

TEST(CpuBackendCopyTest, CopyOutThenInSwapsTheRegionsBytes) {
  std::unique_ptr<CpuBackend> backend = Backend2();
  auto region = backend->Allocate(3000).value();
  std::vector<uint8_t> in(3000), out(3000, 0), before(3000);
  for (int i = 0; i < 3000; ++i) {
    before[i] = region->data()[i] = static_cast<uint8_t>(i * 7 + 3);
    in[i] = static_cast<uint8_t>(i * 13 + 1);
  }
  ASSERT_TRUE(backend->CopyOutThenIn(out.data(), region->data(), in.data(), 3000).ok());
  EXPECT_EQ(out, before);
  EXPECT_EQ(0, std::memcmp(region->data(), in.data(), 3000));
  EXPECT_EQ(backend->CopyOutThenIn(out.data(), region->data(), in.data(), -1).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuBackendErrorsTest, LayoutAndGeometryErrorsNameTheField) {
  const absl::StatusOr<StateLayout> too_many = StateLayout::Identity(kGdnSmall, {StateFormat::kDamp, 65});
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("k_hi"), absl::string_view::npos);
  ModelGeometry bad = kGdnSmall;
  bad.h_v = 3;  // not a multiple of h_qk = 2
  EXPECT_EQ(StateLayout::Identity(bad, {StateFormat::kFp32, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = kGdnSmall;
  bad.d_v = 48;
  EXPECT_NE(StateLayout::Identity(bad, {StateFormat::kFp32, 0}).status().message().find("d_v"),
            absl::string_view::npos);
  std::vector<int32_t> not_perm(kGdnSmall.HeadsPerSlot() * kGdnSmall.d_k, 0);
  const absl::Status s = StateLayout::Create(kGdnSmall, {StateFormat::kFp32, 0}, not_perm, {}, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("key_perm"), absl::string_view::npos);
  EXPECT_EQ(ParseFormatSpec("int5").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace statecache
