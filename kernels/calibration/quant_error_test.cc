#include "kernels/calibration/quant_error.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/formats/hadamard.h"
#include "kernels/formats/head_codec.h"

namespace statecache {
namespace {

// Reference: the byte codec (EncodeRow + DecodeRow), error in the value domain.
double CodecError(RowCodec c, const std::vector<float>& x, const float* col_scale) {
  const int d_v = static_cast<int>(x.size());
  std::vector<uint8_t> codes(RowCodeBytes(c, d_v)), meta(RowMetaBytes(c, d_v) + 4);
  std::vector<float> y(d_v);
  EncodeRow(c, x.data(), d_v, ContiguousRowUnits(c, codes.data(), meta.data()), 0.0f);
  DecodeRow(c, ContiguousRowUnits<const uint8_t>(c, codes.data(), meta.data()), d_v, 0.0f,
            y.data());
  double e = 0.0;
  for (int j = 0; j < d_v; ++j) {
    double d = double{y[j]} - x[j];
    if (col_scale != nullptr) d *= col_scale[j];
    e += d * d;
  }
  return e;
}

std::vector<std::vector<float>> Rows() {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<std::vector<float>> rows;
  for (float mag : {1e-12f, 1e-6f, 1e-2f, 1.0f, 300.0f, 1e5f}) {
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<float> x(128);
      for (float& v : x) v = mag * n(rng) * (rep == 3 ? 1.0f : 1.0f + 20.0f * (rng() % 7 == 0));
      if (rep == 2) x.assign(128, mag);  // constant groups
      rows.push_back(x);
    }
  }
  rows.push_back(std::vector<float>(128, 0.0f));
  return rows;
}

TEST(QuantErrorTest, MatchesTheByteCodec) {
  std::vector<float> scale(128);
  for (int j = 0; j < 128; ++j) scale[j] = 0.25f + 0.1f * j;
  for (const auto& x : Rows()) {
    const double a = CodecError(RowCodec::kAffineU8, x, nullptr);
    EXPECT_NEAR(AffineU8RowError(x.data(), 128), a, 2e-6 * a);
    for (const float* cs : {static_cast<const float*>(nullptr), static_cast<const float*>(scale.data())}) {
      const double s = CodecError(RowCodec::kSymI8, x, cs);
      EXPECT_NEAR(SymI8RowError(x.data(), cs, 128), s, 2e-6 * s);
      const double h = CodecError(RowCodec::kFp16, x, cs);
      EXPECT_NEAR(Fp16RowError(x.data(), cs, 128), h, 2e-6 * h);
    }
  }
}

TEST(QuantErrorTest, FastHadamardIsBitIdentical) {
  for (const auto& x : Rows()) {
    std::vector<float> a = x, b = x;
    BlockHadamard32(a.data(), 128);
    FastBlockHadamard32(b.data(), 128);
    for (int j = 0; j < 128; ++j) ASSERT_EQ(a[j], b[j]) << j;
  }
}

TEST(QuantErrorTest, GatherScaledAndSquaredNorm) {
  std::vector<float> x(64), scale(64), out(64);
  std::vector<int32_t> order(64);
  for (int j = 0; j < 64; ++j) {
    x[j] = 0.5f * j - 3.0f;
    order[j] = (j * 37) % 64;
    scale[j] = 1.0f + 0.25f * (j % 5);
  }
  GatherScaled(x.data(), order.data(), scale.data(), out.data(), 64);
  double norm = 0;
  for (int j = 0; j < 64; ++j) {
    EXPECT_EQ(out[j], x[order[j]] / scale[j]);
    norm += double{x[j]} * x[j];
  }
  EXPECT_NEAR(SquaredNorm(x.data(), 64), norm, 1e-6 * norm);
}

TEST(QuantErrorTest, TransposedSrErrorsMatchTheRowFunctions) {
  for (int d_k : {16, 20, 128}) {  // 20: a scalar tail after the vectors
    const int d_v = 64;
    std::mt19937 rng(d_k);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> s(d_k * d_v), st(d_k * d_v), scale(d_v), buf(32 * d_k + d_v), e8(d_k), e16(d_k);
    for (int u = 0; u < d_k; ++u) {
      for (int j = 0; j < d_v; ++j) s[u * d_v + j] = n(rng) * (1.0f + (j % 9 == 0) * 10.0f) * (u + 1);
    }
    Transpose(s.data(), d_k, d_v, st.data());
    EXPECT_EQ(st[5 * d_k + 3], s[3 * d_v + 5]);
    std::vector<int32_t> order(d_v);
    for (int j = 0; j < d_v; ++j) {
      order[j] = (j * 29 + 3) % d_v;
      scale[j] = 0.5f + 0.05f * j;
    }
    SrErrorsTransposed(st.data(), d_k, d_v, order.data(), scale.data(), buf.data(), e8.data(), e16.data());
    for (int u = 0; u < d_k; ++u) {
      std::vector<float> row(d_v);
      for (int j = 0; j < d_v; ++j) row[j] = s[u * d_v + order[j]] / scale[j];
      const double want8 = SymI8RowError(row.data(), scale.data(), d_v);
      const double want16 = Fp16RowError(row.data(), scale.data(), d_v);
      EXPECT_NEAR(e8[u], want8, 2e-6 * want8) << d_k << " " << u;
      EXPECT_NEAR(e16[u], want16, 2e-6 * want16) << d_k << " " << u;
    }
  }
}

TEST(QuantErrorTest, ErrorsArePositiveForGenericRows) {
  std::vector<float> x(64);
  for (int j = 0; j < 64; ++j) x[j] = std::sin(0.37f * j) * 3.0f;
  EXPECT_GT(AffineU8RowError(x.data(), 64), 0.0);
  EXPECT_GT(SymI8RowError(x.data(), nullptr, 64), 0.0);
  EXPECT_GT(Fp16RowError(x.data(), nullptr, 64), 0.0);
  // fp16 is far more precise than 8-bit groups.
  EXPECT_LT(Fp16RowError(x.data(), nullptr, 64), 0.1 * SymI8RowError(x.data(), nullptr, 64));
}

}  // namespace
}  // namespace statecache
