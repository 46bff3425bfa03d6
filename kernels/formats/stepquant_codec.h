// STEPQuant packed heads (seed 002; issue 9): layout, element functions and
// the serial reference encoder / decoder, __host__ __device__.
//
// A head is d_k stored rows (the layout's key_perm order) of d_v values. Each
// stored row has a width from the calibrated bit map (StateLayout::row_bits):
// 16 = FP16 "pivot" row, else a signed code width b in [2, 8]. Rows are
// stored in NON-INCREASING width: pivots first, then the 8-bit rows, 7, ..., 2
// (calibration orders key_perm that way), so a head is described by the count
// of rows per width. GDN units are whole heads (every row of a head has one
// width, or the head is a pivot); KDA units are key rows.
//
// Byte layout of one head (every section 16-byte aligned, head_bytes a
// multiple of 16):
//
//   pivots      fp16 [P][d_v]                       rows 0..P-1
//   codes       per integer row, d_v * b / 8 bytes: little-endian bit
//               stream, value j in bits [j b, j b + b), two's complement
//               (b = 4: low nibble first, b = 8: int8)
//   row scales  fp16 [d_k - P]       r_i, integer rows in stored order
//   col scales  fp16 [d_v]           c_j, shared by every integer row
//   (the last three sections are absent when every row is a pivot)
//
// Reconstruction (dual-axis, codebook normalized by precision, no metadata):
//   x_hat[i][j] = (r_i * c_j) * (z_ij * (1 / Q_b)),   Q_b = 2^(b-1) - 1
// with r_i * c_j exact in FP32 (two FP16 values) and the two roundings in
// that order (StepDecodeValue).
//
// Encoding of an FP32 working state X (StepEncodeHead; recomputed at every
// write, like every format's parameters) - "key-row-aware dual-axis fitting":
//  1. n_j = max_{integer rows i} |X_ij|; c0_j = fp16(n_j) (StepScaleBits:
//     every fp16 scale here saturates at 65504 and never rounds a positive
//     value to 0).
//  2. m_i = max_j |X_ij| * inv_c0_j (the row's absmax in column-normalized
//     units, i.e. sqrt of seed 002's squared row statistic), r_i = fp16(m_i):
//     the initial scales never clip (up to FP16 rounding) and r_i c0_j is the
//     tight rank-1 envelope when the magnitudes are rank-1 (row x column
//     outliers, seed 002 section 4.2).
//  3. z_ij = clamp(rint((X_ij * inv_c0_j) * (Q_b / r_i)), -Q_b, Q_b).
//  4. Fixed-code column-scale update with the row-impact weights w_i (from
//     calibration, omega_i^(1/8) normalized to max 1 per head): with
//     a_ij = r_i * (z_ij / Q_b),
//        c_j = sum_i w_i^2 a_ij X_ij / sum_i w_i^2 a_ij^2
//     (the w_i^2-weighted least-squares column scale for the fixed codes;
//     c0_j is kept when the sums are not positive). Stored as fp16.
//  Pivot rows are stored as fp16 and take no part in the fit.
//
// Summation orders (StepSumOrder; additive, the default is the CPU's):
//  kSerial  the contract below (CPU backend, one-CTA-per-head / fast GPU kernels).
//  kTile    the tiled GPU decode kernel's order (kernels/cuda/decode_math.h's
//           DecodeTiling): inside each 64-row chunk, row lane rl = (r % 64) % 16
//           sums its rows rl, rl + 16, rl + 32, rl + 48 (integer rows only) with
//           fmaf in that order from 0, the 16 lane partials are added in
//           WarpTreeSum's butterfly (StepTileTreeSum16), then the chunk partials
//           as in kSerial (total = ((0 + p0) + p1) + ...). Everything else
//           (maxima, codes, divisions) is identical, so the bytes differ from
//           kSerial's only where the sums round differently.
//
// Bit-exactness contract (what a CUDA kernel must reproduce): maxima are
// order-free. The two sums of step 4 are accumulated with fmaf (never a
// separate multiply and add) over the integer rows in stored order in
// chunks of kStepReduceRows = 64 stored rows: each chunk's partial starts at
// 0 and adds its rows in order, then the chunk partials are added in chunk
// order (total = ((0 + p0) + p1) + ...), which maps onto one warp per 64
// rows with a lane per column. Divisions are IEEE (no fast-math). Products
// are written as separate multiplies (nothing to contract).
#ifndef STATECACHE_KERNELS_FORMATS_STEPQUANT_CODEC_H_
#define STATECACHE_KERNELS_FORMATS_STEPQUANT_CODEC_H_

