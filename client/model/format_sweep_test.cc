#include "client/model/format_sweep.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
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

}  // namespace
}  // namespace statecache
