#include "kernels/formats/format.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

TEST(FormatTest, NamesRoundTrip) {
  for (StateFormat f : AllStateFormats()) {
    absl::StatusOr<FormatSpec> spec = ParseFormatSpec(FormatName(f));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->format, f);
    EXPECT_EQ(spec->k_hi, IsMixedFormat(f) ? kDefaultKHi : 0);
    absl::StatusOr<FormatSpec> again = ParseFormatSpec(FormatSpecName(*spec));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *spec);
  }
  EXPECT_EQ(AllStateFormats().size(), 11u);
  for (StateFormat f : {StateFormat::kStepQuant6, StateFormat::kStepQuant4}) {
    absl::StatusOr<FormatSpec> spec = ParseFormatSpec(FormatName(f));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(*spec, (FormatSpec{f, 0}));
    EXPECT_TRUE(ValidateFormatSpec(*spec, 128).ok());
    EXPECT_EQ(ParseFormatSpec(absl::StrCat(FormatName(f), ":4")).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(FormatName(StateFormat::kStepQuant6), std::string("stepquant-6"));
  EXPECT_EQ(FormatName(StateFormat::kStepQuant4), std::string("stepquant-4"));
  EXPECT_EQ(StepQuantNominalBits(StateFormat::kStepQuant4), 4);
  EXPECT_EQ(AllFormatsWithStepQuant().size(), 13u);
}

// The format table (STATECACHE_FORMAT_TABLE): codes 0..n-1 in order, one
// row per format, distinct names, and the accessors read their row.
TEST(FormatTest, TableRowsAreConsistent) {
  static_assert(kNumAllStateFormats == 13 && kNumStateFormats == 11, "format count");
  std::set<std::string> names;
  for (int i = 0; i < kNumAllStateFormats; ++i) {
    const StateFormat f = kAllFormats[i];
    const FormatTraits t = TraitsOf(f);
    EXPECT_EQ(static_cast<int>(f), i);
    EXPECT_EQ(t.format, f);
    EXPECT_TRUE(names.insert(t.name).second) << t.name;
    EXPECT_EQ(IsMixedFormat(f), t.mixed) << t.name;
    EXPECT_EQ(HiRowCodec(f), t.hi) << t.name;
    EXPECT_EQ(LoRowCodec(f), t.lo) << t.name;
    EXPECT_EQ(ValueTransformOf(f), t.transform) << t.name;
    EXPECT_EQ(IsStagedFormat(f), t.staged) << t.name;
    EXPECT_EQ(IsStepQuantFormat(f), t.unit == CudaUnit::kStepQuant) << t.name;
    EXPECT_EQ(t.mixed, f == StateFormat::kDamp || f == StateFormat::kDampSr) << t.name;
  }
  EXPECT_EQ(StepQuantNominalBits(StateFormat::kStepQuant6), 6);
  EXPECT_EQ(StepQuantNominalBits(StateFormat::kDamp), 0);
  EXPECT_EQ(FormatName(static_cast<StateFormat>(42)), std::string("unknown"));
}

TEST(FormatTest, KHiSuffix) {
  absl::StatusOr<FormatSpec> spec = ParseFormatSpec("damp:32");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->k_hi, 32);
  EXPECT_EQ(FormatSpecName(*spec), "damp:32");
}

TEST(FormatTest, BadNamesAreInvalidArgument) {
  for (const char* bad : {"", "int3", "DAMP", "damp:", "damp:x", "damp:-1", "fp16:4", "damp:1:2"}) {
    absl::StatusOr<FormatSpec> spec = ParseFormatSpec(bad);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseFormatSpec("int3").status().message().find("int3"), absl::string_view::npos);
}

TEST(FormatTest, ValidateKHiAgainstDk) {
  EXPECT_TRUE(ValidateFormatSpec({StateFormat::kDamp, 128}, 128).ok());
  const absl::Status too_big = ValidateFormatSpec({StateFormat::kDamp, 129}, 128);
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(too_big.message(),
            "format: 'damp:129': k_hi 129 is outside 0..128 (the FP16 key rows of a head: at "
            "most d_k = 128)");
  const absl::Status uniform = ValidateFormatSpec({StateFormat::kInt8, 4}, 128);
  EXPECT_EQ(uniform.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(uniform.message().rfind("format: 'int8'", 0), 0u) << uniform.message();
  EXPECT_EQ(ValidateFormatSpec({static_cast<StateFormat>(42), 0}, 128).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace statecache
