#include "kernels/formats/head_layout.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/formats/format.h"

namespace statecache {
namespace {

PackedHeadLayout Layout(const char* name) {
  absl::StatusOr<FormatSpec> spec = ParseFormatSpec(name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return MakeHeadLayout(*spec, 128, 128);
}

TEST(HeadLayoutTest, BitsPerValueMatchSeeds) {
  // Seed 000 table 3 and eq. 12; DESIGN.md section 3.
  const std::map<std::string, double> want = {
      {"fp32", 32.0},  {"fp16", 16.0},          {"bf16", 16.0},
      {"int8", 9.0},   {"int8-hadamard", 9.0},  {"int4", 5.0},
      {"int4-hadamard", 5.0}, {"fp8-e4m3", 9.0}, {"nvfp4", 4.5},
      {"damp", 9.875}, {"damp-sr", 9.875}};
  for (const auto& [name, bits] : want) {
    EXPECT_DOUBLE_EQ(Layout(name.c_str()).PayloadBitsPerValue(), bits) << name;
  }
  // nvfp4's per-head fp32 global scale (padded to 16 bytes) is the only overhead.
  EXPECT_NEAR(Layout("nvfp4").StorageBitsPerValue(), 4.5 + 16 * 8.0 / 16384, 1e-12);
  EXPECT_DOUBLE_EQ(Layout("damp").StorageBitsPerValue(), 9.875);
  // 69.1% smaller than fp32.
  EXPECT_NEAR(1.0 - 9.875 / 32.0, 0.691, 0.0005);
}

TEST(HeadLayoutTest, DampSectionsMatchAppendixA5) {
  const PackedHeadLayout l = Layout("damp");
  EXPECT_EQ(l.k_hi, 16);
  EXPECT_EQ(l.hi, RowCodec::kFp16);
  EXPECT_EQ(l.lo, RowCodec::kAffineU8);
  EXPECT_EQ(l.transform, ValueTransform::kHadamard32);
  EXPECT_EQ(l.hi_offset, 0);
  EXPECT_EQ(l.lo_codes_offset, 4096);   // S_hi fp16[16][128]
  EXPECT_EQ(l.lo_meta_offset, 4096 + 14336);  // Q_lo uint8[112][128]
  EXPECT_EQ(l.head_bytes, 20224);       // + M_lo fp16[112][4][2] = 1792
}

TEST(HeadLayoutTest, EverySectionIsSixteenByteAligned) {
  for (StateFormat f : AllStateFormats()) {
    for (int k_hi : {0, 1, 7, 16, 33, 128}) {
      if (!IsMixedFormat(f) && k_hi != 0) continue;
      for (int d_k : {128, 129, 64, 200}) {
        if (k_hi > d_k) continue;
        for (int d_v : {32, 96, 128, 256}) {
          const PackedHeadLayout l = MakeHeadLayout(FormatSpec{f, k_hi}, d_k, d_v);
          EXPECT_EQ(l.head_bytes % kHeadAlignment, 0);
          EXPECT_EQ(l.lo_codes_offset % kHeadAlignment, 0);
          EXPECT_EQ(l.lo_meta_offset % kHeadAlignment, 0);
          EXPECT_EQ(l.global_offset % kHeadAlignment, 0);
          EXPECT_GE(l.lo_codes_offset, k_hi * l.hi_row_bytes);
          EXPECT_GE(l.head_bytes * 8.0, l.PayloadBitsPerValue() * d_k * d_v);
        }
      }
    }
  }
}

// The code and metadata units of quantized lo rows (and the hi rows' units
// of mixed formats) tile their sections exactly once, in row blocks of 8
// (the last block shorter), each block unit-major; FP and STEPQuant lo rows
// have no units.
TEST(HeadLayoutTest, LoUnitsTileTheirSectionsInRowBlocksOfEight) {
  int64_t checked = 0;
  for (StateFormat f : AllStateFormats()) {
    for (int k_hi : {0, 7, 16, 33}) {
      if (!IsMixedFormat(f) && k_hi != 0) continue;
      for (int d_k : {128, 129, 64}) {
        for (int d_v : {32, 128, 256}) {
          const PackedHeadLayout l = MakeHeadLayout(FormatSpec{f, k_hi}, d_k, d_v);
          const bool quantized = l.lo != RowCodec::kFp32 && l.lo != RowCodec::kFp16 &&
                                 l.lo != RowCodec::kBf16 && l.lo != RowCodec::kStepQuant;
          ASSERT_EQ(HasLoUnits(l), quantized) << FormatName(f);
          if (!quantized) {
            EXPECT_EQ(l.lo_code_unit_bytes, 0);
            continue;
          }
          std::vector<std::pair<RowBlockSection, int>> sections = {  // with units per row
              {LoCodes(l), d_v / RowMetaUnitValues(l.lo)},
              {LoMeta(l), d_v / RowMetaUnitValues(l.lo)}};
          if (l.k_hi > 0) sections.push_back({HiRows(l), d_v / kHiUnitValues});
          for (const auto& [sec, units] : sections) {
            ASSERT_GT(sec.unit_bytes, 0) << FormatName(f);
            EXPECT_EQ(units * sec.unit_bytes, sec.row_bytes);
            std::vector<int> owner(sec.rows * sec.row_bytes, 0);
            for (int r = 0; r < sec.rows; ++r) {
              const int64_t n = std::min(8, sec.rows - r / 8 * 8);
              EXPECT_EQ(UnitStride(sec, r), n * sec.unit_bytes);
              for (int u = 0; u < units; ++u) {
                const int64_t off = UnitOffset(sec, r, u);
                EXPECT_EQ(off, sec.offset + r / 8 * 8 * sec.row_bytes + (u * n + r % 8) * sec.unit_bytes);
                if (u + 1 < units) {
                  EXPECT_EQ(UnitOffset(sec, r, u + 1) - off, UnitStride(sec, r));
                }
                for (int64_t b = 0; b < sec.unit_bytes; ++b) {
                  const int64_t i = off + b - sec.offset;
                  ASSERT_GE(i, 0);
                  ASSERT_LT(i, static_cast<int64_t>(owner.size()));
                  ++owner[i];
                }
              }
            }
            for (int c : owner) ASSERT_EQ(c, 1) << FormatName(f) << " " << k_hi << " " << d_k;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 40);
}

// DAMP at 128 x 128: a group's codes of 8 consecutive lo rows are two whole
// 128-byte lines, its metadata one 32-byte sector, and 32 columns of 8 hi
// rows four lines (what a GPU warp stores).
TEST(HeadLayoutTest, DampGroupUnitsOfEightRowsAreWholeLinesAndSectors) {
  const PackedHeadLayout l = Layout("damp");
  EXPECT_EQ(l.lo_code_unit_bytes, 32);
  EXPECT_EQ(l.lo_meta_unit_bytes, 4);
  EXPECT_EQ(UnitOffset(LoCodes(l), 0, 0), 4096);
  EXPECT_EQ(UnitOffset(LoCodes(l), 1, 0), 4096 + 32);
  EXPECT_EQ(UnitOffset(LoCodes(l), 0, 1), 4096 + 256);
  EXPECT_EQ(UnitOffset(LoCodes(l), 9, 2), 4096 + 1024 + 512 + 32);
  EXPECT_EQ(UnitOffset(LoCodes(l), 111, 3), 4096 + 14336 - 32);
  EXPECT_EQ(UnitOffset(LoMeta(l), 0, 0), 18432);
  EXPECT_EQ(UnitOffset(LoMeta(l), 1, 0), 18432 + 4);
  EXPECT_EQ(UnitOffset(LoMeta(l), 0, 1), 18432 + 32);
  EXPECT_EQ(UnitOffset(LoMeta(l), 9, 2), 18432 + 128 + 64 + 4);
  EXPECT_EQ(UnitOffset(LoMeta(l), 111, 3), 18432 + 1792 - 4);
  EXPECT_EQ(UnitOffset(HiRows(l), 0, 1), 512);
  EXPECT_EQ(UnitOffset(HiRows(l), 9, 2), 2048 + 1024 + 64);
  EXPECT_EQ(HiRunByte(l, 1), 32);  // runs 0, 2, 1, 3: run 1 is the third 16 bytes
  EXPECT_EQ(HiRunByte(l, 2), 16);
  EXPECT_EQ(HiRunByte(l, 3), 48);
  for (const RowBlockSection& sec : {LoCodes(l), LoMeta(l), HiRows(l)}) {
    for (int r0 = 0; r0 < sec.rows; r0 += 16) {
      for (int rl = 0; rl < 16; ++rl) {
        for (int u = 0; u < 4; ++u) {
          EXPECT_EQ(PairOffset(sec, r0) + InPairOffset(sec, rl, u),
                    UnitOffset(sec, r0 + rl, u));
        }
      }
    }
    for (int b = 0; b < sec.rows / 8; ++b) {
      for (int u = 0; u < 4; ++u) {
        const int64_t first = UnitOffset(sec, 8 * b, u);
        EXPECT_EQ(first % (8 * sec.unit_bytes), 0);  // codes 256, meta 32, hi 512 bytes
        for (int r = 1; r < 8; ++r) {
          EXPECT_EQ(UnitOffset(sec, 8 * b + r, u), first + r * sec.unit_bytes);
        }
      }
    }
  }
}

TEST(HeadLayoutTest, KHiSweepInterpolatesBetweenInt8AndFp16) {
  for (int k_hi : {0, 4, 8, 16, 32, 64, 128}) {
    const PackedHeadLayout l = MakeHeadLayout(FormatSpec{StateFormat::kDamp, k_hi}, 128, 128);
    EXPECT_DOUBLE_EQ(l.PayloadBitsPerValue(), k_hi / 128.0 * 16 + (1 - k_hi / 128.0) * 9) << k_hi;
  }
}

}  // namespace
}  // namespace statecache
