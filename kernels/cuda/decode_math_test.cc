#include "kernels/cuda/decode_math.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/head_step.h"

namespace statecache {
namespace {

TEST(DecayExpTest, WithinTwoUlpOfExp) {
  for (float x = -103.0f; x <= 0.0f; x += 0.0137f) {
    const float want = std::exp(x);
    const float got = DecayExp(x);
    const float ulp = std::nextafter(want, 1.0f) - want;
    EXPECT_LE(std::fabs(got - want), 2.0f * ulp) << "x=" << x;
  }
  EXPECT_EQ(DecayExp(0.0f), 1.0f);
  EXPECT_EQ(DecayExp(-200.0f), 0.0f);
}

// The branch-free DecayExp against the form with early returns it replaced
// (its range ends written out here): the same bits everywhere, the range
// ends and their neighbours included.
float BranchyDecayExp(float x) {
  if (x < -104.0f) return 0.0f;
  if (x > 88.0f) x = 88.0f;
  return DecayExpInRange(x);
}

TEST(DecayExpTest, SameBitsAsTheBranchyForm) {
  std::vector<float> xs = {-std::numeric_limits<float>::infinity(), -1e30f, -104.5f,
                           std::nextafter(-104.0f, -200.0f), -104.0f,
                           std::nextafter(-104.0f, 0.0f), -103.97f, -87.5f, -1e-30f, -0.0f,
                           0.0f, 1e-30f, 87.9f, 88.0f, std::nextafter(88.0f, 100.0f), 1e30f,
                           std::numeric_limits<float>::infinity()};
  for (float x = -110.0f; x <= 90.0f; x += 0.00731f) xs.push_back(x);
  for (float x : xs) {
    EXPECT_EQ(FloatToBits(DecayExp(x)), FloatToBits(BranchyDecayExp(x))) << "x=" << x;
  }
  EXPECT_EQ(DecayExp(-104.5f), 0.0f);
  EXPECT_EQ(DecayExp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(DecayExp(1e30f), DecayExp(88.0f));
  EXPECT_GT(DecayExp(-87.0f), 0.0f);
}

TEST(DecodeTilingTest, Shapes) {
  const DecodeTiling t = MakeDecodeTiling(128, 128);
  EXPECT_EQ(t.stripes, 4);
  EXPECT_EQ(t.row_warps, 2);
  EXPECT_EQ(t.threads, 256);
  EXPECT_EQ(MakeDecodeTiling(100, 64).row_warps, 2);
  EXPECT_EQ(MakeDecodeTiling(64, 256).threads, 256);
}

TEST(WarpTreeSumTest, PairsByBit3First) {
  float p[16];
  for (int i = 0; i < 16; ++i) p[i] = 0.0f;
  p[0] = 1e20f;
  p[8] = -1e20f;
  p[1] = 1.0f;
  // (p0 + p8) cancels first, so the 1 survives; a serial sum would lose it.
  EXPECT_EQ(WarpTreeSum(p), 1.0f);
}

// The kernels' arithmetic matches the CPU backend's HeadStep up to FP32
// rounding (FMA, summation order, exp).
class ReferenceVsHeadStep : public ::testing::TestWithParam<Arch> {};

TEST_P(ReferenceVsHeadStep, AgreesToRounding) {
  const Arch arch = GetParam();
  const int d_k = 128, d_v = 128;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> w(d_k * d_v), q(d_k), k(d_k), g(d_k), v(d_v);
  for (float& x : w) x = normal(rng);
  float qn = 0, kn = 0;
  for (int r = 0; r < d_k; ++r) {
    q[r] = normal(rng);
    k[r] = normal(rng);
    qn += q[r] * q[r];
    kn += k[r] * k[r];
    g[r] = -0.5f * uni(rng);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_k));
  for (int r = 0; r < d_k; ++r) {
    q[r] = scale * (q[r] / std::sqrt(qn));
    k[r] /= std::sqrt(kn);
  }
  for (float& x : v) x = normal(rng);
  const float beta = 0.6f;
  std::vector<float> w_ref = w, w_cpu = w, o_ref(d_v), o_cpu(d_v), scratch(d_v), a(d_k);
  for (int r = 0; r < d_k; ++r) a[r] = DecayExp(arch == Arch::kKda ? g[r] : g[0]);
  ReferenceHeadStep(d_k, d_v, a.data(), k.data(), q.data(), beta, v.data(), w_ref.data(),
                    o_ref.data());
  HeadStepInputs in{q.data(), k.data(), g.data(), beta, v.data()};
  HeadStep(arch, d_k, d_v, in, w_cpu.data(), o_cpu.data(), scratch.data());
  double err = 0, norm = 0;
  for (int i = 0; i < d_k * d_v; ++i) {
    err += (w_ref[i] - w_cpu[i]) * double(w_ref[i] - w_cpu[i]);
    norm += w_cpu[i] * double(w_cpu[i]);
  }
  EXPECT_LT(std::sqrt(err / norm), 1e-6);
  err = norm = 0;
  for (int j = 0; j < d_v; ++j) {
    err += (o_ref[j] - o_cpu[j]) * double(o_ref[j] - o_cpu[j]);
    norm += o_cpu[j] * double(o_cpu[j]);
  }
  EXPECT_LT(std::sqrt(err / norm), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Arches, ReferenceVsHeadStep, ::testing::Values(Arch::kGdn, Arch::kKda));

}  // namespace
}  // namespace statecache
