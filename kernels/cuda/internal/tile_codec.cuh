// Device-side row codecs for the kernels' thread map (decode_math.h): one
// lane holds 16 consecutive values of a row (a half of a 32-value group /
// stripe; its partner is lane ^ 1). Loads and stores are 16-byte vectors.
//
// The math is the shared quantizer's (group_quant.h, numeric.h): group
// min / max / absmax come from a lane-pair reduction (order-free), then the
// same parameter functions (MakeAffineParams, MakeSymScale, ...) run, and the
// per-element encoders are bit-exact re-expressions of AffineEncode /
// SymEncode (one FFMA with the 1.5 * 2^23 rounding constant, clamps on s16x2
// pairs) or the shared functions themselves. The GPU tests check byte
// equality with EncodeHead.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_TILE_CODEC_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_TILE_CODEC_CUH_

#include <cuda_fp16.h>
#include <cstdint>

#include "kernels/formats/group_quant.h"
#include "kernels/formats/head_layout.h"
#include "kernels/cuda/internal/range_bits.h"
#include "kernels/cuda/internal/swizzle.h"
#include "kernels/formats/numeric.h"

namespace statecache {
namespace cuda_internal {

// kRoundMagic (group_quant.h) = 1.5 * 2^23: x + M rounds x to an integer n,
// which then sits in the low bits of M + x's bits (0x4B400000 + n).
inline constexpr float kMagicByte = 8388608.0f;    // 2^23: bits 0x4B0000xx = 2^23 + xx

__device__ __forceinline__ uint4 LdStream(const uint8_t* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ uint2 LdStream8(const uint8_t* p) {
  return __ldcs(reinterpret_cast<const uint2*>(p));
}
// Write-back stores use the default (write-back) policy: a lane pair's
// 16-byte halves of a 32-byte sector arrive in separate instructions and
// must merge in L2 before the line goes to DRAM.
__device__ __forceinline__ void StStream(uint8_t* p, uint4 v) {
  *reinterpret_cast<uint4*>(p) = v;
}
__device__ __forceinline__ void StStream8(uint8_t* p, uint2 v) {
  *reinterpret_cast<uint2*>(p) = v;
}

// Where a tile is read from: kGlobal (streaming loads from the pool),
// kShared (a copy of the head staged in shared memory by the bulk-copy
// engine), or kSwizzled (staged by tensor-map copies with the 128-byte
// swizzle, CU_TENSOR_MAP_SWIZZLE_128B, into a 1024-byte aligned region: the
// 16-byte chunk index, address bits 4-6, is XORed with the 128-byte row index
// mod 8, bits 7-9, so the lanes of a warp reading one 16-byte column of 8
// consecutive rows hit 8 different bank groups; addressed through
// SwizzledRef).
enum class Src { kGlobal, kShared, kSwizzled };

// Keeps a parameter out of template argument deduction (std::type_identity_t).
template <typename T>
struct NonDeducedT {
  using type = T;
};
template <typename T>
using NonDeduced = typename NonDeducedT<T>::type;

// RowRef / UnitRef (swizzle.h) for an unswizzled region: plain pointers.
__device__ __forceinline__ const uint8_t* RowRef(const uint8_t* base, int64_t offset,
                                                 int64_t row_bytes, int r0, int rl) {
  return base + offset + (r0 + rl) * row_bytes;
}
template <typename Byte>  // uint8_t or const uint8_t
__device__ __forceinline__ Byte* UnitRef(Byte* base, const RowBlockSection& s, int r0, int rl,
                                         int u, int byte) {
  return base + PairOffset(s, r0) + InPairOffset(s, rl, u) + byte;
}

// A lane's 16 values of a quantized row (columns col0 .. col0 + 15) lie in
// one unit (a group, or an nvfp4 block): its index, and the byte of the
// lane's first code inside the unit's codes.
template <RowCodec C>
__device__ __forceinline__ int LaneUnit(int col0) {
  return col0 / RowMetaUnitValues(C);
}
template <RowCodec C>
__device__ __forceinline__ int LaneUnitByte(int col0) {
  return static_cast<int>(RowCodeBytes(C, col0 % RowMetaUnitValues(C)));
}

// A lane of a mixed format holds columns col0 .. col0 + 15 of its hi row
// (W = 16), half of a hi unit: its runs of 8 are the unit's runs 2 cl and
// 2 cl + 1, stored as runs cl and cl + 2 (HiStoredRun, head_layout.h), i.e.
// where the FP chunks of a W = 8 lane at column HiLaneCol(col0) of the unit
// go (LoadRow16 / StoreRow16 with W = 8 on the unit's start).
__device__ __forceinline__ int HiLaneCol(int col0) { return (col0 % kHiUnitValues) / 2; }

// Where LoadRow16 / StoreRow16 take lo row lr of a packed head from (any
// shape; the fixed-shape tiles address their row steps with UnitRef):
// the lane's codes and metadata unit (quantized codecs), or the row's start
// (FP codecs).
template <RowCodec C, typename Byte>
__device__ __forceinline__ Byte* LoLaneCodes(const PackedHeadLayout& l, Byte* head, int lr,
                                             int col0) {
  if (RowMetaUnitBytes(C) == 0) return head + l.lo_codes_offset + lr * l.lo_code_row_bytes;
  return head + UnitOffset(LoCodes(l), lr, LaneUnit<C>(col0)) + LaneUnitByte<C>(col0);
}
template <RowCodec C, typename Byte>
__device__ __forceinline__ Byte* LoLaneMeta(const PackedHeadLayout& l, Byte* head, int lr,
                                            int col0) {
  if (RowMetaUnitBytes(C) == 0) return nullptr;
  return head + UnitOffset(LoMeta(l), lr, LaneUnit<C>(col0));
}

// The swizzled shared-memory address of a kSwizzled location.
template <Src S>
__device__ __forceinline__ uint32_t SmemAt(const SwizzledRef& r) {
  static_assert(S == Src::kSwizzled, "a SwizzledRef addresses a swizzled region");
  return r.addr();
}

// Loads from a pointer (kGlobal, kShared) or a SwizzledRef (kSwizzled).
template <Src S, typename P>
__device__ __forceinline__ uint4 Ld16(const P& p) {
  if constexpr (S == Src::kGlobal) {
    return LdStream(p);
  } else if constexpr (S == Src::kShared) {
    return *reinterpret_cast<const uint4*>(p);
  } else {
    uint4 v;
    asm("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "r"(SmemAt<S>(p))
        : "memory");
    return v;
  }
}
template <Src S, typename P>
__device__ __forceinline__ uint2 Ld8(const P& p) {
  if constexpr (S == Src::kGlobal) {
    return LdStream8(p);
  } else if constexpr (S == Src::kShared) {
    return *reinterpret_cast<const uint2*>(p);
  } else {
    uint2 v;
    asm("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(SmemAt<S>(p)) : "memory");
    return v;
  }
}
// Stores 16 bytes at a kSwizzled location (the inverse of Ld16<kSwizzled>).
__device__ __forceinline__ void St16Swizzled(const SwizzledRef& p, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(SmemAt<Src::kSwizzled>(p)),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// A metadata word (uint32_t, float or uint8_t) of a row.
template <Src S, typename T, typename P>
__device__ __forceinline__ T LdMeta(const P& p) {
  if constexpr (S != Src::kSwizzled) {
    return *reinterpret_cast<const T*>(p);
  } else if constexpr (sizeof(T) == 1) {
    uint32_t v;
    asm("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(SmemAt<S>(p)) : "memory");
    return static_cast<T>(v);
  } else {
    static_assert(sizeof(T) == 4, "4-byte or 1-byte metadata");
    uint32_t v;
    asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(SmemAt<S>(p)) : "memory");
    T t;
    memcpy(&t, &v, 4);
    return t;
  }
}

// float(2^23 + byte) - (2^23 + z) == byte - z exactly.
__device__ __forceinline__ float ByteMinus(uint32_t word, uint32_t sel, float bias) {
  return __uint_as_float(__byte_perm(word, 0x4B000000u, sel)) - bias;
}

// Bytes 2i and 2i + 1 of `word` as b * 2^-24, exactly: one PRMT puts each
// in the low byte of an FP16 subnormal (bits 0x00bb), one widening per value
// (HADD2.F32). So an 8-bit code costs half a PRMT, a widening and one FFMA
// with the scale times 2^24 (AffineDecode).
inline constexpr float kTinyByteScale = 16777216.0f;  // 2^24
__device__ __forceinline__ float2 BytePairTiny(uint32_t word, int i) {
  const uint32_t h = __byte_perm(word, 0u, i == 0 ? 0x4140u : 0x4342u);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

template <int N>
__device__ __forceinline__ float LaneAbsMax(const float* x) {
  float a[N / 2];
#pragma unroll
  for (int c = 0; c < N / 2; ++c) a[c] = fmaxf(fabsf(x[2 * c]), fabsf(x[2 * c + 1]));
#pragma unroll
  for (int w = N / 4; w >= 1; w >>= 1) {
#pragma unroll
    for (int c = 0; c < w; ++c) a[c] = fmaxf(a[c], a[c + w]);
  }
  return a[0];
}

// Lane column interleave: a lane pair splits its 32-column stripe into runs of
// W columns (lane cl holds runs cl, cl + 2, ...). W = 16 gives each lane 16
// contiguous columns (the quantized codecs, whose groups / blocks need it);
// W = 4 (fp32) and W = 8 (fp16 / bf16) make every 16-byte access of the pair
// land in one full 32-byte sector, so stores do not write half sectors.
// Column (within the stripe) of the lane's value c: ((c / W) * 2 + cl) * W + c % W.
template <int W>
__device__ __forceinline__ int ChunkCol(int v, int n) {
  return ((v * n) / W) * 2 * W + (v * n) % W;
}

// Rows of plain FP values (no metadata): fp32, fp16, bf16.
constexpr bool IsFpRowCodec(RowCodec c) {
  return c == RowCodec::kFp32 || c == RowCodec::kFp16 || c == RowCodec::kBf16;
}

// The 16-byte chunks of a lane's 16 values of an FP row: also the bytes of
// one value.
template <RowCodec C>
constexpr int FpChunks() {
  static_assert(IsFpRowCodec(C), "FP codecs");
  return C == RowCodec::kFp32 ? 4 : 2;
}

// Byte offset in an FP row of codec C of the lane's 16-byte chunk v (values
// 16 / N * v .., N = FpChunks; col0 as below): where LoadRow16 reads it and
// StoreRow16 / StoreTileStaged write it.
template <RowCodec C, int W>
__device__ __forceinline__ int FpChunkOffset(int col0, int v) {
  constexpr int N = FpChunks<C>();
  return N * (col0 + ChunkCol<W>(v, 16 / N));
}

// An affine row's scale (times the row factor) and zero point from its
// metadata word (FP16 s in the low half, FP16 z above: AffineMetaWord).
struct AffineRowParams {
  float s, z;
};
__device__ __forceinline__ AffineRowParams AffineRowParamsOf(uint32_t meta, float row_scale) {
  return AffineRowParams{
      row_scale * __half2float(__ushort_as_half(static_cast<unsigned short>(meta & 0xffffu))),
      __half2float(__ushort_as_half(static_cast<unsigned short>(meta >> 16)))};
}

// ---- Row codec: load 16 values ------------------------------------------------
// codes: FP codecs, the start of the row (the lane's chunks at
// FpChunkOffset); quantized codecs, the lane's first code (LoLaneCodes /
// UnitRef). meta: the lane's metadata unit (LoLaneMeta / UnitRef).
// col0: the lane's first column, stripe * 32 + cl * W.

// P: const uint8_t*, or SwizzledRef for kSwizzled.
// row_scale: DecodeRow's per-row factor (head_codec.h), folded into the
// group scale of quantized codecs; 1 decodes the stored values.
template <RowCodec C, Src S = Src::kGlobal, int W = 16, typename P = const uint8_t*>
__device__ __forceinline__ void LoadRow16(const P& codes, const NonDeduced<P>& meta, int col0,
                                          float global_scale, float* x, float row_scale = 1.0f) {
  if constexpr (C == RowCodec::kFp32) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint4 u = Ld16<S>(codes + FpChunkOffset<C, W>(col0, v));
      x[4 * v + 0] = row_scale * __uint_as_float(u.x);
      x[4 * v + 1] = row_scale * __uint_as_float(u.y);
      x[4 * v + 2] = row_scale * __uint_as_float(u.z);
      x[4 * v + 3] = row_scale * __uint_as_float(u.w);
    }
  } else if constexpr (C == RowCodec::kFp16 || C == RowCodec::kBf16) {
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const uint4 u = Ld16<S>(codes + FpChunkOffset<C, W>(col0, v));
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (C == RowCodec::kFp16) {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[e]));
          x[8 * v + 2 * e] = row_scale * f.x;
          x[8 * v + 2 * e + 1] = row_scale * f.y;
        } else {
          x[8 * v + 2 * e] = row_scale * __uint_as_float(w[e] << 16);
          x[8 * v + 2 * e + 1] = row_scale * __uint_as_float(w[e] & 0xffff0000u);
        }
      }
    }
  } else if constexpr (C == RowCodec::kAffineU8) {
    const uint4 u = Ld16<S>(codes);
    const AffineRowParams r =
        AffineRowParamsOf(LdMeta<S, uint32_t>(meta), row_scale);
    // AffineDecode: fma(s, q, -(s z)) = fma(s 2^24, q 2^-24, -(s z)): the same
    // exact product, s 2^24 finite (s: an FP16 scale times a decay <= 1, the
    // binding validates g <= 0).
    const float s24 = r.s * kTinyByteScale;
    const float c = -(r.s * r.z);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float2 t = BytePairTiny(w[e], i);
        x[4 * e + 2 * i] = __fmaf_rn(s24, t.x, c);
        x[4 * e + 2 * i + 1] = __fmaf_rn(s24, t.y, c);
      }
    }
  } else if constexpr (C == RowCodec::kAffineU4) {
    const uint2 u = Ld8<S>(codes);
    const AffineRowParams r =
        AffineRowParamsOf(LdMeta<S, uint32_t>(meta), row_scale);
    const float c = -(r.s * r.z);  // AffineDecode
    const uint32_t w[2] = {u.x, u.y};
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const uint32_t q = (w[e / 8] >> (4 * (e % 8))) & 0xfu;
      x[e] = __fmaf_rn(r.s, __uint_as_float(0x4B000000u | q) - kMagicByte, c);
    }
  } else if constexpr (C == RowCodec::kSymI8) {
    const uint4 u = Ld16<S>(codes);
    const float s = row_scale * LdMeta<S, float>(meta);
    const float bias = kMagicByte + 128.0f;
    const uint32_t w[4] = {u.x ^ 0x80808080u, u.y ^ 0x80808080u, u.z ^ 0x80808080u,
                           u.w ^ 0x80808080u};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x[4 * e + 0] = s * ByteMinus(w[e], 0x7650u, bias);
      x[4 * e + 1] = s * ByteMinus(w[e], 0x7651u, bias);
      x[4 * e + 2] = s * ByteMinus(w[e], 0x7652u, bias);
      x[4 * e + 3] = s * ByteMinus(w[e], 0x7653u, bias);
    }
  } else if constexpr (C == RowCodec::kFp8E4m3) {
    const uint4 u = Ld16<S>(codes);
    const float s = row_scale * LdMeta<S, float>(meta);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      x[e] = Fp8Decode(static_cast<uint8_t>(w[e / 4] >> (8 * (e % 4))), s);
    }
  } else if constexpr (C == RowCodec::kNvfp4) {
    const uint2 u = Ld8<S>(codes);
    const float mult = row_scale * Nvfp4BlockMultiplier(
                                       LdMeta<S, uint8_t>(meta), global_scale);
    const uint32_t w[2] = {u.x, u.y};
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      x[e] = Nvfp4Decode(static_cast<uint8_t>((w[e / 8] >> (4 * (e % 8))) & 0xfu), mult);
    }
  }
}