#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/formats/group_quant.h"
#include "kernels/formats/head_layout.h"
#include "kernels/formats/numeric.h"
#include "kernels/formats/packed_bytes.h"

namespace statecache {

inline constexpr int kStepPivotBits = 16;
inline constexpr int kStepMinCodeBits = 2;
inline constexpr int kStepMaxCodeBits = 8;
// Largest d_k / d_v the serial reference supports (ModelGeometry's limit).
inline constexpr int kStepMaxDim = 256;
// Row chunk of the column least-squares sums (see the contract above).
inline constexpr int kStepReduceRows = 64;

enum class StepSumOrder { kSerial, kTile };

SC_HD_CONSTEXPR bool IsValidStepBits(int b) {
  return b == kStepPivotBits || (b >= kStepMinCodeBits && b <= kStepMaxCodeBits);
}
SC_HD_CONSTEXPR int StepQMax(int bits) { return (1 << (bits - 1)) - 1; }

struct StepHeadLayout {
  int d_k = 0;
  int d_v = 0;
  int pivot_rows = 0;                         // stored rows [0, pivot_rows)
  int rows_at[kStepMaxCodeBits + 1] = {};     // integer rows per width (index = bits)
  int64_t pivot_offset = 0;                   // fp16 [pivot_rows][d_v]
  int64_t codes_offset = 0;                   // bit streams, widest rows first
  int64_t row_scale_offset = 0;               // fp16 [d_k - pivot_rows]
  int64_t col_scale_offset = 0;               // fp16 [d_v]
  int64_t head_bytes = 0;                     // multiple of kHeadAlignment
  int64_t code_bytes = 0;                     // sum of the integer rows' code bytes

  SC_HD int int_rows() const { return d_k - pivot_rows; }

