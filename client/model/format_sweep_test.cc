#include "client/model/format_sweep.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "client/model/layout_providers.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/io/test_data.h"

namespace statecache {
namespace {

TEST(FormatSweepTest, ReferenceRowFp32SlotAndQuantizedFormat) {
  auto dir = SharedDataPath("models/gdn-tiny");
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto model = LanguageModel::Load(*dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  auto docs = ReadCorpus(*SharedDataPath("corpus/heldout.jsonl"));
  ASSERT_TRUE(docs.ok());
  for (auto& d : *docs) d.bytes.resize(200);
  docs->resize(2);
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  SweepOptions opts;
  opts.prefill_tokens = 64;
  auto rows = RunFormatSweep(**model, backend->get(), *docs,
                             {*ParseFormatSpec("fp32"), *ParseFormatSpec("int4"),
                              *ParseFormatSpec("damp-sr:16")},
                             opts);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 4u);
  EXPECT_EQ((*rows)[0].format, "fp32 (reference)");
  EXPECT_EQ((*rows)[0].decode.excess, 0.0);
  // FP32 states in a backend slot: the same numbers as the in-process store.
  EXPECT_EQ((*rows)[1].format, "fp32");
  EXPECT_EQ((*rows)[1].bits_per_value, 32.0);
  EXPECT_NEAR((*rows)[1].decode.excess, 0.0, 1e-5);
  EXPECT_NEAR((*rows)[1].prefill_decode.excess, 0.0, 1e-5);
  EXPECT_EQ((*rows)[1].decode.agreement, 1.0);
  // int4 (5 bits/value with metadata) costs something in decode.
  EXPECT_EQ((*rows)[2].format, "int4");
  EXPECT_NEAR((*rows)[2].bits_per_value, 5.0, 1e-9);
  EXPECT_NE((*rows)[2].decode.excess, 0.0);
  EXPECT_LT((*rows)[2].decode.agreement, 1.0 + 1e-12);
  // Identity maps (no calibration given) are reported as such.
  EXPECT_EQ((*rows)[3].format, "damp-sr:16");
  EXPECT_FALSE((*rows)[3].calibrated);
  const std::string table = FormatSweepTable(*rows);
  EXPECT_NE(table.find("| int4 | identity | 5.000 |"), std::string::npos) << table;
}

// --layouts=calibrate: a STEPQuant row runs kernels/stepquant's calibrated
// layout (per-head widths on GDN, whose key order stays the identity), is
// reported as calibrated, and counts its exact payload bits.
TEST(FormatSweepTest, CalibratedProviderCalibratesStepQuant) {
  auto dir = SharedDataPath("models/gdn-tiny");
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto model = LanguageModel::Load(*dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  auto calibration = ReadCorpus(*SharedDataPath("corpus/calibration.jsonl"));
  ASSERT_TRUE(calibration.ok());
  std::vector<Document> few;
  for (size_t i = 0; i < calibration->size(); i += 4) {
    few.push_back((*calibration)[i]);
    few.back().bytes.resize(128);
  }
  auto provider = CalibratedLayouts(**model, few, {});
  ASSERT_TRUE(provider.ok()) << provider.status();
  const ModelGeometry geo = (*model)->config().Geometry();
  const FormatSpec sq6 = *ParseFormatSpec("stepquant-6");
  auto layout = (*provider)(geo, sq6);
  ASSERT_TRUE(layout.ok()) << layout.status();
  // Non-uniform allocation: more than one code width over the heads, none
  // wider than the budget allows on average.
  std::set<int> widths(layout->all_row_bits().begin(), layout->all_row_bits().end());
  EXPECT_GT(widths.size(), 1u) << "uniform widths: the identity layout";
  EXPECT_TRUE(layout->identity_key_perm()) << "GDN keeps the identity key order";
  EXPECT_LE(layout->PayloadBitsPerValue(), 6.3);
  auto identity = StateLayout::Identity(geo, sq6);
  ASSERT_TRUE(identity.ok());
  EXPECT_NE(layout->Fingerprint(), identity->Fingerprint());
  auto again = (*provider)(geo, sq6);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->Fingerprint(), layout->Fingerprint()) << "calibrated once, reused";

  auto docs = ReadCorpus(*SharedDataPath("corpus/heldout.jsonl"));
  ASSERT_TRUE(docs.ok());
  for (auto& d : *docs) d.bytes.resize(96);
  docs->resize(1);
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  SweepOptions opts;
  opts.prefill_tokens = 32;
  opts.layouts = *provider;
  auto rows = RunFormatSweep(**model, backend->get(), *docs, {sq6}, opts);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[1].format, "stepquant-6");
  EXPECT_TRUE((*rows)[1].calibrated);
  EXPECT_DOUBLE_EQ((*rows)[1].bits_per_value, layout->PayloadBitsPerValue());
  EXPECT_NE(FormatSweepTable(*rows).find("| stepquant-6 | calibrated |"), std::string::npos);

  // The identity provider: uniform widths, reported as identity.
  opts.layouts = IdentityLayouts();
  auto uniform = RunFormatSweep(**model, backend->get(), *docs, {sq6}, opts);
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  EXPECT_FALSE((*uniform)[1].calibrated);
  EXPECT_DOUBLE_EQ((*uniform)[1].bits_per_value, 6.25);
}

}  // namespace
}  // namespace statecache
