#include "client/model/layout_providers.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/io/test_data.h"
#include "kernels/layout/layout_file.h"

namespace statecache {
namespace {

using absl::StatusCode;

TEST(LayoutProvidersTest, CalibratesMixedFormatsAndReadsLayoutFiles) {
  auto dir = SharedDataPath("models/kda-tiny");
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto model = LanguageModel::Load(*dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  auto docs = ReadCorpus(*SharedDataPath("corpus/calibration.jsonl"));
  ASSERT_TRUE(docs.ok());
  // Two short documents per domain keep the test fast.
  std::vector<Document> few;
  for (size_t i = 0; i < docs->size(); i += 4) {
    few.push_back((*docs)[i]);
    few.back().bytes.resize(128);
  }
  std::string info;
  auto provider = CalibratedLayouts(**model, few, {}, &info);
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_NE(info.find("calibrated on 6 documents (3 domains"), std::string::npos) << info;
  const ModelGeometry geo = (*model)->config().Geometry();
  auto damp = (*provider)(geo, *ParseFormatSpec("damp:16"));
  ASSERT_TRUE(damp.ok()) << damp.status();
  EXPECT_FALSE(damp->identity_key_perm()) << "KDA: per-channel decay reorders the key rows";
  auto int8 = (*provider)(geo, *ParseFormatSpec("int8"));
  ASSERT_TRUE(int8.ok());
  EXPECT_TRUE(int8->identity_key_perm());
  ModelGeometry other = geo;
  other.layers = 2;
  EXPECT_EQ((*provider)(other, *ParseFormatSpec("damp:16")).status().code(),
            StatusCode::kInvalidArgument);

  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/damp.layout.safetensors";
  ASSERT_TRUE(WriteLayoutFile(*damp, {{"tool", "layout_providers_test"}}, {}, path).ok());
  auto files = LayoutsFromFiles({path}, geo);
  ASSERT_TRUE(files.ok()) << files.status();
  auto back = (*files)(geo, *ParseFormatSpec("damp:16"));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->Fingerprint(), damp->Fingerprint());
  EXPECT_TRUE((*files)(geo, *ParseFormatSpec("damp:8"))->identity_key_perm())
      << "no file for damp:8: identity";
  EXPECT_EQ(LayoutsFromFiles({path, path}, geo).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LayoutsFromFiles({path}, other).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LayoutsFromFiles({"/nonexistent.safetensors"}, geo).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(CalibratedLayouts(**model, {}, {}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace statecache
