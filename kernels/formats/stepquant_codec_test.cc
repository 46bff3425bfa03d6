#include "kernels/formats/stepquant_codec.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/formats/format.h"
#include "kernels/formats/head_codec.h"
#include "kernels/formats/head_layout.h"

namespace statecache {
namespace {

std::vector<int8_t> Bits(std::initializer_list<std::pair<int, int>> runs) {
  std::vector<int8_t> b;
  for (auto [bits, n] : runs) b.insert(b.end(), n, static_cast<int8_t>(bits));
  return b;
}

// A state with rank-1 row x column outlier structure (seed 002 section 4.2).
std::vector<float> OutlierState(int d_k, int d_v, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> row(d_k, 1.0f), col(d_v, 1.0f);
  for (int i = 0; i < d_k; i += 17) row[i] = 10.0f;
  for (int j = 0; j < d_v; j += 23) col[j] = 19.0f;
  std::vector<float> w(static_cast<size_t>(d_k) * d_v);
  for (int i = 0; i < d_k; ++i) {
    for (int j = 0; j < d_v; ++j) w[i * d_v + j] = 0.01f * row[i] * col[j] * n(rng);
  }
  return w;
}

double Rrmse(const std::vector<float>& a, const std::vector<float>& ref, int row_begin = 0,
             int row_end = -1, int d_v = 128) {
  double e = 0, r = 0;
  const size_t begin = static_cast<size_t>(row_begin) * d_v;
  const size_t end = row_end < 0 ? ref.size() : static_cast<size_t>(row_end) * d_v;
  for (size_t i = begin; i < end; ++i) {
    e += (double{a[i]} - ref[i]) * (double{a[i]} - ref[i]);
    r += double{ref[i]} * ref[i];
  }
  return std::sqrt(e / r);
}

TEST(StepQuantLayoutTest, UniformSixBitHeadAndNominalLayoutAgree) {
  const StepHeadLayout l = MakeUniformStepHeadLayout(128, 128, 6);
  EXPECT_EQ(l.pivot_rows, 0);
  EXPECT_EQ(l.rows_at[6], 128);
  EXPECT_EQ(l.codes_offset, 0);
  EXPECT_EQ(l.code_bytes, 128 * 96);
  EXPECT_EQ(l.row_scale_offset, 12288);
  EXPECT_EQ(l.col_scale_offset, 12288 + 256);
  EXPECT_EQ(l.head_bytes, 12800);
  EXPECT_DOUBLE_EQ(l.PayloadBitsPerValue(), 6.25);  // 6 + 16/128 + 16/128
  const PackedHeadLayout nominal = MakeHeadLayout(FormatSpec{StateFormat::kStepQuant6, 0}, 128, 128);
  EXPECT_EQ(nominal.head_bytes, l.head_bytes);
  EXPECT_EQ(nominal.lo_meta_offset, l.row_scale_offset);
  EXPECT_EQ(nominal.global_offset, l.col_scale_offset);
  EXPECT_DOUBLE_EQ(nominal.PayloadBitsPerValue(), 6.25);
  EXPECT_DOUBLE_EQ(MakeHeadLayout(FormatSpec{StateFormat::kStepQuant4, 0}, 128, 128).PayloadBitsPerValue(), 4.25);
}

TEST(StepQuantLayoutTest, MixedWidthsSectionsAndRowOffsets) {
  const std::vector<int8_t> bits = Bits({{16, 3}, {8, 5}, {6, 50}, {4, 60}, {3, 10}});
  ASSERT_EQ(bits.size(), 128u);
  const StepHeadLayout l = MakeStepHeadLayout(bits.data(), 128, 128);
  EXPECT_EQ(l.pivot_rows, 3);
  EXPECT_EQ(l.int_rows(), 125);
  EXPECT_EQ(l.code_bytes, 5 * 128 + 50 * 96 + 60 * 64 + 10 * 48);
  EXPECT_EQ(l.pivot_offset, 0);
  EXPECT_EQ(l.codes_offset, 3 * 256);
  for (int64_t off : {l.codes_offset, l.row_scale_offset, l.col_scale_offset, l.head_bytes}) {
    EXPECT_EQ(off % kHeadAlignment, 0) << off;
  }
  EXPECT_EQ(l.row_scale_offset, AlignUp(l.codes_offset + l.code_bytes, 16));
  EXPECT_EQ(l.col_scale_offset, AlignUp(l.row_scale_offset + 2 * 125, 16));
  int64_t off = 0;
  for (int r = 0; r < 128; ++r) {
    EXPECT_EQ(l.RowBits(r), bits[r]) << r;
    if (r < 3) continue;
    EXPECT_EQ(l.RowCodeOffset(r), off) << r;
    off += 128 * bits[r] / 8;
  }
  EXPECT_EQ(off, l.code_bytes);
  EXPECT_NEAR(l.PayloadBitsPerValue(),
              (3 * 256 + l.code_bytes + 2 * 125 + 256) * 8.0 / 16384, 1e-12);
}

TEST(StepQuantLayoutTest, AllPivotHeadHasNoScales) {
  const std::vector<int8_t> bits(128, 16);
  const StepHeadLayout l = MakeStepHeadLayout(bits.data(), 128, 64);
  EXPECT_EQ(l.head_bytes, 128 * 64 * 2);
  EXPECT_DOUBLE_EQ(l.PayloadBitsPerValue(), 16.0);
}

TEST(StepQuantElementTest, CodesRoundTripEveryWidthAndValue) {
  for (int bits = kStepMinCodeBits; bits <= kStepMaxCodeBits; ++bits) {
    const int q = StepQMax(bits);
    const int d_v = 64;
    std::vector<uint8_t> row(d_v * bits / 8 + 1, 0);
    std::vector<int> want(d_v);
    for (int j = 0; j < d_v; ++j) {
      want[j] = (j * 7 + bits) % (2 * q + 1) - q;
      StepStoreCode(row.data(), j, bits, want[j]);
    }
    EXPECT_EQ(row.back(), 0) << "wrote past the row, bits=" << bits;
    for (int j = 0; j < d_v; ++j) EXPECT_EQ(StepLoadCode(row.data(), j, bits), want[j]) << bits;
  }
  // Layout of the stream: 4-bit low nibble first, 8-bit = int8.
  uint8_t r4[2] = {0, 0};
  StepStoreCode(r4, 0, 4, 3);
  StepStoreCode(r4, 1, 4, -2);
  EXPECT_EQ(r4[0], 0xe3);
  uint8_t r8[1] = {0};
  StepStoreCode(r8, 0, 8, -127);
  EXPECT_EQ(r8[0], 0x81);
}

TEST(StepQuantElementTest, EncodeDecodeValues) {
  EXPECT_EQ(StepQMax(8), 127);
  EXPECT_EQ(StepQMax(4), 7);
  EXPECT_EQ(StepQMax(3), 3);
  // c = 2, r = 0.5: x = 1 is the top of the range.
  const float inv_c = StepInvColumn(2.0f), mult = StepRowMultiplier(0.5f, 4);
  EXPECT_EQ(StepEncodeValue(1.0f, inv_c, mult, 4), 7);
  EXPECT_EQ(StepEncodeValue(-5.0f, inv_c, mult, 4), -7);   // clamped
  EXPECT_EQ(StepEncodeValue(0.25f, inv_c, mult, 4), 2);    // 0.125 * 14 = 1.75
  // Ties go to even: 2 bits (Q = 1), multiplier 2.
  EXPECT_EQ(StepEncodeValue(0.5f, inv_c, StepRowMultiplier(0.5f, 2), 2), 0);   // 0.5
  EXPECT_EQ(StepEncodeValue(-1.5f, inv_c, StepRowMultiplier(0.5f, 2), 2), -1);  // -1.5 -> -2, clamped
  EXPECT_EQ(StepScaleBits(1e-9f), 1);
  EXPECT_EQ(StepScaleBits(0.0f), 0);
  EXPECT_EQ(StepScaleBits(1e6f), 0x7bff);
  EXPECT_FLOAT_EQ(StepDecodeValue(7, 0.5f, 2.0f, StepInvQ(4)), 1.0f);
  EXPECT_EQ(StepInvColumn(0.0f), 0.0f);
  EXPECT_EQ(StepRowMultiplier(0.0f, 6), 0.0f);
  EXPECT_EQ(StepEncodeValue(3.0f, 0.0f, 0.0f, 6), 0);
}

TEST(StepQuantCodecTest, RoundTripErrorShrinksWithWidth) {
  const std::vector<float> w = OutlierState(128, 128, 1);
  double prev = 1.0;
  for (int bits : {3, 4, 6, 8}) {
    const StepHeadLayout l = MakeUniformStepHeadLayout(128, 128, bits);
    std::vector<uint8_t> head(l.head_bytes);
    std::vector<float> back(w.size());
    StepEncodeHead(l, nullptr, w.data(), head.data());
    StepDecodeHead(l, head.data(), back.data());
    const double e = Rrmse(back, w);
    // Symmetric b-bit, tight dual-axis envelope: about 0.6 / Q_b here.
    EXPECT_LT(e, 0.9 / StepQMax(bits)) << bits;
    EXPECT_GT(e, 0.0) << bits;
    EXPECT_LT(e, prev) << bits;
    prev = e;
  }
}

TEST(StepQuantCodecTest, DualAxisBeatsRowOnlyScalesOnRowColumnOutliers) {
  // Same widths, column scales forced to one value (what a row-absmax
  // quantizer does) vs the fitted dual-axis scales.
  const std::vector<float> w = OutlierState(128, 128, 2);
  const StepHeadLayout l = MakeUniformStepHeadLayout(128, 128, 4);
  std::vector<uint8_t> head(l.head_bytes);
  std::vector<float> back(w.size());
  StepEncodeHead(l, nullptr, w.data(), head.data());
  StepDecodeHead(l, head.data(), back.data());
  const double dual = Rrmse(back, w);
  // Row-only: per-row absmax, symmetric int4.
  double e = 0, r = 0;
  for (int i = 0; i < 128; ++i) {
    float m = 0;
    for (int j = 0; j < 128; ++j) m = std::max(m, std::fabs(w[i * 128 + j]));
    for (int j = 0; j < 128; ++j) {
      const float x = w[i * 128 + j];
      const float xh = m > 0 ? std::nearbyint(x / m * 7) * m / 7 : 0;
      e += (double{xh} - x) * (xh - x);
      r += double{x} * x;
    }
  }
  EXPECT_LT(dual, 0.6 * std::sqrt(e / r));
}

TEST(StepQuantCodecTest, PivotRowsAreFp16AndMixedWidthsDecode) {
  const std::vector<int8_t> bits = Bits({{16, 2}, {8, 30}, {6, 40}, {4, 40}, {3, 16}});
  const StepHeadLayout l = MakeStepHeadLayout(bits.data(), 128, 128);
  const std::vector<float> w = OutlierState(128, 128, 3);
  std::vector<uint8_t> head(l.head_bytes);
  std::vector<float> back(w.size());
  StepEncodeHead(l, nullptr, w.data(), head.data());
  StepDecodeHead(l, head.data(), back.data());
  for (int j = 0; j < 2 * 128; ++j) {
    EXPECT_EQ(back[j], HalfBitsToFloat(FloatToHalfBits(w[j]))) << j;
  }
  // Wider rows are more accurate.
  EXPECT_LT(Rrmse(back, w, 2, 32), Rrmse(back, w, 32, 72));
  EXPECT_LT(Rrmse(back, w, 32, 72), Rrmse(back, w, 72, 112));
  EXPECT_LT(Rrmse(back, w, 72, 112), Rrmse(back, w, 112, 128));
}

TEST(StepQuantCodecTest, RowImpactWeightsFavourHeavyRows) {
  const std::vector<float> w = OutlierState(128, 128, 4);
  const StepHeadLayout l = MakeUniformStepHeadLayout(128, 128, 4);
  std::vector<float> impact(128, 0.2f);
  for (int i = 0; i < 16; ++i) impact[i] = 1.0f;
  std::vector<uint8_t> head(l.head_bytes);
  std::vector<float> unit(w.size()), weighted(w.size());
  StepEncodeHead(l, nullptr, w.data(), head.data());
  StepDecodeHead(l, head.data(), unit.data());
  StepEncodeHead(l, impact.data(), w.data(), head.data());
  StepDecodeHead(l, head.data(), weighted.data());
  EXPECT_LT(Rrmse(weighted, w, 0, 16), Rrmse(unit, w, 0, 16));
}

TEST(StepQuantCodecTest, ColumnFitImprovesOnTheInitialScales) {
  // Decoding with the initial c0 (column absmax) instead of the fitted c is
  // worse: the fixed-code least-squares step pays for itself.
  const std::vector<float> w = OutlierState(128, 128, 5);
  const StepHeadLayout l = MakeUniformStepHeadLayout(128, 128, 4);
  std::vector<uint8_t> head(l.head_bytes);
  std::vector<float> fitted(w.size()), initial(w.size());
  StepEncodeHead(l, nullptr, w.data(), head.data());
  StepDecodeHead(l, head.data(), fitted.data());
  for (int j = 0; j < 128; ++j) {
    float n = 0;
    for (int i = 0; i < 128; ++i) n = std::max(n, std::fabs(w[i * 128 + j]));
    StoreU16(head.data() + l.col_scale_offset + 2 * j, FloatToHalfBits(n));
  }
  StepDecodeHead(l, head.data(), initial.data());
  EXPECT_LT(Rrmse(fitted, w), Rrmse(initial, w));
}

TEST(StepQuantCodecTest, DeterministicAndZeroHeads) {
  const std::vector<int8_t> bits = Bits({{16, 1}, {6, 100}, {4, 27}});
  const StepHeadLayout l = MakeStepHeadLayout(bits.data(), 128, 128);
  const std::vector<float> w = OutlierState(128, 128, 6);
  std::vector<uint8_t> a(l.head_bytes, 0xaa), b(l.head_bytes, 0x55);
  StepEncodeHead(l, nullptr, w.data(), a.data());
  StepEncodeHead(l, nullptr, w.data(), b.data());
  EXPECT_EQ(a, b);
  // All-zero bytes decode to S = 0; the zero state encodes to all-zero bytes.
  std::vector<uint8_t> zero(l.head_bytes, 0);
  std::vector<float> back(w.size(), 1.0f);
  StepDecodeHead(l, zero.data(), back.data());
  for (float x : back) ASSERT_EQ(x, 0.0f);
  std::vector<float> zs(w.size(), 0.0f);
  StepEncodeHead(l, nullptr, zs.data(), a.data());
  EXPECT_EQ(a, zero);
}

TEST(StepQuantCodecTest, AdversarialStatesStayFinite) {
  const StepHeadLayout l = MakeUniformStepHeadLayout(128, 128, 4);
  for (float scale : {1e-30f, 1e-8f, 1.0f, 6e4f, 1e9f}) {
    std::vector<float> w(128 * 128, 0.0f);
    w[5] = scale;
    w[130] = -scale;
    w[128 * 127 + 127] = 0.5f * scale;
    std::vector<uint8_t> head(l.head_bytes);
    std::vector<float> back(w.size());
    StepEncodeHead(l, nullptr, w.data(), head.data());
    StepDecodeHead(l, head.data(), back.data());
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_TRUE(std::isfinite(back[i])) << scale;
      ASSERT_LE(std::fabs(back[i]), std::max(65504.0f * 65504.0f, scale) * 1.01f);
    }
    if (scale >= 1e-8f && scale <= 1e9f) {
      EXPECT_NEAR(back[5], scale, 0.02 * scale) << scale;
    }
  }
}

TEST(StepQuantCodecTest, HeadCodecDelegatesForTheNominalLayout) {
  const PackedHeadLayout nominal = MakeHeadLayout(FormatSpec{StateFormat::kStepQuant4, 0}, 128, 128);
  const StepHeadLayout l = MakeUniformStepHeadLayout(128, 128, 4);
  const std::vector<float> w = OutlierState(128, 128, 7);
  std::vector<uint8_t> a(nominal.head_bytes), b(l.head_bytes);
  EncodeHead(nominal, w.data(), a.data());
  StepEncodeHead(l, nullptr, w.data(), b.data());
  EXPECT_EQ(a, b);
  std::vector<float> x(w.size()), y(w.size());
  DecodeHead(nominal, a.data(), x.data());
  StepDecodeHead(l, b.data(), y.data());
  EXPECT_EQ(x, y);
}

}  // namespace
}  // namespace statecache
