#include "kernels/io/safetensors.h"

#include "kernels/formats/numeric.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/io/test_data.h"

namespace statecache {
namespace {

using absl::StatusCode;

// A raw file image: u64 LE header length, header, data.
std::string RawFile(const std::string& header, const std::string& data) {
  std::string out;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>(n & 0xFF));
    n >>= 8;
  }
  return out + header + data;
}

std::string Path(const std::string& rel) {
  auto p = SharedDataPath(rel);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : "";
}

TEST(SafetensorsTest, ReadsGdnGolden) {
  const std::string path = Path("models/gdn-tiny/golden.safetensors");
  ASSERT_FALSE(path.empty());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), 2 + 4 * 6);
  EXPECT_TRUE(f->metadata().empty());

  auto tokens = f->tensor("tokens");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(tokens->dtype, SafetensorsDtype::kI32);
  EXPECT_EQ(tokens->shape, (std::vector<int64_t>{64}));
  auto tok = f->ToInt64("tokens");
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(std::vector<int64_t>(tok->begin(), tok->begin() + 8),
            (std::vector<int64_t>{32, 61, 32, 114, 101, 46, 99, 111}));

  auto logits = f->ToFloat32("logits", {64, 256});
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_FLOAT_EQ((*logits)[0], -17.494956970214844f);
  EXPECT_FLOAT_EQ((*logits)[3], -17.538679122924805f);

  for (int l = 0; l < 4; ++l) {
    const std::string p = "layer" + std::to_string(l);
    EXPECT_EQ(f->tensor(p + ".q")->shape, (std::vector<int64_t>{64, 2, 128}));
    EXPECT_EQ(f->tensor(p + ".k")->shape, (std::vector<int64_t>{64, 2, 128}));
    EXPECT_EQ(f->tensor(p + ".v")->shape, (std::vector<int64_t>{64, 4, 128}));
    EXPECT_EQ(f->tensor(p + ".g")->shape, (std::vector<int64_t>{64, 4}));
    EXPECT_EQ(f->tensor(p + ".beta")->shape, (std::vector<int64_t>{64, 4}));
    EXPECT_EQ(f->tensor(p + ".final_state")->shape, (std::vector<int64_t>{4, 128, 128}));
  }
  EXPECT_EQ(f->tensor("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(f->ToFloat32("tokens").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->ToInt64("logits").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->ToFloat32("logits", {64, 255}).status().code(), StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, ReadsKdaGoldenGates) {
  auto f = SafetensorsFile::Open(Path("models/kda-tiny/golden.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tensor("layer0.g")->shape, (std::vector<int64_t>{64, 4, 128}));
  EXPECT_EQ(f->tensor("layer3.q")->shape, (std::vector<int64_t>{64, 4, 128}));
}

TEST(SafetensorsTest, ConvertsBf16Weights) {
  auto f = SafetensorsFile::Open(Path("models/gdn-tiny/model.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  auto t = f->tensor("model.norm.weight");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->dtype, SafetensorsDtype::kBF16);
  EXPECT_EQ(t->DebugString(), "BF16[512]");
  auto w = f->ToFloat32("model.norm.weight");
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->size(), 512u);
  EXPECT_EQ((*w)[0], 1.0f);
  EXPECT_EQ((*w)[1], 1.0078125f);
  EXPECT_EQ((*w)[2], 1.0390625f);
  EXPECT_EQ((*w)[3], 0.98828125f);
}

TEST(SafetensorsTest, HalfConversionsAreExact) {
  EXPECT_EQ(HalfBitsToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfBitsToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfBitsToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfBitsToFloat(0x0001), 5.9604644775390625e-8f);  // smallest subnormal
  EXPECT_EQ(HalfBitsToFloat(0x03FF), 6.097555160522461e-5f);   // largest subnormal
  EXPECT_TRUE(std::isinf(HalfBitsToFloat(0x7C00)));
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7E00)));
  EXPECT_TRUE(std::signbit(HalfBitsToFloat(0x8000)));
  EXPECT_EQ(Bf16BitsToFloat(0x3F80), 1.0f);
  EXPECT_EQ(Bf16BitsToFloat(0xC2F7), -123.5f);
}

TEST(SafetensorsTest, WriterRoundTripsAllDtypes) {
  SafetensorsWriter w;
  w.SetMetadata("format", "damp");
  w.SetMetadata("quote\"key", "line\nbreak");
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  ASSERT_TRUE(w.AddFloat32("b.f32", {2, 3}, f32).ok());
  ASSERT_TRUE(w.AddInt32("a.i32", {3}, std::vector<int32_t>{-1, 0, 7}).ok());
  ASSERT_TRUE(w.AddInt64("c.i64", {1}, std::vector<int64_t>{-(int64_t{1} << 40)}).ok());
  const uint16_t f16[] = {0x3C00, 0xC000, 0x3555};
  ASSERT_TRUE(w.Add("d.f16", SafetensorsDtype::kF16, {3},
                    std::string(reinterpret_cast<const char*>(f16), 6)).ok());
  const uint16_t bf16[] = {0x3F80, 0xC2F7};
  ASSERT_TRUE(w.Add("e.bf16", SafetensorsDtype::kBF16, {2, 1},
                    std::string(reinterpret_cast<const char*>(bf16), 4)).ok());
  ASSERT_TRUE(w.Add("f.u8", SafetensorsDtype::kU8, {3}, "\x01\xff\x80").ok());
  ASSERT_TRUE(w.Add("g.i8", SafetensorsDtype::kI8, {2}, "\xff\x05").ok());
  ASSERT_TRUE(w.Add("h.empty", SafetensorsDtype::kF32, {0, 4}, "").ok());

  const std::string bytes = w.Serialize();
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u) << "data must start 8-byte aligned";

  auto f = SafetensorsFile::FromBytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->metadata().at("format"), "damp");
  EXPECT_EQ(f->metadata().at("quote\"key"), "line\nbreak");
  EXPECT_EQ(f->names(), (std::vector<std::string>{"a.i32", "b.f32", "c.i64", "d.f16", "e.bf16",
                                                  "f.u8", "g.i8", "h.empty"}));
  EXPECT_EQ(*f->ToFloat32("b.f32", {2, 3}), f32);
  EXPECT_EQ(*f->ToInt64("a.i32"), (std::vector<int64_t>{-1, 0, 7}));
  EXPECT_EQ(*f->ToInt64("c.i64"), (std::vector<int64_t>{-(int64_t{1} << 40)}));
  EXPECT_EQ(*f->ToFloat32("d.f16"), (std::vector<float>{1.0f, -2.0f, 0.333251953125f}));
  EXPECT_EQ(*f->ToFloat32("e.bf16"), (std::vector<float>{1.0f, -123.5f}));
  EXPECT_EQ(*f->ToInt64("f.u8"), (std::vector<int64_t>{1, 255, 128}));
  EXPECT_EQ(*f->ToInt64("g.i8"), (std::vector<int64_t>{-1, 5}));
  EXPECT_EQ(f->ToFloat32("h.empty")->size(), 0u);

  // Widest dtype first (I64, F32, I32, BF16, F16, I8, U8), so every tensor is
  // aligned to its element size, as the Python package lays it out.
  const uint64_t data_start = 8 + header_len;
  for (const std::string& name : f->names()) {
    auto t = f->tensor(name);
    ASSERT_TRUE(t.ok());
    const uint64_t rel = static_cast<uint64_t>(t->bytes.data() - f->tensor("c.i64")->bytes.data());
    EXPECT_EQ(rel % SafetensorsDtypeSize(t->dtype), 0u) << name;
  }
  const std::string again = w.Serialize();
  EXPECT_EQ(again, bytes) << "serialization is deterministic";
  EXPECT_EQ(bytes.substr(data_start, 8),
            std::string(reinterpret_cast<const char*>(std::vector<int64_t>{-(int64_t{1} << 40)}.data()), 8))
      << "the I64 tensor comes first";
}

