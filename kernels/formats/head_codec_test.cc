// Round trips of every row codec and every format on random and adversarial
// data: error within the codec's bound, never NaN or Inf.
#include "kernels/formats/head_codec.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/formats/format.h"

namespace statecache {
namespace {

constexpr int kDv = 128;

struct NamedRow {
  std::string name;
  std::vector<float> x;
};

std::vector<NamedRow> AdversarialRows() {
  std::mt19937 rng(1);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<NamedRow> rows;
  auto add = [&](std::string name, auto fn) {
    NamedRow r{std::move(name), std::vector<float>(kDv)};
    for (int j = 0; j < kDv; ++j) r.x[j] = fn(j);
    rows.push_back(std::move(r));
  };
  add("gaussian", [&](int) { return n01(rng); });
  add("all_zero", [](int) { return 0.0f; });
  add("constant_positive", [](int) { return 3.7f; });
  add("constant_negative", [](int) { return -0.02f; });
  add("one_huge_outlier", [&](int j) { return j == 5 ? 1.0e4f : n01(rng); });
  add("subnormals", [](int j) { return (j % 2 ? 1.0f : -1.0f) * 1.0e-40f * (j + 1); });
  add("near_fp16_max", [](int j) { return (j % 3 ? 65000.0f : -64000.0f); });
  add("offset_tiny_range", [](int j) { return 100.0f + 1.0e-3f * j / kDv; });
  add("tiny_values", [&](int) { return 1.0e-6f * n01(rng); });
  return rows;
}

// Per-element error bound of a codec for element j of row x.
double Bound(RowCodec c, const std::vector<float>& x, int j) {
  const int g0 = j / kGroupSize * kGroupSize;
  float mn = 0, mx = 0, amax = 0;
  for (int i = g0; i < g0 + kGroupSize; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  const double range = double{mx} - mn;
  const double a = std::fabs(x[j]);
  switch (c) {
    case RowCodec::kFp32: return 0.0;
    case RowCodec::kFp16: return a > 65504 ? a - 65504 : a * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
    case RowCodec::kBf16: return a * std::ldexp(1.0, -8) + std::ldexp(1.0, -134);
    // Rounding (s/2), plus the FP16 rounding of s stretching the lattice end.
    // A scale below FP16's resolution (2^-24) is off by up to 2^-25, which the
    // codes multiply by up to qmax: tiny ranges lose relative accuracy (but
    // stay finite and bounded).
    case RowCodec::kAffineU8: return 1.2 * range / 255 + 255 * std::ldexp(1.0, -25);
    case RowCodec::kAffineU4: return 1.2 * range / 15 + 15 * std::ldexp(1.0, -25);
    case RowCodec::kSymI8: return 0.5 * std::max<double>(amax, 1e-10) / 127 * 1.0001;
    case RowCodec::kFp8E4m3: return a * 0.0625 + std::max<double>(amax, 1e-10) / 448 * std::ldexp(1.0, -10);
    case RowCodec::kNvfp4: return 0.0;  // depends on the head; checked by RMSE below
  }
  return 0.0;
}

class RowCodecTest : public ::testing::TestWithParam<RowCodec> {};

TEST_P(RowCodecTest, AdversarialRowsStayWithinBound) {
  const RowCodec c = GetParam();
  if (c == RowCodec::kNvfp4) GTEST_SKIP() << "nvfp4 needs a head-wide scale: see FormatTest";
  for (const NamedRow& row : AdversarialRows()) {
    std::vector<uint8_t> codes(RowCodeBytes(c, kDv)), meta(RowMetaBytes(c, kDv) + 4);
    std::vector<float> back(kDv);
    EncodeRow(c, row.x.data(), kDv, ContiguousRowUnits(c, codes.data(), meta.data()), 0.0f);
    DecodeRow(c, ContiguousRowUnits<const uint8_t>(c, codes.data(), meta.data()), kDv, 0.0f,
              back.data());
    for (int j = 0; j < kDv; ++j) {
      ASSERT_TRUE(std::isfinite(back[j])) << row.name << " j=" << j;
      EXPECT_LE(std::fabs(double{back[j]} - row.x[j]), Bound(c, row.x, j))
          << row.name << " j=" << j << " x=" << row.x[j] << " back=" << back[j];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, RowCodecTest,
                         ::testing::Values(RowCodec::kFp32, RowCodec::kFp16, RowCodec::kBf16,
                                           RowCodec::kAffineU8, RowCodec::kAffineU4,
                                           RowCodec::kSymI8, RowCodec::kFp8E4m3,
                                           RowCodec::kNvfp4));

// EncodeHead writes each quantized lo row's code and metadata units where the
// layout puts them (LoUnitOffset: row blocks of 8, the last one shorter):
// the same bytes as EncodeRow of the row alone into contiguous buffers.
TEST(HeadCodecTest, LoRowsLandInTheirUnitsOfTheRowBlocks) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  int64_t checked = 0;
  for (StateFormat f : AllStateFormats()) {
    for (int k_hi : {0, 5, 16}) {
      if (!IsMixedFormat(f) && k_hi != 0) continue;
      for (int d_k : {64, 83}) {
        const PackedHeadLayout l = MakeHeadLayout(FormatSpec{f, k_hi}, d_k, kDv);
        if (!HasLoUnits(l) || l.has_global_scale) continue;  // nvfp4: the head's global scale
        std::vector<float> w(int64_t{d_k} * kDv);
        for (float& x : w) x = n01(rng);
        std::vector<uint8_t> head(l.head_bytes);
        EncodeHead(l, w.data(), head.data());
        const int units = kDv / RowMetaUnitValues(l.lo);
        std::vector<uint8_t> codes(l.lo_code_row_bytes), meta(l.lo_meta_row_bytes);
        for (int r = 0; r < l.lo_rows(); ++r) {
          EncodeRow(l.lo, w.data() + int64_t{l.k_hi + r} * kDv, kDv,
                    ContiguousRowUnits(l.lo, codes.data(), meta.data()), 0.0f);
          for (int u = 0; u < units; ++u) {
            for (int64_t b = 0; b < l.lo_code_unit_bytes; ++b) {
              ASSERT_EQ(head[UnitOffset(LoCodes(l), r, u) + b],
                        codes[u * l.lo_code_unit_bytes + b])
                  << FormatName(f) << " k_hi " << k_hi << " d_k " << d_k << " row " << r
                  << " unit " << u;
            }
            for (int64_t b = 0; b < l.lo_meta_unit_bytes; ++b) {
              ASSERT_EQ(head[UnitOffset(LoMeta(l), r, u) + b],
                        meta[u * l.lo_meta_unit_bytes + b])
                  << FormatName(f) << " k_hi " << k_hi << " d_k " << d_k << " row " << r
                  << " unit " << u;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 500);
}

// DAMP's hi rows at 128 x 128, written out by hand: value (r, c) is the
// fp16 at block r / 8, unit c / 32, row r % 8, run (c % 32) / 8 stored at
// position 0, 2, 1, 3, column c % 8.
TEST(HeadCodecTest, DampHiRowsAreFp16InRowBlocksWithSwappedRuns) {
  const PackedHeadLayout l = MakeHeadLayout(FormatSpec{StateFormat::kDamp, 16}, 128, kDv);
  std::vector<float> w(128 * kDv);
  for (int i = 0; i < 128 * kDv; ++i) w[i] = static_cast<float>(i % 2000) * 0.25f - 100.0f;
  std::vector<uint8_t> head(l.head_bytes);
  EncodeHead(l, w.data(), head.data());
  const int stored_run[4] = {0, 2, 1, 3};
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < kDv; ++c) {
      const int pos = r / 8 * 8 * 256 + (c / 32 * 8 + r % 8) * 64 + stored_run[c % 32 / 8] * 16 +
                      c % 8 * 2;
      const uint16_t want = FloatToHalfBits(w[r * kDv + c]);
      ASSERT_EQ(head[pos] | (head[pos + 1] << 8), want) << "row " << r << " col " << c;
    }
  }
  std::vector<float> back(128 * kDv);
  DecodeHead(l, head.data(), back.data());
  for (int i = 0; i < 16 * kDv; ++i) ASSERT_EQ(back[i], w[i]) << i;  // exact in fp16
}

TEST(AffineTest, ZeroPointIsExactIntegerAndDegenerateGroupsDecodeToZero) {
  const AffineParams p = MakeAffineParams(-1.0f, 3.0f, 255);
  EXPECT_EQ(HalfBitsToFloat(p.z_bits), p.z);
  EXPECT_EQ(p.z, std::rint(p.z));
  const AffineParams zero = MakeAffineParams(0.0f, 0.0f, 255);
  EXPECT_EQ(zero.s_bits, 0);
  EXPECT_EQ(AffineEncode(0.0f, zero, 255), 0);
  EXPECT_EQ(AffineDecode(0, HalfBitsToFloat(zero.s_bits), zero.z), 0.0f);
}

// Whole heads in every format: relative RMSE on Gaussian data within the
// format's expected accuracy, and adversarial heads never produce NaN / Inf.
class FormatRoundTripTest : public ::testing::TestWithParam<StateFormat> {};

TEST_P(FormatRoundTripTest, GaussianHeadRelativeRmse) {
  const StateFormat f = GetParam();
  const PackedHeadLayout l = MakeHeadLayout(FormatSpec{f, IsMixedFormat(f) ? 16 : 0}, 128, kDv);
  std::mt19937 rng(3);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> w(128 * kDv), back(128 * kDv);
  for (float& x : w) x = n01(rng);
  std::vector<uint8_t> head(l.head_bytes, 0xAB);
  EncodeHead(l, w.data(), head.data());
  DecodeHead(l, head.data(), back.data());
  double err = 0, ref = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_TRUE(std::isfinite(back[i]));
    err += (double{back[i]} - w[i]) * (back[i] - w[i]);
    ref += double{w[i]} * w[i];
  }
  const double rrmse = std::sqrt(err / ref);
  double want = 0;
  switch (f) {
    case StateFormat::kFp32: want = 0; break;
    case StateFormat::kFp16: want = 3e-4; break;
    case StateFormat::kBf16: want = 3e-3; break;
    case StateFormat::kInt8:
    case StateFormat::kInt8Hadamard:
    case StateFormat::kDamp:
    case StateFormat::kDampSr: want = 8e-3; break;
    case StateFormat::kInt4:
    case StateFormat::kInt4Hadamard: want = 0.13; break;
    case StateFormat::kFp8E4m3: want = 0.03; break;
    case StateFormat::kNvfp4: want = 0.12; break;
    case StateFormat::kStepQuant6:
    case StateFormat::kStepQuant4:
      FAIL() << "STEPQuant heads are not uniform (stepquant_codec_test.cc)";
  }
  EXPECT_LE(rrmse, want) << FormatName(f);
  if (f != StateFormat::kFp32) {
    EXPECT_GT(rrmse, 0.0) << FormatName(f);
  }

  // Re-encoding the decoded state is a fixed point for the integer formats'
  // codes of well-conditioned data (same bytes) - a determinism check.
  std::vector<uint8_t> again(l.head_bytes);
  EncodeHead(l, w.data(), again.data());
  EXPECT_EQ(again, head);
}

TEST_P(FormatRoundTripTest, AdversarialHeadsAreFinite) {
  const StateFormat f = GetParam();
  const PackedHeadLayout l = MakeHeadLayout(FormatSpec{f, IsMixedFormat(f) ? 16 : 0}, 128, kDv);
  for (const NamedRow& row : AdversarialRows()) {
    std::vector<float> w(128 * kDv), back(128 * kDv);
    for (int r = 0; r < 128; ++r) std::copy(row.x.begin(), row.x.end(), w.begin() + r * kDv);
    std::vector<uint8_t> head(l.head_bytes);
    EncodeHead(l, w.data(), head.data());
    DecodeHead(l, head.data(), back.data());
    double amax = 0;
    for (float x : w) amax = std::max(amax, double{std::fabs(x)});
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_TRUE(std::isfinite(back[i])) << FormatName(f) << " " << row.name;
      // Worst case is int4's lattice end: amax + 1.2 * (2 amax / 15).
      EXPECT_LE(std::fabs(back[i]), amax * 1.2 + 1e-30) << FormatName(f) << " " << row.name;
    }
    if (row.name == "all_zero") {
      for (float x : back) ASSERT_EQ(x, 0.0f) << FormatName(f);
    }
  }
}

TEST_P(FormatRoundTripTest, AllZeroBytesDecodeToTheZeroState) {
  const StateFormat f = GetParam();
  const PackedHeadLayout l = MakeHeadLayout(FormatSpec{f, IsMixedFormat(f) ? 16 : 0}, 128, kDv);
  std::vector<uint8_t> head(l.head_bytes, 0);
  std::vector<float> back(128 * kDv, 1.0f);
  DecodeHead(l, head.data(), back.data());
  for (float x : back) ASSERT_EQ(x, 0.0f) << FormatName(f);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, FormatRoundTripTest, ::testing::ValuesIn(AllStateFormats()),
                         [](const auto& info) {
                           std::string n = FormatName(info.param);
                           for (char& c : n) if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace statecache
