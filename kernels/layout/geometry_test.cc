#include "kernels/layout/geometry.h"

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

}  // namespace
}  // namespace statecache
