#include "kernels/formats/hadamard.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace statecache {
namespace {

// Column j of H32, computed by transforming the unit vector e_j.
std::vector<float> Column(int j) {
  std::vector<float> e(32, 0.0f);
  e[j] = 1.0f;
  Hadamard32(e.data());
  return e;
}

TEST(HadamardTest, OrthonormalAndSymmetric) {
  for (int i = 0; i < 32; ++i) {
    const std::vector<float> ci = Column(i);
    for (int j = 0; j < 32; ++j) {
      const std::vector<float> cj = Column(j);
      double dot = 0;
      for (int t = 0; t < 32; ++t) dot += double{ci[t]} * cj[t];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6) << i << "," << j;
      EXPECT_EQ(ci[j], cj[i]);  // H = H^T
    }
    for (float x : ci) EXPECT_NEAR(std::fabs(x), 1.0 / std::sqrt(32.0), 1e-7);
  }
}

TEST(HadamardTest, SelfInverseOnRandomBlocks) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> x(128), y;
  for (float& v : x) v = dist(rng);
  y = x;
  BlockHadamard32(y.data(), 128);
  double energy_x = 0, energy_y = 0;
  for (int i = 0; i < 128; ++i) {
    energy_x += double{x[i]} * x[i];
    energy_y += double{y[i]} * y[i];
  }
  EXPECT_NEAR(energy_y / energy_x, 1.0, 1e-6);  // orthogonal: norm preserved
  BlockHadamard32(y.data(), 128);
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(y[i], x[i], 1e-6 * (1 + std::fabs(x[i])));
}

TEST(HadamardTest, BlocksAreIndependent) {
  std::vector<float> x(64, 0.0f);
  x[40] = 1.0f;  // only the second block is non-zero
  BlockHadamard32(x.data(), 64);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(x[i], 0.0f);
  for (int i = 32; i < 64; ++i) EXPECT_NEAR(std::fabs(x[i]), 1.0 / std::sqrt(32.0), 1e-7);
}

}  // namespace
}  // namespace statecache
