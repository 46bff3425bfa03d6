#include "server/ops/checks.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace statecache {
namespace {

TEST(ChecksTest, LayerBatchAndWorkNameTheField) {
  EXPECT_TRUE(CheckLayer(0, 2, "layer").ok());
  absl::Status s = CheckLayer(2, 2, "tokens.layer");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tokens.layer: 2 is outside 0..1");

  EXPECT_TRUE(CheckBatch(4, 4, "slots").ok());
  s = CheckBatch(0, 4, "slots");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "slots: no slot handles given");
  s = CheckBatch(5, 4, "slots");
  EXPECT_EQ(s.message(), "slots: 5 slots exceed the limit of 4 per call");

  EXPECT_TRUE(CheckWork(8, 8, "slots").ok());
  s = CheckWork(9, 8, "tokens");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "tokens: 9 head updates (batch x tokens x heads) exceed the per-request limit of 8 "
            "(--max_work_heads)");
}

TEST(ChecksTest, MagnitudesNameTheRowOrElement) {
  const std::vector<float> unit = {0.6f, 0.8f}, big = {1.f, 1.f}, v = {1.f, 70000.f};
  auto view = [](const std::vector<float>& x) {
    return TensorBytes{DType::kFp32, x.data(), static_cast<int64_t>(x.size()),
                       static_cast<int64_t>(4 * x.size())};
  };
  EXPECT_TRUE(CheckMagnitudes("", view(unit), view(unit), view(unit), 2, 65504.f).ok());
  absl::Status s = CheckMagnitudes("tokens.", view(unit), view(big), view(unit), 2, 65504.f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().substr(0, 23), "tokens.k: row 0 has L2 ");
  s = CheckMagnitudes("", view(unit), view(unit), view(v), 2, 65504.f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "v: element 1 = 70000 exceeds |v| <= 65504");
}

TEST(ChecksTest, QuickPassImpliesTheExactChecks) {
  const int d = 20;  // 2 full 8-lane chunks and a remainder of 4
  std::vector<float> q(3 * d), v(3 * d, 2.f);
  for (int r = 0; r < 3; ++r) {
    for (int j = 0; j < d; ++j) q[r * d + j] = std::sqrt(1.f / d) * (j % 2 ? 1.f : -1.f);
  }
  auto view = [](const std::vector<float>& x, DType dt = DType::kFp32) {
    return TensorBytes{dt, x.data(), static_cast<int64_t>(x.size()),
                       static_cast<int64_t>(4 * x.size())};
  };
  EXPECT_TRUE(ValuesPassQuickly(view(q), view(q), view(v), d, 65504.f));
  EXPECT_TRUE(CheckMagnitudes("", view(q), view(q), view(v), d, 65504.f).ok());
  // Unaligned message bytes read the same.
  std::string bytes(1 + 4 * q.size(), '\0');
  std::memcpy(&bytes[1], q.data(), 4 * q.size());
  const TensorBytes odd{DType::kFp32, bytes.data() + 1, static_cast<int64_t>(q.size()),
                        static_cast<int64_t>(4 * q.size())};
  EXPECT_TRUE(ValuesPassQuickly(odd, odd, view(v), d, 65504.f));
  // Each bound, NaN and Inf in any tensor: no quick pass.
  auto fails = [&](std::vector<float> qq, std::vector<float> kk, std::vector<float> vv,
                   float max_abs) { return !ValuesPassQuickly(view(qq), view(kk), view(vv), d, max_abs); };
  std::vector<float> x = q;
  x[2 * d + 19] = std::numeric_limits<float>::quiet_NaN();  // in the remainder
  EXPECT_TRUE(fails(x, q, v, 65504.f));
  EXPECT_TRUE(fails(q, x, v, 65504.f));
  x = q;
  x[d + 3] = 1.f;  // row 1 norm^2 ~ 1.95
  EXPECT_TRUE(fails(q, x, v, 65504.f));
  std::vector<float> w = v;
  w[7] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(fails(q, q, w, std::numeric_limits<float>::infinity()));
  w[7] = -70000.f;
  EXPECT_TRUE(fails(q, q, w, 65504.f));
  w[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(fails(q, q, w, 65504.f));
  EXPECT_FALSE(ValuesPassQuickly(view(q, DType::kBf16), view(q), view(v), d, 65504.f));
  // Between the quick bound (1.02) and the exact one (1.0201): no quick pass,
  // the exact check accepts.
  std::vector<float> near(d, 0.f);
  near[0] = std::sqrt(1.02005f);
  EXPECT_TRUE(fails(near, q, v, 65504.f));
  EXPECT_TRUE(CheckMagnitudes("", view(near), view(q), view(v), d, 65504.f).ok());
  // Rows scaled across both bounds: a quick pass always implies the exact one.
  for (int i = 0; i <= 400; ++i) {
    const float scale = std::sqrt(0.99f + i * 0.0001f);
    std::vector<float> s = q;
    for (float& e : s) e *= scale;
    if (ValuesPassQuickly(view(s), view(q), view(v), d, 65504.f)) {
      EXPECT_TRUE(CheckMagnitudes("", view(s), view(q), view(v), d, 65504.f).ok()) << scale;
    }
  }
}

TEST(ChecksTest, SanitizeReplacesNonFiniteByZero) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1.f, inf, std::nanf(""), 2.f};
  TensorBytes t{DType::kFp32, x.data(), 4, 16};
  std::string storage;
  EXPECT_EQ(SanitizeTensor(&t, &storage), 2);
  const float* clean = static_cast<const float*>(t.data);
  EXPECT_EQ(clean[0], 1.f);
  EXPECT_EQ(clean[1], 0.f);
  EXPECT_EQ(clean[2], 0.f);
  EXPECT_EQ(clean[3], 2.f);
  EXPECT_EQ(x[1], inf);  // the input is not modified

  std::vector<float> g = {-inf, -1.f};
  EXPECT_EQ(SanitizeFloats(&g), 1);
  EXPECT_EQ(g[0], 0.f);
}

}  // namespace
}  // namespace statecache
