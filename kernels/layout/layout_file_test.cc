#include "kernels/layout/layout_file.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "kernels/io/safetensors.h"

namespace statecache {
namespace {

using absl::StatusCode;

const ModelGeometry kGeo{Arch::kKda, 2, 3, 3, 16, 32, 0.0f};

StateLayout RandomLayout(StateFormat f, int k_hi, uint64_t seed) {
  std::mt19937 rng(seed);
  const int64_t heads = kGeo.HeadsPerSlot();
  std::vector<int32_t> perm(heads * kGeo.d_k), order;
  std::vector<float> scale;
  for (int64_t h = 0; h < heads; ++h) {
    std::iota(perm.begin() + h * kGeo.d_k, perm.begin() + (h + 1) * kGeo.d_k, 0);
    std::shuffle(perm.begin() + h * kGeo.d_k, perm.begin() + (h + 1) * kGeo.d_k, rng);
  }
  if (f == StateFormat::kDampSr) {
    order.resize(heads * kGeo.d_v);
    for (int64_t h = 0; h < heads; ++h) {
      std::iota(order.begin() + h * kGeo.d_v, order.begin() + (h + 1) * kGeo.d_v, 0);
      std::shuffle(order.begin() + h * kGeo.d_v, order.begin() + (h + 1) * kGeo.d_v, rng);
    }
    scale.resize(heads * kGeo.d_v);
    for (float& s : scale) s = 0.1f + (rng() % 1000) / 100.0f;
  }
  auto l = StateLayout::Create(kGeo, FormatSpec{f, k_hi}, perm, order, scale);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

TEST(LayoutFileTest, RoundTripDampAndDampSr) {
  for (StateFormat f : {StateFormat::kDamp, StateFormat::kDampSr}) {
    const StateLayout layout = RandomLayout(f, 4, 11);
    std::vector<float> scores(kGeo.HeadsPerSlot() * kGeo.d_k);
    for (size_t i = 0; i < scores.size(); ++i) scores[i] = 0.5f * i;
    const std::string path = ::testing::TempDir() + "/layout.safetensors";
    ASSERT_TRUE(WriteLayoutFile(layout, {{"selector", "ep"}}, scores, path).ok());
    const FormatSpec spec{f, 4};
    auto r = ReadLayoutFile(path, &kGeo, &spec);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->layout.geometry(), kGeo);
    EXPECT_EQ(r->layout.format(), spec);
    EXPECT_EQ(r->layout.all_key_perms(), layout.all_key_perms());
    EXPECT_EQ(r->layout.all_value_orders(), layout.all_value_orders());
    EXPECT_EQ(r->layout.all_value_scales(), layout.all_value_scales());
    EXPECT_EQ(r->layout.Fingerprint(), layout.Fingerprint());
    EXPECT_EQ(r->scores, scores);
    EXPECT_EQ(r->info.at("selector"), "ep");
    EXPECT_EQ(r->info.size(), 1u);
    // Without expectations too.
    EXPECT_TRUE(ReadLayoutFile(path, nullptr, nullptr).ok());
  }
}

TEST(LayoutFileTest, FlippedDataByteIsDataLoss) {
  const StateLayout layout = RandomLayout(StateFormat::kDampSr, 4, 12);
  auto image = SerializeLayout(layout, {}, {});
  ASSERT_TRUE(image.ok());
  // The last byte is tensor data (value_scale, largest dtype last? no: any
  // data byte): flip one bit of the final byte and of a byte in the middle
  // of the data buffer.
  for (size_t pos : {image->size() - 1, image->size() - 200}) {
    std::string bad = *image;
    bad[pos] ^= 0x01;
    auto r = ParseLayout(bad, nullptr, nullptr);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << pos << " " << r.status();
  }
}

TEST(LayoutFileTest, FlippedMetadataValueIsDataLoss) {
  const StateLayout layout = RandomLayout(StateFormat::kDamp, 4, 13);
  auto image = SerializeLayout(layout, {{"calibration", "abcdef"}}, {});
  ASSERT_TRUE(image.ok());
  std::string bad = *image;
  const size_t pos = bad.find("abcdef");
  ASSERT_NE(pos, std::string::npos);
  bad[pos] = 'X';
  EXPECT_EQ(ParseLayout(bad, nullptr, nullptr).status().code(), StatusCode::kDataLoss);
  // Metadata values that the reader interprets are covered too: "layers"
  // 2 -> 3 fails the checksum before anything reads it.
  bad = *image;
  const size_t lp = bad.find("\"layers\":\"2\"");
  ASSERT_NE(lp, std::string::npos);
  bad[lp + 10] = '3';
  EXPECT_EQ(ParseLayout(bad, nullptr, nullptr).status().code(), StatusCode::kDataLoss);
}

TEST(LayoutFileTest, EveryFlippedByteIsRejected) {
  const StateLayout layout = RandomLayout(StateFormat::kDampSr, 2, 14);
  auto image = SerializeLayout(layout, {}, {});
  ASSERT_TRUE(image.ok());
  for (size_t pos = 0; pos < image->size(); ++pos) {
    std::string bad = *image;
    bad[pos] ^= 0x01;
    const StatusCode code = ParseLayout(bad, nullptr, nullptr).status().code();
    ASSERT_TRUE(code == StatusCode::kDataLoss || code == StatusCode::kInvalidArgument)
        << "byte " << pos << " gave " << code;
  }
}

TEST(LayoutFileTest, WrongGeometryOrFormatIsInvalidArgument) {
  const StateLayout layout = RandomLayout(StateFormat::kDamp, 4, 15);
  auto image = SerializeLayout(layout, {}, {});
  ASSERT_TRUE(image.ok());
  ModelGeometry other = kGeo;
  other.layers = 3;
  auto r = ParseLayout(*image, &other, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("geometry"), absl::string_view::npos);
  other = kGeo;
  other.scale = 0.5f;
  EXPECT_EQ(ParseLayout(*image, &other, nullptr).status().code(), StatusCode::kInvalidArgument);
  other = kGeo;
  other.arch = Arch::kGdn;
  EXPECT_EQ(ParseLayout(*image, &other, nullptr).status().code(), StatusCode::kInvalidArgument);
  const FormatSpec wrong_k{StateFormat::kDamp, 8};
  r = ParseLayout(*image, &kGeo, &wrong_k);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("state_format damp:4"), absl::string_view::npos)
      << r.status();
  const FormatSpec wrong_f{StateFormat::kDampSr, 4};
  EXPECT_EQ(ParseLayout(*image, &kGeo, &wrong_f).status().code(), StatusCode::kInvalidArgument);
}

TEST(LayoutFileTest, ReservedInfoKeyAndMissingFile) {
  const StateLayout layout = RandomLayout(StateFormat::kDamp, 4, 16);
  EXPECT_EQ(SerializeLayout(layout, {{"layers", "9"}}, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SerializeLayout(layout, {}, {1.0f, 2.0f}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadLayoutFile(::testing::TempDir() + "/missing.safetensors", nullptr, nullptr)
                .status()
                .code(),
            StatusCode::kNotFound);
}

TEST(LayoutFileTest, RewrittenTensorWithStaleChecksumIsDataLoss) {
  // A tool that rewrites a tensor but keeps the old metadata (checksum) is
  // caught as corruption before the (now invalid) permutation is looked at.
  const StateLayout layout = RandomLayout(StateFormat::kDamp, 4, 17);
  auto image = SerializeLayout(layout, {}, {});
  auto f = SafetensorsFile::FromBytes(*image);
  ASSERT_TRUE(f.ok());
  auto perm = f->ToInt64("key_perm");
  std::vector<int32_t> bad(perm->begin(), perm->end());
  bad[0] = bad[1];
  SafetensorsWriter w;
  for (const auto& [k, v] : f->metadata()) w.SetMetadata(k, v);
  ASSERT_TRUE(w.AddInt32("key_perm", {2, 3, 16}, bad).ok());
  EXPECT_EQ(ParseLayout(w.Serialize(), nullptr, nullptr).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace statecache
