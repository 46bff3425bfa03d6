#include "server/core/proto_convert.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

v1::Tensor MakeTensor(v1::DType d, std::vector<int64_t> shape, size_t bytes) {
  v1::Tensor t;
  t.set_dtype(d);
  for (int64_t s : shape) t.add_shape(s);
  t.set_data(std::string(bytes, '\0'));
  return t;
}

TEST(CheckTensorTest, AcceptsExactShapeAndSize) {
  auto t = CheckTensor(MakeTensor(v1::DTYPE_BF16, {2, 3}, 12), "q", kInputDTypes, {2, 3});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype, DType::kBf16);
  EXPECT_EQ(t->count, 6);
  EXPECT_EQ(t->bytes, 12);
}

TEST(CheckTensorTest, NamesTheFieldOfEachDefect) {
  struct Case {
    v1::Tensor t;
    const char* want;
  } cases[] = {
      {MakeTensor(v1::DTYPE_FP32, {2, 4}, 32), "q.shape: [2, 4], want [2, 3]"},
      {MakeTensor(v1::DTYPE_FP32, {2}, 8), "q.shape"},
      {MakeTensor(v1::DTYPE_FP32, {2, 3}, 23), "q.data: 23 bytes, want 24"},
      {MakeTensor(v1::DTYPE_UNSPECIFIED, {2, 3}, 24), "q.dtype"},
      {MakeTensor(static_cast<v1::DType>(17), {2, 3}, 24), "q.dtype"},
      {v1::Tensor(), "q.data: missing"},
  };
  for (const Case& c : cases) {
    auto r = CheckTensor(c.t, "q", kInputDTypes, {2, 3});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.want));
  }
  auto g = CheckTensor(MakeTensor(v1::DTYPE_FP16, {2, 3}, 12), "g", kFp32Only, {2, 3});
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("g.dtype: fp16 is not allowed"));
}

TEST(GeometryFromProtoTest, ValidatesAndNamesFields) {
  v1::Geometry g;
  g.set_arch(v1::ARCH_KDA);
  g.set_layers(3);
  g.set_h_qk(4);
  g.set_h_v(4);
  g.set_d_k(64);
  g.set_d_v(64);
  auto ok = GeometryFromProto(g);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->arch, Arch::kKda);
  EXPECT_EQ(GeometryToProto(*ok).SerializeAsString(), g.SerializeAsString());
  g.set_arch(v1::ARCH_UNSPECIFIED);
  EXPECT_THAT(std::string(GeometryFromProto(g).status().message()), HasSubstr("geometry.arch"));
  g.set_arch(v1::ARCH_GDN);
  g.set_layers(0);
  EXPECT_THAT(std::string(GeometryFromProto(g).status().message()), HasSubstr("geometry.layers"));
}

TEST(TagsTest, EveryDifferingTagIsFailedPrecondition) {
  const ModelGeometry geo{Arch::kGdn, 2, 1, 2, 32, 32};
  const StateLayout layout =
      StateLayout::Identity(geo, ParseFormatSpec("damp:8").value()).value();
  v1::CompatibilityTags tags;
  TagsToProto("m", layout, &tags);
  EXPECT_EQ(tags.format(), "damp:8");
  EXPECT_EQ(tags.slot_bytes(), layout.slot_bytes());
  EXPECT_TRUE(CheckTagsMatch(tags, "m", layout).ok());
  auto expect_mismatch = [&](v1::CompatibilityTags t, const char* tag) {
    absl::Status s = CheckTagsMatch(t, "m", layout);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << tag;
    EXPECT_THAT(std::string(s.message()), HasSubstr(tag));
  };
  v1::CompatibilityTags t = tags;
  t.set_model_id("x");
  expect_mismatch(t, "tags.model_id");
  t = tags;
  t.set_format("damp:16");
  expect_mismatch(t, "tags.format");
  t = tags;
  t.set_layout_fingerprint(1);
  expect_mismatch(t, "tags.layout_fingerprint");
  t = tags;
  t.mutable_geometry()->set_d_k(64);
  expect_mismatch(t, "tags.geometry");
  t = tags;
  t.set_slot_bytes(1);
  expect_mismatch(t, "tags.slot_bytes");
  t = tags;
  t.set_format_version(99);
  expect_mismatch(t, "tags.format_version");
  // Revision 1 stored the lo rows row-major: its bytes do not decode here.
  EXPECT_EQ(tags.format_version(), 2u);
  t.set_format_version(1);
  expect_mismatch(t, "tags.format_version");
}

}  // namespace
}  // namespace statecache
