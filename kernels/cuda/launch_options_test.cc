#include "kernels/cuda/launch_options.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace statecache {
namespace {

constexpr const char* kVars[] = {"STATECACHE_CUDA_PDL", "STATECACHE_CUDA_PIPELINE",
                                 "STATECACHE_CUDA_STAGES", "STATECACHE_STEPQUANT_FAST",
                                 "STATECACHE_STEPQUANT_VARIANT", "STATECACHE_QUEUE_BLOCKING_SYNC"};

class LaunchOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
  }
  void TearDown() override { SetUp(); }
};

TEST_F(LaunchOptionsTest, UnsetEnvironmentGivesTheDefaults) {
  const LaunchOptions o = LaunchOptionsFromEnvironment();
  const LaunchOptions d;
  EXPECT_TRUE(o.programmatic_launch);
  EXPECT_TRUE(o.pipeline);
  EXPECT_EQ(o.forced_stages, 0);
  EXPECT_TRUE(o.stepquant_fast);
  EXPECT_EQ(o.stepquant_variant, StepQuantVariant::kTile);
  EXPECT_EQ(o.programmatic_launch, d.programmatic_launch);
  EXPECT_EQ(o.pipeline, d.pipeline);
  EXPECT_EQ(o.forced_stages, d.forced_stages);
  EXPECT_EQ(o.stepquant_fast, d.stepquant_fast);
  EXPECT_EQ(o.stepquant_variant, d.stepquant_variant);
  EXPECT_FALSE(o.queue_blocking_sync);
  EXPECT_EQ(o.queue_blocking_sync, d.queue_blocking_sync);
}

TEST_F(LaunchOptionsTest, OffByDefaultFlagsAreOnOnlyWhenSetToOneThatIsNotZero) {
  for (const char* value : {"1", "yes"}) {
    setenv("STATECACHE_QUEUE_BLOCKING_SYNC", value, 1);
    EXPECT_TRUE(LaunchOptionsFromEnvironment().queue_blocking_sync) << value;
  }
  for (const char* value : {"0", ""}) {
    setenv("STATECACHE_QUEUE_BLOCKING_SYNC", value, 1);
    EXPECT_FALSE(LaunchOptionsFromEnvironment().queue_blocking_sync) << value;
  }
}

TEST_F(LaunchOptionsTest, FlagsAreOnUnlessTheyStartWithZero) {
  setenv("STATECACHE_CUDA_PDL", "0", 1);
  setenv("STATECACHE_CUDA_PIPELINE", "off", 1);
  setenv("STATECACHE_STEPQUANT_FAST", "0", 1);
  LaunchOptions o = LaunchOptionsFromEnvironment();
  EXPECT_FALSE(o.programmatic_launch);
  EXPECT_TRUE(o.pipeline);
  EXPECT_FALSE(o.stepquant_fast);
  setenv("STATECACHE_STEPQUANT_FAST", "1", 1);
  EXPECT_TRUE(LaunchOptionsFromEnvironment().stepquant_fast);
}

TEST_F(LaunchOptionsTest, StagesAndVariant) {
  setenv("STATECACHE_CUDA_STAGES", "2", 1);
  EXPECT_EQ(LaunchOptionsFromEnvironment().forced_stages, 2);
  const struct {
    const char* value;
    StepQuantVariant want;
  } kCases[] = {{"h2", StepQuantVariant::kH2},
                {"c2", StepQuantVariant::kC2},
                {"c3", StepQuantVariant::kC3},
                {"tile", StepQuantVariant::kTile},
                {"", StepQuantVariant::kTile},
                {"other", StepQuantVariant::kTile}};
  for (const auto& c : kCases) {
    setenv("STATECACHE_STEPQUANT_VARIANT", c.value, 1);
    EXPECT_EQ(LaunchOptionsFromEnvironment().stepquant_variant, c.want) << c.value;
  }
}

}  // namespace
}  // namespace statecache
