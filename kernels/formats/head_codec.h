// Encode / decode a whole packed head <-> an FP32 working state.
//
// The working state w is d_k x d_v, row-major, rows in stored order (the
// layout's key permutation already applied) and values in the format's
// transformed domain (DESIGN.md section 7: for Hadamard formats w = S H,
// for damp-sr w = S D^-1 P^T). These are the serial reference
// implementations, used by the CPU backend and as the specification the CUDA
// kernels must match byte for byte; they are __host__ __device__ so a GPU
// test can run them too.
//
// STEPQuant: EncodeHead / DecodeHead of a MakeHeadLayout(stepquant-N) layout
// code the NOMINAL head (all rows at N bits, unit row impact, no pivots) via
// stepquant_codec.h. A calibrated STEPQuant layout has per-head layouts
// (StateLayout::step_head) and must use StepEncodeHead / StepDecodeHead.
#ifndef STATECACHE_KERNELS_FORMATS_HEAD_CODEC_H_
#define STATECACHE_KERNELS_FORMATS_HEAD_CODEC_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/common/host_device.h"
#include "kernels/formats/group_quant.h"
#include "kernels/formats/head_layout.h"
#include "kernels/formats/numeric.h"
#include "kernels/formats/packed_bytes.h"
#include "kernels/formats/stepquant_codec.h"