// ---- Row codec: store 16 values -----------------------------------------------
// Both lanes of a pair call this together (it shuffles with lane ^ 1); the
// lane with the even lane index writes the group's metadata. codes, meta,
// col0: as for LoadRow16.

__device__ __forceinline__ uint32_t PackBytes(int32_t a, int32_t b, int32_t c, int32_t d) {
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

// ---- Affine (int8 / int4) row encoding, shared by StoreRow16 and the
// fixed-shape tile store (tile_common.cuh) -------------------------------------

template <RowCodec C>
__device__ __forceinline__ constexpr int AffineQmax() {
  return C == RowCodec::kAffineU8 ? 255 : 15;
}

// The group's stored metadata word: FP16 s in the low half, FP16 z above.
__device__ __forceinline__ uint32_t AffineMetaWord(const AffineParams& p) {
  return static_cast<uint32_t>(p.s_bits) | (static_cast<uint32_t>(p.z_bits) << 16);
}

// The fast encoder below skips AffineEncode's clamp: exact whenever the
// FP16 scale did not saturate (s_bits != kFp16MaxBits; else the shared
// encoder runs instead), since then every code of the group already lies in
// [0, qmax] (the proof at MakeAffineParams, group_quant.h). s == 0 gives
// inv_s == z == 0 and code 0. (Groups containing NaN are outside the
// byte-equality contract: see LaneRangeBits.)
__device__ __forceinline__ bool AffineFastPathExact(const AffineParams& p) {
  return p.s_bits != kFp16MaxBits;
}

// Encodes and stores the lane's 16 values of a row, bit-exact with
// AffineEncode. Fast path: one FFMA with the zero point folded into the
// rounding constant gives the code q = rint(x / s + z) in the low bits of
// 1.5 * 2^23 + q, so the bytes (or nibbles) are packed straight from the
// FFMA results.
// codes: the lane's first code (as for StoreRow16).
template <RowCodec C, bool kFast>
__device__ __forceinline__ void EncodeAffineRowT(uint8_t* codes, const float* x, float inv_s,
                                                 float z) {
  constexpr int kQmax = AffineQmax<C>();
  const float magic_z = kRoundMagic + z;  // exact: z is an integer in [0, qmax]
  if constexpr (C == RowCodec::kAffineU8) {
    uint32_t w[4];
    if constexpr (kFast) {
      uint32_t b[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) b[e] = __float_as_uint(__fmaf_rn(x[e], inv_s, magic_z));
#pragma unroll
      for (int e = 0; e < 4; ++e) w[e] = PackBytes(b[4 * e], b[4 * e + 1], b[4 * e + 2], b[4 * e + 3]);
    } else {
      AffineParams p;
      p.inv_s = inv_s;
      p.z = z;
      int32_t q[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) q[e] = AffineEncode(x[e], p, kQmax);
#pragma unroll
      for (int e = 0; e < 4; ++e) w[e] = PackBytes(q[4 * e], q[4 * e + 1], q[4 * e + 2], q[4 * e + 3]);
    }
    StStream(codes, make_uint4(w[0], w[1], w[2], w[3]));
  } else {
    int32_t q[16];
    if constexpr (kFast) {
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        q[e] = static_cast<int32_t>(__float_as_uint(__fmaf_rn(x[e], inv_s, magic_z)) & 0xfu);
      }
    } else {
      AffineParams p;
      p.inv_s = inv_s;
      p.z = z;
#pragma unroll
      for (int e = 0; e < 16; ++e) q[e] = AffineEncode(x[e], p, kQmax);
    }
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 16; ++e) w[e / 8] |= static_cast<uint32_t>(q[e]) << (4 * (e % 8));
    StStream8(codes, make_uint2(w[0], w[1]));
  }
}