  // Width of stored row r: 16 for pivots, else the code width.
  SC_HD int RowBits(int r) const {
    if (r < pivot_rows) return kStepPivotBits;
    int start = pivot_rows;
    for (int b = kStepMaxCodeBits; b >= kStepMinCodeBits; --b) {
      start += rows_at[b];
      if (r < start) return b;
    }
    return 0;
  }
  // Byte offset of integer stored row r's codes from codes_offset.
  SC_HD int64_t RowCodeOffset(int r) const {
    int64_t off = 0;
    int start = pivot_rows;
    for (int b = kStepMaxCodeBits; b >= kStepMinCodeBits; --b) {
      const int64_t row_bytes = int64_t{d_v} * b / 8;
      if (r < start + rows_at[b]) return off + (r - start) * row_bytes;
      off += rows_at[b] * row_bytes;
      start += rows_at[b];
    }
    return off;
  }
  // Bits per value counting codes, pivots and scales (no alignment padding).
  double PayloadBitsPerValue() const {
    double bytes = static_cast<double>(pivot_rows) * d_v * 2 + static_cast<double>(code_bytes);
    if (int_rows() > 0) bytes += 2.0 * int_rows() + 2.0 * d_v;
    return bytes * 8.0 / (static_cast<double>(d_k) * d_v);
  }
};

// The layout of a head whose stored rows have widths row_bits[0..d_k), which
// must be valid (IsValidStepBits) and non-increasing (StateLayout checks).
SC_HD StepHeadLayout MakeStepHeadLayout(const int8_t* row_bits, int d_k, int d_v) {
  StepHeadLayout l;
  l.d_k = d_k;
  l.d_v = d_v;
  for (int r = 0; r < d_k; ++r) {
    const int b = row_bits[r];
    if (b == kStepPivotBits) {
      ++l.pivot_rows;
    } else {
      ++l.rows_at[b];
      l.code_bytes += int64_t{d_v} * b / 8;
    }
  }
  int64_t off = 0;
  l.pivot_offset = off;
  off = AlignUp(off + int64_t{l.pivot_rows} * d_v * 2, kHeadAlignment);
  l.codes_offset = off;
  off = AlignUp(off + l.code_bytes, kHeadAlignment);
  l.row_scale_offset = off;
  if (l.int_rows() > 0) off = AlignUp(off + 2LL * l.int_rows(), kHeadAlignment);
  l.col_scale_offset = off;
  if (l.int_rows() > 0) off = AlignUp(off + 2LL * d_v, kHeadAlignment);
  l.head_bytes = off;
  return l;
}

// Every row at `bits`, no pivots: the nominal / uncalibrated head. Same bytes
// as MakeHeadLayout(stepquant-N) (head_layout.h).
SC_HD StepHeadLayout MakeUniformStepHeadLayout(int d_k, int d_v, int bits) {
  int8_t row_bits[kStepMaxDim];
  for (int r = 0; r < d_k; ++r) row_bits[r] = static_cast<int8_t>(bits);
  return MakeStepHeadLayout(row_bits, d_k, d_v);
}

// ---- Element functions (shared with the CUDA kernel) ------------------------

// FP16 bits of a non-negative scale; a positive scale below FP16's smallest
// subnormal (2^-24) becomes that subnormal instead of 0, so tiny but nonzero
// columns keep their codes.
SC_HD uint16_t StepScaleBits(float s) {
  const uint16_t b = FloatToHalfBits(s);
  return (s > 0.0f && b == 0) ? static_cast<uint16_t>(1) : b;
}

// 1 / Q_b, correctly rounded.
SC_HD float StepInvQ(int bits) { return 1.0f / static_cast<float>(StepQMax(bits)); }

// 1 / c for a decoded fp16 column scale, 0 for an empty column.
SC_HD float StepInvColumn(float c) { return c > 0.0f ? 1.0f / c : 0.0f; }

// Q_b / r for a decoded fp16 row scale, 0 for an empty row.
SC_HD float StepRowMultiplier(float r, int bits) {
  return r > 0.0f ? static_cast<float>(StepQMax(bits)) / r : 0.0f;
}

// The code of x: clamp(rint((x * inv_c) * row_mult), -Q_b, Q_b).
SC_HD int StepEncodeValue(float x, float inv_c, float row_mult, int bits) {
  const float t = x * inv_c;
  const float u = t * row_mult;
  const float q = static_cast<float>(StepQMax(bits));
  return static_cast<int>(Clamp(RoundEven(u), -q, q));
}

// x_hat = (r * c) * (z * inv_q).
SC_HD float StepDecodeValue(int z, float r, float c, float inv_q) {
  const float rc = r * c;
  const float zn = static_cast<float>(z) * inv_q;
  return rc * zn;
}

// Writes the b-bit two's complement code z as value j of a zeroed row stream.
SC_HD void StepStoreCode(uint8_t* row, int j, int bits, int z) {
  const int bit = j * bits;
  const int byte = bit >> 3;
  const int shift = bit & 7;
  const uint32_t u = (static_cast<uint32_t>(z) & ((1u << bits) - 1u)) << shift;
  row[byte] = static_cast<uint8_t>(row[byte] | (u & 0xffu));
  if (shift + bits > 8) row[byte + 1] = static_cast<uint8_t>(row[byte + 1] | (u >> 8));
}

// Reads value j of a row stream as a signed code (never touches bytes past
// the row's last code).
SC_HD int StepLoadCode(const uint8_t* row, int j, int bits) {
  const int bit = j * bits;
  const int byte = bit >> 3;
  const int shift = bit & 7;
  uint32_t v = static_cast<uint32_t>(row[byte]) >> shift;
  if (shift + bits > 8) v |= static_cast<uint32_t>(row[byte + 1]) << (8 - shift);
  v &= (1u << bits) - 1u;
  const int s = static_cast<int>(v);
  return (v & (1u << (bits - 1))) ? s - (1 << bits) : s;
}

// Sum of 16 row-lane partials in the tiled kernels' butterfly (pairs
// differing in lane bit 3, then 2, 1, 0; decode_math.h's WarpTreeSum).
SC_HD float StepTileTreeSum16(const float* p) {
  float t1[8], t2[4], t3[2];
  for (int x = 0; x < 8; ++x) t1[x] = p[x] + p[x | 8];
  for (int x = 0; x < 4; ++x) t2[x] = t1[x] + t1[x | 4];
  for (int x = 0; x < 2; ++x) t3[x] = t2[x] + t2[x | 2];
  return t3[0] + t3[1];
}

// ---- Serial reference head codec --------------------------------------------

// Encodes the working state w[d_k][d_v] (stored order) into `head`
// (l.head_bytes, zero-filled first: equal states give equal bytes).
// `row_impact` [d_k] holds w_i per stored row (pivot entries unused), or
// nullptr for unit weights. `order` picks the column sums' summation order
// (header comment); kSerial is the CPU backend's.
SC_HD void StepEncodeHead(const StepHeadLayout& l, const float* row_impact, const float* w,
                          uint8_t* head, StepSumOrder order = StepSumOrder::kSerial) {
  for (int64_t i = 0; i < l.head_bytes; ++i) head[i] = 0;
  const int d_v = l.d_v;
  for (int r = 0; r < l.pivot_rows; ++r) {
    for (int j = 0; j < d_v; ++j) {
      StoreU16(head + l.pivot_offset + (int64_t{r} * d_v + j) * 2, FloatToHalfBits(w[r * d_v + j]));
    }
  }
  if (l.int_rows() == 0) return;
  // 1. Column absmax over integer rows -> c0.
  float inv_c[kStepMaxDim];
  float c0[kStepMaxDim];
  for (int j = 0; j < d_v; ++j) inv_c[j] = 0.0f;
  for (int r = l.pivot_rows; r < l.d_k; ++r) {
    for (int j = 0; j < d_v; ++j) inv_c[j] = fmaxf(inv_c[j], fabsf(w[r * d_v + j]));
  }
  for (int j = 0; j < d_v; ++j) {
    c0[j] = HalfBitsToFloat(StepScaleBits(inv_c[j]));
    inv_c[j] = StepInvColumn(c0[j]);
  }
  // 2-4. Row scales, codes, and the weighted column sums.
  float num[kStepMaxDim], den[kStepMaxDim], pnum[kStepMaxDim], pden[kStepMaxDim];
  for (int j = 0; j < d_v; ++j) num[j] = den[j] = pnum[j] = pden[j] = 0.0f;
  for (int r = 0; r < l.d_k; ++r) {
    if (r % kStepReduceRows == 0) {
      for (int j = 0; j < d_v; ++j) pnum[j] = pden[j] = 0.0f;
    }
    if (r >= l.pivot_rows) {
      const float* x = w + r * d_v;
      const int bits = l.RowBits(r);
      float m = 0.0f;
      for (int j = 0; j < d_v; ++j) {
        const float a = fabsf(x[j]) * inv_c[j];
        m = fmaxf(m, a);
      }
      const uint16_t r_bits = StepScaleBits(m);
      const float rf = HalfBitsToFloat(r_bits);
      StoreU16(head + l.row_scale_offset + 2LL * (r - l.pivot_rows), r_bits);
      const float row_mult = StepRowMultiplier(rf, bits);
      const float inv_q = StepInvQ(bits);
      const float wi = row_impact != nullptr ? row_impact[r] : 1.0f;
      const float ww = wi * wi;
      uint8_t* codes = head + l.codes_offset + l.RowCodeOffset(r);
      for (int j = 0; j < d_v; ++j) {
        const int z = StepEncodeValue(x[j], inv_c[j], row_mult, bits);
        StepStoreCode(codes, j, bits, z);
        const float zn = static_cast<float>(z) * inv_q;
        const float a = rf * zn;
        const float wa = ww * a;
        pnum[j] = fmaf(wa, x[j], pnum[j]);
        pden[j] = fmaf(wa, a, pden[j]);
      }
    }
    if (r % kStepReduceRows == kStepReduceRows - 1 || r == l.d_k - 1) {
      for (int j = 0; j < d_v; ++j) {
        num[j] = num[j] + pnum[j];
        den[j] = den[j] + pden[j];
      }
    }
  }
  if (order == StepSumOrder::kTile) {
    // Same codes and terms, summed in the tile order instead.
    float mult[kStepMaxDim], rfs[kStepMaxDim];
    for (int r = l.pivot_rows; r < l.d_k; ++r) {
      rfs[r] = HalfBitsToFloat(LoadU16(head + l.row_scale_offset + 2LL * (r - l.pivot_rows)));
      mult[r] = StepRowMultiplier(rfs[r], l.RowBits(r));
    }
    for (int j = 0; j < d_v; ++j) {
      num[j] = den[j] = 0.0f;
      for (int c = 0; c * kStepReduceRows < l.d_k; ++c) {
        float lnum[16], lden[16];
        for (int rl = 0; rl < 16; ++rl) {
          lnum[rl] = lden[rl] = 0.0f;
          for (int i = 0; i < 4; ++i) {
            const int r = c * kStepReduceRows + i * 16 + rl;
            if (r >= l.d_k || r < l.pivot_rows) continue;
            const int bits = l.RowBits(r);
            const float x = w[r * d_v + j];
            const int z = StepEncodeValue(x, inv_c[j], mult[r], bits);
            const float zn = static_cast<float>(z) * StepInvQ(bits);
            const float a = rfs[r] * zn;
            const float wi = row_impact != nullptr ? row_impact[r] : 1.0f;
            const float ww = wi * wi;
            const float wa = ww * a;
            lnum[rl] = fmaf(wa, x, lnum[rl]);
            lden[rl] = fmaf(wa, a, lden[rl]);
          }
        }
        num[j] = num[j] + StepTileTreeSum16(lnum);
        den[j] = den[j] + StepTileTreeSum16(lden);
      }
    }
  }
  for (int j = 0; j < d_v; ++j) {
    const float c = (num[j] > 0.0f && den[j] > 0.0f) ? num[j] / den[j] : c0[j];
    StoreU16(head + l.col_scale_offset + 2LL * j, StepScaleBits(c));
  }
}

// Decodes `head` into the working state w[d_k][d_v] (stored order).
// row_scale (optional, [d_k] per stored row): a factor folded into the
// dequantization, as DecodeHead's (head_codec.h; the GPU decode kernels fold
// the first token's decay in): a pivot value becomes row_scale * x, an
// integer row's scale r' = row_scale * r (one rounding each); nullptr (the
// default) decodes the stored values.
SC_HD void StepDecodeHead(const StepHeadLayout& l, const uint8_t* head, float* w,
                          const float* row_scale = nullptr) {
  const int d_v = l.d_v;
  for (int r = 0; r < l.pivot_rows; ++r) {
    for (int j = 0; j < d_v; ++j) {
      const float x = HalfBitsToFloat(LoadU16(head + l.pivot_offset + (int64_t{r} * d_v + j) * 2));
      w[r * d_v + j] = row_scale != nullptr ? row_scale[r] * x : x;
    }
  }
  if (l.int_rows() == 0) return;
  float c[kStepMaxDim];
  for (int j = 0; j < d_v; ++j) c[j] = HalfBitsToFloat(LoadU16(head + l.col_scale_offset + 2LL * j));
  for (int r = l.pivot_rows; r < l.d_k; ++r) {
    const int bits = l.RowBits(r);
    const float r_stored =
        HalfBitsToFloat(LoadU16(head + l.row_scale_offset + 2LL * (r - l.pivot_rows)));
    const float rf = row_scale != nullptr ? row_scale[r] * r_stored : r_stored;
    const float inv_q = StepInvQ(bits);
    const uint8_t* codes = head + l.codes_offset + l.RowCodeOffset(r);
    for (int j = 0; j < d_v; ++j) {
      w[r * d_v + j] = StepDecodeValue(StepLoadCode(codes, j, bits), rf, c[j], inv_q);
    }
  }
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_STEPQUANT_CODEC_H_