TEST(SafetensorsTest, WriterFileRoundTripAndErrors) {
  SafetensorsWriter w;
  ASSERT_TRUE(w.AddFloat32("x", {2}, std::vector<float>{1.0f, 2.0f}).ok());
  EXPECT_EQ(w.AddFloat32("x", {2}, std::vector<float>{1.0f, 2.0f}).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(w.AddFloat32("y", {3}, std::vector<float>{1.0f, 2.0f}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddFloat32("y", {-1}, std::vector<float>{}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddFloat32("", {1}, std::vector<float>{1.0f}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddFloat32("__metadata__", {1}, std::vector<float>{1.0f}).code(),
            StatusCode::kInvalidArgument);

  const char* tmpdir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmpdir ? tmpdir : "/tmp") + "/rt.safetensors";
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f->ToFloat32("x"), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(w.WriteFile("/nonexistent_dir_xyz/a.safetensors").code(), StatusCode::kNotFound);
  EXPECT_EQ(SafetensorsFile::Open("/nonexistent_dir_xyz/a.safetensors").status().code(),
            StatusCode::kNotFound);
}

struct BadCase {
  const char* what;
  std::string bytes;
  const char* message_part;
};

TEST(SafetensorsTest, MalformedInputsAreInvalidArgument) {
  const std::string eight(8, '\0');
  const std::string ok_entry = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string huge_len = RawFile("{}", "");
  huge_len[0] = static_cast<char>(0xFF);
  huge_len[7] = static_cast<char>(0x7F);
  const std::vector<BadCase> cases = {
      {"empty file", "", "truncated"},
      {"7 bytes", std::string(7, '\0'), "truncated"},
      {"header past end", huge_len, "exceeds the file"},
      {"truncated header", RawFile(ok_entry, eight).substr(0, 20), "exceeds the file"},
      {"bad json", RawFile("{\"t\":", ""), "json"},
      {"not an object", RawFile("[1,2]", ""), "not a JSON object"},
      {"entry not object", RawFile(R"({"t":3})", ""), "entry is not a JSON object"},
      {"unknown dtype", RawFile(R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", eight),
       "unsupported dtype"},
      {"dtype not string", RawFile(R"({"t":{"dtype":1,"shape":[1],"data_offsets":[0,4]}})", eight),
       "dtype"},
      {"missing shape", RawFile(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", eight),
       "missing shape"},
      {"missing offsets", RawFile(R"({"t":{"dtype":"F32","shape":[1]}})", eight),
       "missing data_offsets"},
      {"extra field", RawFile(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})",
                              eight),
       "unexpected field"},
      {"negative dim", RawFile(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", eight),
       "shape[0]"},
      {"fractional dim", RawFile(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})",
                                 eight),
       "shape[0]"},
      {"shape overflow",
       RawFile(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
               eight),
       "overflows"},
      {"offsets not pair", RawFile(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", eight),
       "data_offsets"},
      {"offsets reversed", RawFile(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})",
                                   eight),
       "begin > end"},
      {"offsets beyond data", RawFile(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                                      eight),
       "beyond the data buffer"},
      {"size mismatch", RawFile(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", eight),
       "needs 4"},
      {"overlap", RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          eight),
       "overlap"},
      {"metadata not object", RawFile(R"({"__metadata__":[1]})", ""), "__metadata__"},
      {"metadata value not string", RawFile(R"({"__metadata__":{"k":1}})", ""), "expected a string"},
      {"duplicate tensor", RawFile(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                   R"("t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                   eight),
       "duplicate key"},
  };
  for (const BadCase& c : cases) {
    auto f = SafetensorsFile::FromBytes(c.bytes);
    ASSERT_FALSE(f.ok()) << c.what;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << c.what << ": " << f.status();
    EXPECT_NE(f.status().message().find(c.message_part), absl::string_view::npos)
        << c.what << ": " << f.status();
  }
  // And a minimal valid one, to show the cases above fail for their stated reason.
  auto good = SafetensorsFile::FromBytes(RawFile(ok_entry, eight));
  ASSERT_TRUE(good.ok()) << good.status();
  auto empty = SafetensorsFile::FromBytes(RawFile("{}", ""));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 0);
}

TEST(SafetensorsTest, EveryTruncationOfARealHeaderFailsCleanly) {
  SafetensorsWriter w;
  w.SetMetadata("k", "v");
  ASSERT_TRUE(w.AddFloat32("a", {2, 2}, std::vector<float>{1, 2, 3, 4}).ok());
  ASSERT_TRUE(w.AddInt32("b", {1}, std::vector<int32_t>{5}).ok());
  const std::string bytes = w.Serialize();
  ASSERT_TRUE(SafetensorsFile::FromBytes(bytes).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto f = SafetensorsFile::FromBytes(bytes.substr(0, n));
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << "prefix " << n;
  }
  // Single-byte corruption anywhere must never crash (it may still parse).
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (unsigned char x : {0x00, 0x22, 0x5D, 0x7D, 0xFF}) {
      std::string b = bytes;
      b[i] = static_cast<char>(x);
      auto f = SafetensorsFile::FromBytes(b);
      if (!f.ok()) EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace statecache
