#include "kernels/layout/geometry.h"

#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace statecache {
namespace {

TEST(ParseGeometry, ReadsTheCommandLineForm) {
  const absl::StatusOr<ModelGeometry> g = ParseGeometry("kda:4:8:8:128:64", "geometry");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g, (ModelGeometry{Arch::kKda, 4, 8, 8, 128, 64}));
}

TEST(ParseGeometry, ErrorsNameTheFieldAndTheProblem) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {Case{"gdn:1:2:3", "is not arch:layers:h_qk:h_v:d_k:d_v"},
                        Case{"mamba:1:1:1:32:32", "unknown architecture 'mamba'"},
                        Case{"gdn:1:x:1:32:32", "'x' in 'gdn:1:x:1:32:32' is not a number"},
                        Case{"kda:1:1:2:32:32", "h_qk"},
                        Case{"gdn:1:1:1:32:48", "d_v"}}) {
    const absl::StatusOr<ModelGeometry> g = ParseGeometry(c.text, "report_geometry");
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    const std::string message(g.status().message());
    EXPECT_EQ(message.rfind("report_geometry: ", 0), 0u) << message;
    EXPECT_NE(message.find(c.says), std::string::npos) << message;
  }
}

// The readout scale is bounded so that o = S^T (scale q) of an accepted state
// cannot overflow (kernels/formats/state_bound.h).
TEST(ModelGeometryValidate, ScaleIsFiniteAndAtMostKMaxReadoutScale) {
  ModelGeometry g{Arch::kGdn, 1, 1, 1, 32, 32};
  for (float ok : {0.0f, 0.125f, 1.0f, kMaxReadoutScale}) {
    g.scale = ok;
    EXPECT_TRUE(g.Validate().ok()) << ok;
  }
  for (float bad : {-1.0f, std::nextafter(kMaxReadoutScale, 1e30f), 1e30f, std::nanf(""),
                    std::numeric_limits<float>::infinity()}) {
    g.scale = bad;
    const absl::Status s = g.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(std::string(s.message()).rfind("scale: ", 0), 0u) << s.message();
    EXPECT_NE(s.message().find("in [0, 65536]"), absl::string_view::npos) << s.message();
  }
}

}  // namespace
}  // namespace statecache