namespace statecache {

SC_HD float AbsMax(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = fmaxf(m, fabsf(x[i]));
  return m;
}

// Encodes one row x[0..d_v) with an FP codec (fp32, fp16, bf16: no
// metadata; the hi rows' codecs, HiRowCodec). Other codecs write nothing.
SC_HD void EncodeFpRow(RowCodec c, const float* x, int d_v, uint8_t* codes) {
  switch (c) {
    case RowCodec::kFp32:
      for (int j = 0; j < d_v; ++j) StoreF32(codes + 4 * j, x[j]);
      return;
    case RowCodec::kFp16:
      for (int j = 0; j < d_v; ++j) StoreU16(codes + 2 * j, FloatToHalfBits(x[j]));
      return;
    case RowCodec::kBf16:
      for (int j = 0; j < d_v; ++j) StoreU16(codes + 2 * j, FloatToBf16Bits(x[j]));
      return;
    default:
      return;
  }
}

// Where one row's units (groups of 32 values, or nvfp4 blocks of 16) are:
// unit u's codes at codes + u * code_stride, its metadata at meta + u *
// meta_stride. FP codecs use `codes` as the row's start only.
template <typename Byte>
struct RowUnitsOf {
  Byte* codes = nullptr;
  int64_t code_stride = 0;
  Byte* meta = nullptr;
  int64_t meta_stride = 0;
};
using RowUnits = RowUnitsOf<uint8_t>;
using ConstRowUnits = RowUnitsOf<const uint8_t>;

// A row in buffers of its own: units back to back (codes: RowCodeBytes(c,
// d_v), meta: RowMetaBytes(c, d_v)).
template <typename Byte>
SC_HD RowUnitsOf<Byte> ContiguousRowUnits(RowCodec c, Byte* codes, Byte* meta) {
  return RowUnitsOf<Byte>{codes, RowCodeBytes(c, RowMetaUnitValues(c)), meta,
                          RowMetaUnitBytes(c)};
}

// Lo row r of a packed head: its units in the row blocks of head_layout.h
// (plain rows for FP lo codecs).
template <typename Byte>
SC_HD RowUnitsOf<Byte> LoRowUnits(const PackedHeadLayout& l, Byte* head, int r) {
  if (!HasLoUnits(l)) {
    return RowUnitsOf<Byte>{head + l.lo_codes_offset + r * l.lo_code_row_bytes, 0, nullptr, 0};
  }
  return RowUnitsOf<Byte>{head + UnitOffset(LoCodes(l), r, 0), UnitStride(LoCodes(l), r),
                          head + UnitOffset(LoMeta(l), r, 0), UnitStride(LoMeta(l), r)};
}

// Encodes one row x[0..d_v) with codec c into its units (u). `global_scale`
// is used by nvfp4 only.
SC_HD void EncodeRow(RowCodec c, const float* x, int d_v, const RowUnits& u, float global_scale) {
  switch (c) {
    case RowCodec::kFp32:
    case RowCodec::kFp16:
    case RowCodec::kBf16:
      EncodeFpRow(c, x, d_v, u.codes);
      return;
    case RowCodec::kAffineU8:
    case RowCodec::kAffineU4: {
      // Branch-free inner loops (the CPU compiler vectorizes them); the codes
      // are the element function's, so every implementation agrees.
      const bool u4 = c == RowCodec::kAffineU4;
      const int qmax = u4 ? 15 : 255;
      for (int g = 0; g < d_v / kGroupSize; ++g) {
        const float* xg = x + g * kGroupSize;
        float mn = xg[0], mx = xg[0];
        for (int j = 1; j < kGroupSize; ++j) {
          mn = xg[j] < mn ? xg[j] : mn;
          mx = xg[j] > mx ? xg[j] : mx;
        }
        const AffineParams p = MakeAffineParams(mn, mx, qmax);
        StoreU16(u.meta + g * u.meta_stride, p.s_bits);
        StoreU16(u.meta + g * u.meta_stride + 2, p.z_bits);
        uint8_t q[kGroupSize];
        for (int j = 0; j < kGroupSize; ++j) q[j] = AffineEncode(xg[j], p, qmax);
        uint8_t* cg = u.codes + g * u.code_stride;
        if (u4) {
          for (int j = 0; j < kGroupSize; j += 2) {
            cg[j / 2] = static_cast<uint8_t>(q[j] | (q[j + 1] << 4));
          }
        } else {
          for (int j = 0; j < kGroupSize; ++j) cg[j] = q[j];
        }
      }
      return;
    }
    case RowCodec::kSymI8:
    case RowCodec::kFp8E4m3: {
      const bool sym = c == RowCodec::kSymI8;
      for (int g = 0; g < d_v / kGroupSize; ++g) {
        const float* xg = x + g * kGroupSize;
        const float amax = AbsMax(xg, kGroupSize);
        const float s = sym ? MakeSymScale(amax) : MakeFp8Scale(amax);
        const float inv_s = sym ? SymInverseScale(s) : 1.0f / s;
        StoreF32(u.meta + g * u.meta_stride, s);
        uint8_t* cg = u.codes + g * u.code_stride;
        for (int j = 0; j < kGroupSize; ++j) {
          cg[j] = sym ? static_cast<uint8_t>(SymEncode(xg[j], inv_s)) : Fp8Encode(xg[j], inv_s);
        }
      }
      return;
    }
    case RowCodec::kNvfp4: {
      for (int b = 0; b < d_v / kNvfp4BlockSize; ++b) {
        const float* xb = x + b * kNvfp4BlockSize;
        const uint8_t sb = MakeNvfp4BlockScale(AbsMax(xb, kNvfp4BlockSize), global_scale);
        u.meta[b * u.meta_stride] = sb;
        const float mult = Nvfp4BlockMultiplier(sb, global_scale);
        uint8_t* cb = u.codes + b * u.code_stride;
        for (int j = 0; j < kNvfp4BlockSize; j += 2) {
          cb[j / 2] = static_cast<uint8_t>(
              Nvfp4Encode(xb[j], mult) | (Nvfp4Encode(xb[j + 1], mult) << 4));
        }
      }
      return;
    }
    case RowCodec::kStepQuant:
      return;  // not row-separable (column scales): EncodeHead handles it
  }
}

// Decodes one row of an FP codec (as EncodeFpRow's) into x[0..d_v), each
// value times row_scale (see DecodeRow).
SC_HD void DecodeFpRow(RowCodec c, const uint8_t* codes, int d_v, float* x,
                       float row_scale = 1.0f) {
  switch (c) {
    case RowCodec::kFp32:
      for (int j = 0; j < d_v; ++j) x[j] = row_scale * LoadF32(codes + 4 * j);
      return;
    case RowCodec::kFp16:
      for (int j = 0; j < d_v; ++j) x[j] = row_scale * HalfBitsToFloat(LoadU16(codes + 2 * j));
      return;
    case RowCodec::kBf16:
      for (int j = 0; j < d_v; ++j) x[j] = row_scale * Bf16BitsToFloat(LoadU16(codes + 2 * j));
      return;
    default:
      return;
  }
}

// Decodes one row into x[0..d_v).
// row_scale multiplies the row's dequantization: the group / block scale of a
// quantized codec (s' = row_scale * s, one rounding), each value of an FP
// codec. 1 decodes the stored values exactly; the decode kernels pass the
// row's decay of the first token (decode_math.h). u: as for EncodeRow.
SC_HD void DecodeRow(RowCodec c, const ConstRowUnits& u, int d_v, float global_scale, float* x,
                     float row_scale = 1.0f) {
  switch (c) {
    case RowCodec::kFp32:
    case RowCodec::kFp16:
    case RowCodec::kBf16:
      DecodeFpRow(c, u.codes, d_v, x, row_scale);
      return;
    case RowCodec::kAffineU8:
    case RowCodec::kAffineU4: {
      const bool u4 = c == RowCodec::kAffineU4;
      for (int g = 0; g < d_v / kGroupSize; ++g) {
        const float s = row_scale * HalfBitsToFloat(LoadU16(u.meta + g * u.meta_stride));
        const float z = HalfBitsToFloat(LoadU16(u.meta + g * u.meta_stride + 2));
        float* xg = x + g * kGroupSize;
        const uint8_t* cg = u.codes + g * u.code_stride;
        if (u4) {
          for (int j = 0; j < kGroupSize; ++j) {
            xg[j] = AffineDecode(static_cast<uint8_t>((cg[j / 2] >> (4 * (j & 1))) & 0xf), s, z);
          }
        } else {
          for (int j = 0; j < kGroupSize; ++j) xg[j] = AffineDecode(cg[j], s, z);
        }
      }
      return;
    }
    case RowCodec::kSymI8:
    case RowCodec::kFp8E4m3: {
      const bool sym = c == RowCodec::kSymI8;
      for (int g = 0; g < d_v / kGroupSize; ++g) {
        const float s = row_scale * LoadF32(u.meta + g * u.meta_stride);
        const uint8_t* cg = u.codes + g * u.code_stride;
        for (int j = 0; j < kGroupSize; ++j) {
          const uint8_t q = cg[j];
          x[g * kGroupSize + j] = sym ? SymDecode(static_cast<int8_t>(q), s) : Fp8Decode(q, s);
        }
      }
      return;
    }
    case RowCodec::kNvfp4: {
      for (int b = 0; b < d_v / kNvfp4BlockSize; ++b) {
        const float mult =
            row_scale * Nvfp4BlockMultiplier(u.meta[b * u.meta_stride], global_scale);
        const uint8_t* cb = u.codes + b * u.code_stride;
        for (int j = 0; j < kNvfp4BlockSize; ++j) {
          x[b * kNvfp4BlockSize + j] =
              Nvfp4Decode(static_cast<uint8_t>((cb[j / 2] >> (4 * (j & 1))) & 0xf), mult);
        }
      }
      return;
    }
    case RowCodec::kStepQuant:
      return;  // not row-separable: DecodeHead handles it
  }
}

// Encodes the working state w[d_k][d_v] into `head` (head_bytes, 16-aligned).
// Padding bytes are written as zero so equal states give equal bytes.
SC_HD void EncodeHead(const PackedHeadLayout& l, const float* w, uint8_t* head) {
  if (l.lo == RowCodec::kStepQuant) {
    StepEncodeHead(MakeUniformStepHeadLayout(l.d_k, l.d_v, l.step_bits), nullptr, w, head);
    return;
  }
  for (int64_t i = 0; i < l.head_bytes; ++i) head[i] = 0;
  float global_scale = 0.0f;
  if (l.has_global_scale) {
    global_scale = MakeNvfp4GlobalScale(AbsMax(w + l.k_hi * l.d_v, l.lo_rows() * l.d_v));
    StoreF32(head + l.global_offset, global_scale);
  }
  for (int r = 0; r < l.k_hi; ++r) {
    for (int c = 0; c < l.d_v; c += 8) {
      EncodeFpRow(l.hi, w + r * l.d_v + c, 8, head + HiRunOffset(l, r, c));
    }
  }
  for (int r = 0; r < l.lo_rows(); ++r) {
    EncodeRow(l.lo, w + (l.k_hi + r) * l.d_v, l.d_v, LoRowUnits(l, head, r), global_scale);
  }
}

// Decodes `head` into the working state w[d_k][d_v].
// row_scale (optional, [d_k] in stored row order): DecodeRow's per-row
// factor; nullptr decodes the stored values. Not for STEPQuant layouts.
SC_HD void DecodeHead(const PackedHeadLayout& l, const uint8_t* head, float* w,
                      const float* row_scale = nullptr) {
  if (l.lo == RowCodec::kStepQuant) {
    StepDecodeHead(MakeUniformStepHeadLayout(l.d_k, l.d_v, l.step_bits), head, w);
    return;
  }
  const float global_scale = l.has_global_scale ? LoadF32(head + l.global_offset) : 0.0f;
  for (int r = 0; r < l.k_hi; ++r) {
    for (int c = 0; c < l.d_v; c += 8) {
      DecodeFpRow(l.hi, head + HiRunOffset(l, r, c), 8, w + r * l.d_v + c,
                  row_scale != nullptr ? row_scale[r] : 1.0f);
    }
  }
  for (int r = 0; r < l.lo_rows(); ++r) {
    DecodeRow(l.lo, LoRowUnits(l, head, r), l.d_v, global_scale, w + (l.k_hi + r) * l.d_v,
              row_scale != nullptr ? row_scale[l.k_hi + r] : 1.0f);
  }
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_HEAD_CODEC_H_
