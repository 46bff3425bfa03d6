#include "client/model/linear.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace statecache {
namespace {

// Checks every shape class of the tiling (odd tokens, row tails, K tails)
// against a double-precision reference.
TEST(LinearTest, MatchesReferenceOnAwkwardShapes) {
  ThreadPool pool(3);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int64_t t : {1, 2, 3, 65, 130}) {
    for (int64_t k : {1, 7, 8, 13, 128, 512}) {
      for (int64_t n : {1, 3, 4, 5, 70, 257}) {
        std::vector<float> x(t * k), w(n * k), y(t * n, -1.0f);
        for (float& f : x) f = nd(rng);
        for (float& f : w) f = nd(rng);
        MatMulTransposed(&pool, x.data(), t, k, w.data(), n, y.data());
        for (int64_t i = 0; i < t; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double ref = 0, mag = 0;
            for (int64_t p = 0; p < k; ++p) {
              ref += double{x[i * k + p]} * w[j * k + p];
              mag += std::fabs(double{x[i * k + p]} * w[j * k + p]);
            }
            ASSERT_NEAR(y[i * n + j], ref, 1e-5 * mag + 1e-6)
                << "t=" << t << " k=" << k << " n=" << n << " at " << i << "," << j;
          }
        }
      }
    }
  }
}

TEST(LinearTest, SerialEqualsThreaded) {
  ThreadPool pool(4);
  std::vector<float> x(33 * 96), w(200 * 96), a(33 * 200), b(33 * 200);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * i);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.07f * i);
  MatMulTransposed(nullptr, x.data(), 33, 96, w.data(), 200, a.data());
  MatMulTransposed(&pool, x.data(), 33, 96, w.data(), 200, b.data());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace statecache
