#include "server/ops/checks.h"

#include <cmath>
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
