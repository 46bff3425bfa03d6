#include "kernels/cuda/internal/stage_layout.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "kernels/formats/format.h"

namespace statecache {
namespace cuda_internal {
namespace {

// The H200 (cudaDevAttrMaxSharedMemoryPerMultiprocessor and
// cudaDevAttrMaxSharedMemoryPerBlockOptin).
constexpr int kSmemPerSm = 233472;
constexpr int kSmemPerBlock = 232448;

// The fixed-shape kernels' stage for format f and q / k / v element bytes
// ds, with the stage count the launcher picks: StagedStageLayout for the
// staged kernel's formats, else FixedShapeStageOffsets with ChooseStages as
// MakeStageLayout does.
StageLayout FixedStage(StateFormat f, int ds, int forced = 0) {
  if (IsStagedFormat(f)) return StagedStageLayout(f, ds, kSmemPerSm, kSmemPerBlock, forced);
  StageLayout sl = FixedShapeStageOffsets(f, ds);
  ChooseStages(MakeDecodeTiling(128, 128), 128, kSmemPerSm, kSmemPerBlock, forced, &sl);
  return sl;
}

// CTAs of the fixed-shape kernel per SM that the stage counts plan for.
int CtasPerSm(StateFormat f) { return IsStagedFormat(f) ? kStagedCtasPerSm : 2; }

int64_t CtaBytes(const StageLayout& sl) {
  return sl.scratch_bytes + int64_t{sl.stages} * sl.bytes + 1024;
}

TEST(StageOffsets, FieldsAreAlignedAndInsideTheStage) {
  for (StateFormat f : AllStateFormats()) {
    for (int ds : {2, 4}) {
      const StageLayout sl = FixedStage(f, ds);
      const std::string what = std::string(FormatName(f)) + " ds " + std::to_string(ds);
      EXPECT_EQ(sl.head, 0) << what;
      for (int off : {sl.q, sl.k, sl.v, sl.g, sl.perm, sl.order, sl.scale, sl.header}) {
        EXPECT_EQ(off % 16, 0) << what;
      }
      EXPECT_LE(sl.header + 4 * kStageHeaderWords, sl.bytes) << what;
      EXPECT_EQ(sl.bytes % 1024, 0) << what;
      EXPECT_EQ(sl.scratch_bytes % 1024, 0) << what;
    }
  }
}

// As many stages as fit the planned CTAs: two CTAs of whole heads with
// three stages for the compressed formats (damp's 20 KiB heads included,
// with either input width) and two for 16-bit heads (32 KiB); two staged
// CTAs of fp32 half heads (ColumnParts, 32 KiB) with three stages. A
// scratch or stage that grows past these budgets shows up here before it
// shows up as a slower H200 run.
TEST(ChooseStages, StageCountsOnTheH200) {
  for (StateFormat f : AllStateFormats()) {
    const bool fp32 = f == StateFormat::kFp32;
    EXPECT_EQ(IsStagedFormat(f), fp32) << FormatName(f);
    EXPECT_EQ(ColumnParts(f, true), fp32 ? 2 : 1) << FormatName(f);
    EXPECT_EQ(ColumnParts(f, false), 1) << FormatName(f);
    for (int ds : {2, 4}) {
      const StageLayout sl = FixedStage(f, ds);
      const std::string what = std::string(FormatName(f)) + " ds " + std::to_string(ds);
      const bool half = f == StateFormat::kFp16 || f == StateFormat::kBf16;
      EXPECT_EQ(sl.stages, half ? 2 : 3) << what;
      EXPECT_LE(CtasPerSm(f) * CtaBytes(sl) + 2048, kSmemPerSm) << what;
    }
  }
  // The staged kernel's scratch is the stripe exchange's arrays alone.
  EXPECT_EQ(StagedScratchBytes(), 3072);
  // Its CTAs fit the register file at 128 registers per thread.
  EXPECT_LE(kStagedCtasPerSm * kStagedThreads * 128, 65536);
}

TEST(ChooseStages, ForcedCountsNeverExceedOneCta) {
  // fp32 half heads: three 35 KiB stages fit one CTA.
  EXPECT_EQ(FixedStage(StateFormat::kFp32, 4, 3).stages, 3);
  EXPECT_EQ(FixedStage(StateFormat::kFp32, 4, 1).stages, 1);
  EXPECT_EQ(FixedStage(StateFormat::kDamp, 2, 1).stages, 1);
  EXPECT_EQ(FixedStage(StateFormat::kDamp, 2, 2).stages, 2);
  for (StateFormat f : AllStateFormats()) {
    for (int forced = 1; forced <= kMaxStages; ++forced) {
      const StageLayout sl = FixedStage(f, 4, forced);
      EXPECT_LE(CtaBytes(sl), kSmemPerBlock) << FormatName(f) << " forced " << forced;
      EXPECT_LE(sl.stages, forced) << FormatName(f);
    }
  }
  // Out-of-range values are ignored.
  EXPECT_EQ(FixedStage(StateFormat::kDamp, 2, 7).stages, FixedStage(StateFormat::kDamp, 2).stages);
}

}  // namespace
}  // namespace cuda_internal
}  // namespace statecache