template <RowCodec C>
__device__ __forceinline__ void EncodeAffineRow(uint8_t* codes, const float* x, float inv_s,
                                                float z, bool fast) {
  if (fast) {
    EncodeAffineRowT<C, true>(codes, x, inv_s, z);
  } else {
    EncodeAffineRowT<C, false>(codes, x, inv_s, z);
  }
}

// 16 values as FP16 / BF16 pairs (value 2e in the low half of w[e]).
template <RowCodec C>
__device__ __forceinline__ void PackRow16Bits(const float* x, uint32_t (&w)[8]) {
  static_assert(C == RowCodec::kFp16 || C == RowCodec::kBf16, "16-bit FP codecs");
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if constexpr (C == RowCodec::kFp16) {
      // RNE saturating to the finite range: FloatToHalfBits of both.
      asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(w[e]) : "f"(x[2 * e + 1]), "f"(x[2 * e]));
    } else {
      w[e] = static_cast<uint32_t>(FloatToBf16Bits(x[2 * e])) |
             (static_cast<uint32_t>(FloatToBf16Bits(x[2 * e + 1])) << 16);
    }
  }
}

// The lane's 16 values of an FP row as the 16-byte chunks it stores: chunk v
// holds values 16 / N * v .. (N = FpChunks), stored at column ChunkCol<W>(v,
// 16 / N) of the lane's columns (StoreRow16; the fixed tiles' line stores).
template <RowCodec C>
__device__ __forceinline__ void FpRowChunks(const float* x, uint4 (&chunks)[FpChunks<C>()]) {
  if constexpr (C == RowCodec::kFp32) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      chunks[v] = make_uint4(__float_as_uint(x[4 * v]), __float_as_uint(x[4 * v + 1]),
                             __float_as_uint(x[4 * v + 2]), __float_as_uint(x[4 * v + 3]));
    }
  } else {
    uint32_t w[8];
    PackRow16Bits<C>(x, w);
    chunks[0] = make_uint4(w[0], w[1], w[2], w[3]);
    chunks[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

template <RowCodec C, int W = 16>
__device__ __forceinline__ void StoreRow16(uint8_t* codes, uint8_t* meta, int col0,
                                           float global_scale, bool write_meta, const float* x) {
  if constexpr (IsFpRowCodec(C)) {
    constexpr int N = FpChunks<C>();  // also the bytes per value
    uint4 chunks[N];
    FpRowChunks<C>(x, chunks);
#pragma unroll
    for (int v = 0; v < N; ++v) StStream(codes + FpChunkOffset<C, W>(col0, v), chunks[v]);
  } else if constexpr (C == RowCodec::kAffineU8 || C == RowCodec::kAffineU4) {
    RangeBits r = LaneRangeBits<16>(x);
    r = MaxRange(r, RangeBits{__shfl_xor_sync(0xffffffffu, r.neg, 1),
                              __shfl_xor_sync(0xffffffffu, r.pos, 1)});
    const AffineParams p = MakeAffineParamsOfWidened(RangeMin(r), RangeMax(r), AffineQmax<C>());
    EncodeAffineRow<C>(codes, x, p.inv_s, p.z, AffineFastPathExact(p));
    if (write_meta) {
      *reinterpret_cast<uint32_t*>(meta) = AffineMetaWord(p);
    }
  } else if constexpr (C == RowCodec::kSymI8 || C == RowCodec::kFp8E4m3) {
    float amax = LaneAbsMax<16>(x);
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    const float s = C == RowCodec::kSymI8 ? MakeSymScale(amax) : MakeFp8Scale(amax);
    const float inv_s = C == RowCodec::kSymI8 ? SymInverseScale(s) : 1.0f / s;
    if constexpr (C == RowCodec::kSymI8) {
      // SymEncode bit for bit: one FFMA leaves n = rint(x / s) in the low bits
      // of 1.5 * 2^23 + n, whose low byte is the int8 code. SymEncode's clamp
      // to [-127, 127] never binds: |x| <= A = max(absmax, 1e-10), s =
      // RN(A / 127), inv_s = RN(1 / s), so |x * inv_s| <= 127 (1 + 2^-24) /
      // (1 - 2^-24) < 127.5. (x = +-inf: inv_s = 0 and the FFMA's NaN has low
      // byte 0xFF, which the clamp on its low 16 bits, -1, also kept.)
      uint32_t q[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) q[e] = __float_as_uint(__fmaf_rn(x[e], inv_s, kRoundMagic));
      StStream(codes, make_uint4(PackBytes(q[0], q[1], q[2], q[3]),
                                 PackBytes(q[4], q[5], q[6], q[7]),
                                 PackBytes(q[8], q[9], q[10], q[11]),
                                 PackBytes(q[12], q[13], q[14], q[15])));
    } else {
      int32_t q[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) q[e] = Fp8Encode(x[e], inv_s);
      StStream(codes, make_uint4(PackBytes(q[0], q[1], q[2], q[3]),
                                 PackBytes(q[4], q[5], q[6], q[7]),
                                 PackBytes(q[8], q[9], q[10], q[11]),
                                 PackBytes(q[12], q[13], q[14], q[15])));
    }
    if (write_meta) *reinterpret_cast<float*>(meta) = s;
  } else if constexpr (C == RowCodec::kNvfp4) {
    const uint8_t sb = MakeNvfp4BlockScale(LaneAbsMax<16>(x), global_scale);
    const float mult = Nvfp4BlockMultiplier(sb, global_scale);
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      w[e / 8] |= static_cast<uint32_t>(Nvfp4Encode(x[e], mult)) << (4 * (e % 8));
    }
    StStream8(codes, make_uint2(w[0], w[1]));
    *meta = sb;  // one block per lane
  }
}

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_TILE_CODEC_CUH_
