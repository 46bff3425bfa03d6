// Shared device helpers of the tile kernels: the lane map of decode_math.h,
// whole-tile load / store of a packed head, value-axis maps and reductions.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_TILE_COMMON_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_TILE_COMMON_CUH_

#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/decode_math.h"
#include "kernels/cuda/internal/async_copy.cuh"
#include "kernels/cuda/internal/kernel_params.h"
#include "kernels/cuda/internal/stage_layout.h"
#include "kernels/cuda/internal/tile_codec.cuh"
#include "kernels/formats/format.h"
#include "kernels/formats/hadamard.h"
#include "kernels/formats/head_layout.h"

namespace statecache {
namespace cuda_internal {

// Column interleave of a format's lane pairs (tile_codec.cuh, ChunkCol): the
// format table's lane column (kernels/formats/format.h), at most
// kTileColsPerLane.
template <StateFormat F>
constexpr int LaneWidth() {
  static_assert(TraitsOf(F).lane == 4 || TraitsOf(F).lane == 8 ||
                    TraitsOf(F).lane == kTileColsPerLane,
                "a lane holds 4, 8 or kTileColsPerLane columns");
  return TraitsOf(F).lane;
}

// Where this lane sits in the tile (see decode_math.h). Its value c is
// column stripe * 32 + ColOf(c).
struct LaneMap {
  int warp, lane, stripe, row_warp, rl, cl;
  int w;     // column interleave W
  int col0;  // stripe * 32 + cl * W: the lane's first column
  int c32;   // column (within the stripe) this lane holds after a reduce-scatter
  int jc;    // stripe * 32 + c32
  __device__ int row(int i) const { return (row_warp * kTileSteps + i) * kTileRowsPerStep + rl; }
  __device__ int ColOf(int c) const { return ((c / w) * 2 + cl) * w + c % w; }
};

template <int W>
__device__ __forceinline__ LaneMap MakeLaneMap(int stripes, int tid = threadIdx.x) {
  LaneMap m;
  m.warp = tid >> 5;
  m.lane = tid & 31;
  m.stripe = m.warp % stripes;
  m.row_warp = m.warp / stripes;
  m.rl = m.lane >> 1;
  m.cl = m.lane & 1;
  m.w = W;
  m.col0 = m.stripe * kTileStripe + m.cl * W;
  m.c32 = m.ColOf(m.rl);
  m.jc = m.stripe * kTileStripe + m.c32;
  return m;
}

// threadIdx.x read so that the compiler cannot hoist what is derived from it
// out of a loop: inside a long loop body at the register limit, a lane map
// recomputed per iteration (a few integer instructions) is cheaper than the
// spills of hoisted lane constants.
__device__ __forceinline__ int OpaqueThreadIdx() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  // Non-negative (blocks have at most 1024 threads): lane-map divisions and
  // remainders compile to shifts and masks instead of signed sequences.
  __builtin_assume(t >= 0 && t < 1024);
  return t;
}

// The hi rows' chunk map (HiLaneCol) assumes lanes of 16 columns.
static_assert(LaneWidth<StateFormat::kDamp>() == 16 && LaneWidth<StateFormat::kDampSr>() == 16,
              "mixed formats hold 16 columns per lane");

// Loads the lane's kTileSteps x 16 values of a packed head (rows >= d_k are 0).
// row_scale (optional): the lane's rows' DecodeRow factors (decode_math.h:
// the first token's decay), nullptr for the stored values.
template <StateFormat F, Src S = Src::kGlobal>
__device__ __forceinline__ void LoadTile(const PackedHeadLayout& l, const uint8_t* head,
                                         const LaneMap& m, float global_scale,
                                         float (&s)[kTileSteps][kTileColsPerLane],
                                         const float* row_scale = nullptr) {
  constexpr RowCodec kLo = LoRowCodec(F);
  constexpr RowCodec kHi = HiRowCodec(F);
#pragma unroll
  for (int i = 0; i < kTileSteps; ++i) {
    const int r = m.row(i);
    if (r >= l.d_k) {
#pragma unroll
      for (int c = 0; c < kTileColsPerLane; ++c) s[i][c] = 0.0f;
    } else if (IsMixedFormat(F) && r < l.k_hi) {
      LoadRow16<kHi, S, 8>(head + UnitOffset(HiRows(l), r, m.col0 / kHiUnitValues), nullptr,
                           HiLaneCol(m.col0), 0.0f, s[i],
                           row_scale != nullptr ? row_scale[i] : 1.0f);
    } else {
      const int lr = r - l.k_hi;
      LoadRow16<kLo, S, LaneWidth<F>()>(LoLaneCodes<kLo>(l, head, lr, m.col0),
                                        LoLaneMeta<kLo>(l, head, lr, m.col0), m.col0,
                                        global_scale, s[i],
                                        row_scale != nullptr ? row_scale[i] : 1.0f);
    }
  }
}

// Global scale of an nvfp4 head: max |x| over the lo rows of the whole CTA.
// `red` holds one float per warp. Every thread of the CTA must call it.
template <StateFormat F>
__device__ __forceinline__ float TileGlobalScale(const PackedHeadLayout& l, const LaneMap& m,
                                                 const float (&s)[kTileSteps][kTileColsPerLane],
                                                 float* red, int warps) {
  if constexpr (LoRowCodec(F) != RowCodec::kNvfp4) {
    return 0.0f;
  } else {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kTileSteps; ++i) {
      const int r = m.row(i);
      if (r < l.d_k && r >= l.k_hi) amax = fmaxf(amax, LaneAbsMax<kTileColsPerLane>(s[i]));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    }
    __syncthreads();  // `red` may still be read by an earlier phase
    if (m.lane == 0) red[m.warp] = amax;
    __syncthreads();
    float all = 0.0f;
    for (int w = 0; w < warps; ++w) all = fmaxf(all, red[w]);
    return MakeNvfp4GlobalScale(all);
  }
}

// Encodes the lane's tile into a packed head (in place). Lane pairs shuffle,
// so whole warps must call it.
template <StateFormat F>
__device__ __forceinline__ void StoreTile(const PackedHeadLayout& l, uint8_t* head,
                                          const LaneMap& m, float global_scale,
                                          const float (&s)[kTileSteps][kTileColsPerLane]) {
  constexpr RowCodec kLo = LoRowCodec(F);
  constexpr RowCodec kHi = HiRowCodec(F);
#pragma unroll
  for (int i = 0; i < kTileSteps; ++i) {
    const int r = m.row(i);
    // A lane pair shares r, so both lanes take the same branch.
    if (r >= l.d_k) continue;
    if (IsMixedFormat(F) && r < l.k_hi) {
      StoreRow16<kHi, 8>(head + UnitOffset(HiRows(l), r, m.col0 / kHiUnitValues), nullptr,
                         HiLaneCol(m.col0), 0.0f, false, s[i]);
    } else {
      const int lr = r - l.k_hi;
      StoreRow16<kLo, LaneWidth<F>()>(LoLaneCodes<kLo>(l, head, lr, m.col0),
                                      LoLaneMeta<kLo>(l, head, lr, m.col0), m.col0, global_scale,
                                      m.cl == 0, s[i]);
    }
  }
}

// ---- Fixed-shape tiles (d_k = d_v = 128, k_hi = kDefaultKHi) -----------------
// Every row exists and, for mixed formats, the hi rows are exactly step 0 of
// row warp 0 (k_hi = 16 = kTileRowsPerStep): `hi_step0` (warp-uniform) says
// whether this warp's step 0 is a hi row; steps 1..3 are always lo rows. The
// row codecs are compile-time everywhere else (no per-row branches).
static_assert(kDefaultKHi == kTileRowsPerStep, "fixed tiles put the hi rows in one step");

// H: the head's start as a pointer, or (kSwizzled) its shared address as
// uint32_t, addressed through SwizzledRef (RowRef: the lane's position is
// swizzled once, each row block adds a constant).
template <StateFormat F, Src S, typename H>
__device__ __forceinline__ void LoadTileFixed(const PackedHeadLayout& l, H head, const LaneMap& m,
                                              float global_scale, bool hi_step0,
                                              float (&s)[kTileSteps][kTileColsPerLane],
                                              const float (&row_scale)[kTileSteps]) {
  constexpr int W = LaneWidth<F>();
  // Row block of step i: rows r0 .. r0 + 15, the lane's row r0 + rl.
  const auto r0 = [&](int i) { return m.row(i) - m.rl; };
  constexpr RowCodec kLo = LoRowCodec(F);
  const auto load_lo = [&](int i) {
    const int lr0 = r0(i) - l.k_hi;
    if constexpr (IsFpRowCodec(kLo)) {
      const auto row = RowRef(head, l.lo_codes_offset, l.lo_code_row_bytes, lr0, m.rl);
      LoadRow16<kLo, S, W>(row, row, m.col0, global_scale, s[i], row_scale[i]);
    } else {
      const int u = LaneUnit<kLo>(m.col0);
      LoadRow16<kLo, S, W>(UnitRef(head, LoCodes(l), lr0, m.rl, u, LaneUnitByte<kLo>(m.col0)),
                           UnitRef(head, LoMeta(l), lr0, m.rl, u, 0), m.col0, global_scale,
                           s[i], row_scale[i]);
    }
  };
  if (IsMixedFormat(F) && hi_step0) {
    const auto hi = UnitRef(head, HiRows(l), r0(0), m.rl, m.col0 / kHiUnitValues, 0);
    LoadRow16<HiRowCodec(F), S, 8>(hi, hi, HiLaneCol(m.col0), 0.0f, s[0], row_scale[0]);
  } else {
    load_lo(0);
  }
#pragma unroll
  for (int i = 1; i < kTileSteps; ++i) load_lo(i);
}

// Writes a fixed-shape FP tile back into its kSwizzled stage, in place: each
// lane's chunks go where LoadTileFixed read them (StoreRow16's chunk
// order), so a tensor-map store of the stage writes the updated head.
template <StateFormat F>
__device__ __forceinline__ void StoreTileStaged(const PackedHeadLayout& l, uint32_t head,
                                                const LaneMap& m,
                                                const float (&s)[kTileSteps][kTileColsPerLane]) {
  constexpr RowCodec kLo = LoRowCodec(F);
  static_assert(!IsMixedFormat(F) && IsFpRowCodec(kLo), "rows of FP values only");
  constexpr int N = FpChunks<kLo>();  // also the bytes per value
  constexpr int W = LaneWidth<F>();
#pragma unroll
  for (int i = 0; i < kTileSteps; ++i) {
    uint4 chunks[N];
    FpRowChunks<kLo>(s[i], chunks);
    const SwizzledRef row =
        RowRef(head, l.lo_codes_offset, l.lo_code_row_bytes, m.row(i) - m.rl, m.rl);
#pragma unroll
    for (int v = 0; v < N; ++v) St16Swizzled(row + FpChunkOffset<kLo, W>(m.col0, v), chunks[v]);
  }
}

// Affine group parameters of N rows held by a lane pair (r: this lane's
// half of each row, LaneRangeBits). Each row's parameters are derived once
// per pair: lane cl takes rows cl, cl + 2, ... and the pair swaps the
// results. Outputs inv_s and z for every row, the metadata word of the rows
// this lane owns (row 2p + cl in meta[p]), and whether the fast encoder is
// exact for all rows of the warp (warp-uniform).
template <int N>
__device__ __forceinline__ bool PairAffineParams(const RangeBits (&r)[N], int cl, int qmax,
                                                 float (&inv)[N], float (&z)[N],
                                                 uint32_t (&meta)[(N + 1) / 2]) {
  bool exact = true;
#pragma unroll
  for (int p = 0; p < (N + 1) / 2; ++p) {
    const int j0 = 2 * p;
    const int j1 = j0 + 1 < N ? j0 + 1 : j0;  // odd N: both lanes derive row j0
    // Selected field by field (a reference to r[cl ? j0 : j1] would put r in
    // local memory).
    const RangeBits keep{cl ? r[j1].neg : r[j0].neg, cl ? r[j1].pos : r[j0].pos};
    const uint32_t send_neg = cl ? r[j0].neg : r[j1].neg;
    const int32_t send_pos = cl ? r[j0].pos : r[j1].pos;
    const RangeBits g = MaxRange(keep, RangeBits{__shfl_xor_sync(0xffffffffu, send_neg, 1),
                                                 __shfl_xor_sync(0xffffffffu, send_pos, 1)});
    const AffineParams ap = MakeAffineParamsOfWidened(RangeMin(g), RangeMax(g), qmax);
    exact = exact && AffineFastPathExact(ap);
    meta[p] = AffineMetaWord(ap);
    const float other_inv = __shfl_xor_sync(0xffffffffu, ap.inv_s, 1);
    const float other_z = __shfl_xor_sync(0xffffffffu, ap.z, 1);
    inv[j0] = cl ? other_inv : ap.inv_s;
    z[j0] = cl ? other_z : ap.z;
    if (j0 + 1 < N) {
      inv[j0 + 1] = cl ? ap.inv_s : other_inv;
      z[j0 + 1] = cl ? ap.z : other_z;
    }
  }
  return __all_sync(0xffffffffu, exact);
}

// Encodes the affine rows of steps [kFirst, kTileSteps) of a fixed-shape
// tile: the pair-split parameter derivation, then the encodes of all rows
// (interleaved with the derivation; see below for the exact fallback).
template <StateFormat F, int kFirst>
__device__ __forceinline__ void StoreAffineStepsFixed(
    const PackedHeadLayout& l, uint8_t* head, const LaneMap& m,
    const float (&s)[kTileSteps][kTileColsPerLane]) {
  constexpr RowCodec kLo = LoRowCodec(F);
  constexpr int N = kTileSteps - kFirst;
  RangeBits range[N];
  float inv[N], z[N];
  uint32_t meta[(N + 1) / 2];
#pragma unroll
  for (int j = 0; j < N; ++j) range[j] = LaneRangeBits<16>(s[kFirst + j]);
  const bool fast = PairAffineParams<N>(range, m.cl, AffineQmax<kLo>(), inv, z, meta);
  // The lane's codes and metadata unit in every row step's pair of row
  // blocks (head_layout.h): a warp stores whole lines of codes and whole
  // sectors of metadata.
  const int u = LaneUnit<kLo>(m.col0);
  const int64_t code_lane = InPairOffset(LoCodes(l), m.rl, u) + LaneUnitByte<kLo>(m.col0);
  const int64_t meta_lane = InPairOffset(LoMeta(l), m.rl, u);
  const auto encode = [&](auto fast_tag) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int r0 = m.row(kFirst + j) - m.rl - l.k_hi;
      EncodeAffineRowT<kLo, decltype(fast_tag)::value>(
          head + PairOffset(LoCodes(l), r0) + code_lane, s[kFirst + j], inv[j], z[j]);
    }
  };
  // The fast encoder runs unconditionally (no branch between the parameter
  // chains and the encodes, so they interleave); in the rare warp where it
  // is not exact for some row (a saturated FP16 scale), the exact encoder
  // then rewrites every row (the thread's later stores win).
  encode(std::true_type{});
  if (!fast) encode(std::false_type{});
#pragma unroll
  for (int p = 0; p < (N + 1) / 2; ++p) {
    const int j = 2 * p + m.cl;
    if (j < N) {
      const int r0 = m.row(kFirst + j) - m.rl - l.k_hi;
      *reinterpret_cast<uint32_t*>(head + PairOffset(LoMeta(l), r0) + meta_lane) = meta[p];
    }
  }
}

// Floats of a warp's buffer for StoreStepLines (16 rows x 32 FP32 values).
inline constexpr int kLineBufferFloats = kTileRowsPerStep * kTileStripe;
static_assert(kLineBufferFloats <= kWarpReduceFloats, "it reuses the reduce-scatter buffer");

// Stores one row step (16 rows) of an FP tile (FP32: N = 4 chunks per lane,
// FP16 / BF16: N = 2) as whole lines of the stripe. A lane pair holds its
// row's 32 * N stripe bytes as 2N chunks of 16 (lane cl has chunks cl,
// cl + 2, ..: the W interleave), so direct stores would write 16 rows x 32
// bytes per warp instruction: 16 partial lines for L2 to merge, which kept
// the FP32 kernel's L2 busier than its DRAM. Instead the step goes through
// the warp's shared buffer `buf` (kLineBufferFloats) and 2N lanes store one
// row's stripe bytes (FP32: a whole 128-byte line; 16-bit formats: half a
// line, the other half is the next stripe's warp's): 16 / N rows per
// instruction. The unit map (LineWriteUnit, LineReadUnit in swizzle.h) is
// bank-conflict free both ways. rows: the step's first row at this stripe's
// first byte.
template <int N>
__device__ __forceinline__ void StoreStepLines(uint8_t* rows, int row_bytes, const LaneMap& m,
                                               const uint4 (&chunks)[N], float* buf) {
  uint4* units = reinterpret_cast<uint4*>(buf);
  __syncwarp();  // earlier reads of buf are done
#pragma unroll
  for (int v = 0; v < N; ++v) units[LineWriteUnit<N>(m.rl, m.cl, v)] = chunks[v];
  __syncwarp();
  // Access j reads 16 / N rows further down: unit + 32 j (swizzle_test).
  const uint4* src = units + LineReadUnit<N>(m.lane, 0);
  uint8_t* dst = rows + LineReadRow<N>(m.lane, 0) * row_bytes + LineReadChunk<N>(m.lane) * 16;
#pragma unroll
  for (int j = 0; j < N; ++j) StStream(dst + j * (16 / N) * row_bytes, src[32 * j]);
}

// Encodes a fixed-shape tile (see LoadTileFixed). Affine lo rows go through
// StoreAffineStepsFixed: all four steps, or steps 1..3 in the warps whose
// step 0 holds the hi rows of a mixed format (a warp-uniform choice); FP
// formats store whole lines through the warp's buffer `buf` (StoreStepLines);
// other codecs store row by row.
template <StateFormat F>
__device__ __forceinline__ void StoreTileFixed(const PackedHeadLayout& l, uint8_t* head,
                                               const LaneMap& m, float global_scale,
                                               bool hi_step0,
                                               const float (&s)[kTileSteps][kTileColsPerLane],
                                               float* buf) {
  constexpr RowCodec kLo = LoRowCodec(F);
  constexpr int W = LaneWidth<F>();
  constexpr bool kAffine = kLo == RowCodec::kAffineU8 || kLo == RowCodec::kAffineU4;
  const auto store_hi0 = [&] {
    StoreRow16<HiRowCodec(F), 8>(
        UnitRef(head, HiRows(l), m.row(0) - m.rl, m.rl, m.col0 / kHiUnitValues, 0), nullptr,
        HiLaneCol(m.col0), 0.0f, false, s[0]);
  };
  if constexpr (IsFpRowCodec(kLo)) {
    static_assert(!IsMixedFormat(F), "FP formats have no hi rows");
    constexpr int N = FpChunks<kLo>();
    static_assert(W == 16 / N, "chunk 2v + cl of a lane pair is lane cl's value run v");
#pragma unroll
    for (int i = 0; i < kTileSteps; ++i) {
      uint4 chunks[N];
      FpRowChunks<kLo>(s[i], chunks);
      StoreStepLines<N>(head + l.lo_codes_offset + (m.row(i) - m.rl) * l.lo_code_row_bytes +
                            m.stripe * kTileStripe * N,  // N: bytes per value
                        static_cast<int>(l.lo_code_row_bytes), m, chunks, buf);
    }
  } else if constexpr (kAffine) {
    if (IsMixedFormat(F) && hi_step0) {
      store_hi0();
      StoreAffineStepsFixed<F, 1>(l, head, m, s);
    } else {
      StoreAffineStepsFixed<F, 0>(l, head, m, s);
    }
  } else {
    const auto store_lo = [&](int i) {
      const int lr = m.row(i) - l.k_hi;
      StoreRow16<kLo, W>(LoLaneCodes<kLo>(l, head, lr, m.col0), LoLaneMeta<kLo>(l, head, lr, m.col0),
                         m.col0, global_scale, m.cl == 0, s[i]);
    };
    if (IsMixedFormat(F) && hi_step0) {
      store_hi0();
    } else {
      store_lo(0);
    }
#pragma unroll
    for (int i = 1; i < kTileSteps; ++i) store_lo(i);
  }
}

// H32 butterfly over a stripe where this lane holds column c32 = cl*16 + rl
// (lane = 2*rl + cl): the same adds, in the same order, as Hadamard32.
__device__ __forceinline__ float StripeHadamard(float x, int c32) {
#pragma unroll
  for (int h = 1; h < kHadamardBlock; h <<= 1) {
    const int lane_mask = h == 16 ? 1 : (h << 1);
    const float other = __shfl_xor_sync(0xffffffffu, x, lane_mask);
    x = (c32 & h) ? other - x : x + other;
  }
  return x * kHadamardNorm;
}

// H32 over a row block of 32 held as 16 values in each lane of a pair
// (cl = 0: values 0..15, cl = 1: values 16..31), same order as Hadamard32.
__device__ __forceinline__ void PairHadamard(float (&x)[kTileColsPerLane], int cl) {
#pragma unroll
  for (int h = 1; h < 16; h <<= 1) {
#pragma unroll
    for (int i = 0; i < 16; i += 2 * h) {
#pragma unroll
      for (int j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float other = __shfl_xor_sync(0xffffffffu, x[j], 1);
    x[j] = cl == 0 ? x[j] + other : other - x[j];
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) x[j] *= kHadamardNorm;
}

// Reduce-scatter of 16 per-lane column partials over the 16 row lanes of a
// warp through a per-warp shared buffer: every lane writes its 16 partials
// (4 x 16-byte stores), then sums the 16 partials of its column (column
// col0 + rl) in WarpTreeSum's tree (pairs differing in rl bit 3, 2, 1, 0;
// fewer instructions than a shuffle butterfly, which needs per-level
// selects). Layout: lane (rl, cl) writes floats [cl * 336 + rl * 20, +16);
// the padding makes both the writes and the column reads bank-conflict-free.
// (kWarpReduceFloats, the buffer's size, is in stage_layout.h.)

// The transpose of the reduce-scatter: every lane writes its 16 per-column
// values, then reads the 16 values of its column (one per row lane) into v.
// kSynced: the caller's warp passed a __syncwarp (or a barrier) after its
// last reads of buf, so the writes need no leading one (two instructions).
template <bool kSynced = false>
__device__ __forceinline__ void WarpTranspose16Smem(const float (&p)[16], float* buf, int rl,
                                                    int cl, float (&v)[16]) {
  if (!kSynced) __syncwarp();  // earlier reads of buf are done
  float* mine = buf + cl * 336 + rl * 20;
#pragma unroll
  for (int c4 = 0; c4 < 4; ++c4) {
    *reinterpret_cast<float4*>(mine + 4 * c4) =
        make_float4(p[4 * c4], p[4 * c4 + 1], p[4 * c4 + 2], p[4 * c4 + 3]);
  }
  __syncwarp();
  const float* col = buf + cl * 336 + rl;
#pragma unroll
  for (int r = 0; r < 16; ++r) v[r] = col[r * 20];
}

template <bool kSynced = false>
__device__ __forceinline__ float WarpReduceScatter16Smem(const float (&p)[16], float* buf,
                                                         int rl, int cl) {
  float v[16];
  WarpTranspose16Smem<kSynced>(p, buf, rl, cl, v);
  return WarpTreeSum(v);
}

// c ? a : b as one selp (the compiler keeps it a select of values).
__device__ __forceinline__ float SelectF32(bool c, float a, float b) {
  float r;
  asm("{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n selp.f32 %0, %2, %3, p;\n}"
      : "=f"(r)
      : "r"(static_cast<uint32_t>(c)), "f"(a), "f"(b));
  return r;
}

// One halving level of ShuffleReduceScatter16 over rl bit H (lane bit 2H):
// values [0, 2H) -> [0, H).
template <int H>
__device__ __forceinline__ void ShuffleHalve(float (&v)[16], int rl) {
  const bool upper = (rl & H) != 0;
#pragma unroll
  for (int c = 0; c < H; ++c) {
    // Selects of values (selp), not of array elements: the latter become a
    // dynamically indexed array in local memory.
    const float lo = v[c], hi = v[c + H];
    const float send = SelectF32(upper, lo, hi);
    const float keep = SelectF32(upper, hi, lo);
    v[c] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * H);  // lane = 2 rl + cl
  }
}

// WarpReduceScatter16Smem's result through shuffles, without a buffer: four
// halving levels over the row lanes (rl bit 3, 2, 1, 0); at each a lane keeps
// the half of its values whose index has its own rl bit and adds its
// partner's copy of that half, so the sums pair the same groups as
// WarpTreeSum's tree (each level's adds are commutative: the same bits).
__device__ __forceinline__ float ShuffleReduceScatter16(const float (&p)[16], int rl) {
  float v[16];
#pragma unroll
  for (int c = 0; c < 16; ++c) v[c] = p[c];
  ShuffleHalve<8>(v, rl);
  ShuffleHalve<4>(v, rl);
  ShuffleHalve<2>(v, rl);
  ShuffleHalve<1>(v, rl);
  return v[0];
}

// Max over the 16 row lanes of 16 per-lane column values (max is
// order-free): the warp maximum of column col0 + rl.
__device__ __forceinline__ float WarpMaxScatter16Smem(const float (&p)[16], float* buf, int rl,
                                                      int cl) {
  float v[16];
  WarpTranspose16Smem(p, buf, rl, cl, v);
  float m = v[0];
#pragma unroll
  for (int r = 1; r < 16; ++r) m = fmaxf(m, v[r]);
  return m;
}

// Reduction scratch of one token step (shared memory).
struct StepScratch {
  float* red_k;   // [row_warps][d_v]
  float* red_q;   // [row_warps][d_v]
  float* red_v;   // [d_v]: v' from row warp 0 (kStripeBarrier)
  float* red_qk;  // [row_warps], or [stripes][row_warps] with kStripeBarrier
  float* wbuf;    // [32] of this warp
  float* wred;    // [kWarpReduceFloats] of this warp (WarpReduceScatter16Smem)
};

// One recurrence token on the lane's registers (decode_math.h's
// ReferenceHeadStep, bit for bit). kk, qs, a: the lane's rows (0 for rows
// >= d_k); vp: v' at column m.jc; returns o' at column m.jc. Contains one
// __syncthreads when row_warps > 1: every thread of the CTA must call it.
// kFolded: the state was decoded with the decay folded in (LoadTile's
// row_scale = a), so this token's a is not applied again.
// kStripeBarrier: the column sums are exchanged with a named barrier
// (id 1 + stripe) among the row warps of the lane's stripe only, which are
// the only warps that share columns; then only those warps must call it,
// and vp is needed in row warp 0 only (the others receive it there).
// kShuffle: the warp reductions and the delta all-gather go through
// shuffles instead of sc.wred / sc.wbuf (same sums), which then need not
// exist.
// kWredSynced: the caller's warp passed a __syncwarp (or a barrier) after
// its last reads of sc.wred, so the first reduce-scatter skips its leading
// one (the pipelined decode kernel: GatherRowsPaired and the stage release
// sync the warp between items).
template <bool kFolded = false, bool kStripeBarrier = false, bool kShuffle = false,
          bool kWredSynced = false>
__device__ __forceinline__ float TokenStep(float (&s)[kTileSteps][kTileColsPerLane],
                                           const float (&kk)[kTileSteps],
                                           const float (&qs)[kTileSteps],
                                           const float (&a)[kTileSteps], float vp, float beta,
                                           const LaneMap& m, const DecodeTiling& t, int d_v,
                                           const StepScratch& sc) {
  float ka[kTileSteps], qa[kTileSteps];
  float qk = 0.0f;
#pragma unroll
  for (int i = 0; i < kTileSteps; ++i) {
    ka[i] = kFolded ? kk[i] : kk[i] * a[i];
    qa[i] = kFolded ? qs[i] : qs[i] * a[i];
    qk = Fma(qs[i], kk[i], qk);
  }
  // The lane's column partials of sum_r c_r w_rj, then their warp totals;
  // one sum at a time keeps 16 fewer registers live.
  const auto column_sums = [&](const float (&c)[kTileSteps], auto synced) {
    float part[kTileColsPerLane];
#pragma unroll
    for (int j = 0; j < kTileColsPerLane; ++j) part[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < kTileSteps; ++i) {
#pragma unroll
      for (int j = 0; j < kTileColsPerLane; ++j) part[j] = Fma(c[i], s[i][j], part[j]);
    }
    if constexpr (kShuffle) return ShuffleReduceScatter16(part, m.rl);
    return WarpReduceScatter16Smem<decltype(synced)::value>(part, sc.wred, m.rl, m.cl);
  };
  float ks = column_sums(ka, std::integral_constant<bool, kWredSynced>{});
  float qsum = column_sums(qa, std::false_type{});  // after ks's reads of sc.wred
#pragma unroll
  for (int off = 16; off >= 2; off >>= 1) qk = qk + __shfl_xor_sync(0xffffffffu, qk, off);
  if (t.row_warps > 1) {
    // Every stripe computes the same qk; with stripe barriers each keeps its own.
    float* red_qk = kStripeBarrier ? sc.red_qk + m.stripe * t.row_warps : sc.red_qk;
    sc.red_k[m.row_warp * d_v + m.jc] = ks;
    sc.red_q[m.row_warp * d_v + m.jc] = qsum;
    if ((kStripeBarrier || m.stripe == 0) && m.lane == 0) red_qk[m.row_warp] = qk;
    if constexpr (kStripeBarrier) {
      if (m.row_warp == 0) sc.red_v[m.jc] = vp;
      NamedSync(1 + m.stripe, 32 * t.row_warps);
      if (m.row_warp != 0) vp = sc.red_v[m.jc];
    } else {
      __syncthreads();
    }
    ks = sc.red_k[m.jc];
    qsum = sc.red_q[m.jc];
    qk = red_qk[0];
    for (int w = 1; w < t.row_warps; ++w) {
      ks = ks + sc.red_k[w * d_v + m.jc];
      qsum = qsum + sc.red_q[w * d_v + m.jc];
      qk = qk + red_qk[w];
    }
  }
  const float db = beta * (vp - ks);
  // All-gather the 16 deltas of this lane's columns (column ColOf(c) is
  // held by lane 2 c + cl).
  float d[kTileColsPerLane];
  if constexpr (kShuffle) {
#pragma unroll
    for (int c = 0; c < kTileColsPerLane; ++c) d[c] = __shfl_sync(0xffffffffu, db, 2 * c + m.cl);
  } else {
    // No leading __syncwarp: the reduce-scatters above synced the warp
    // after its earlier reads of sc.wbuf.
    sc.wbuf[m.c32] = db;
    __syncwarp();
#pragma unroll
    for (int c4 = 0; c4 < 4; ++c4) {
      const float4 v4 = *reinterpret_cast<const float4*>(sc.wbuf + m.ColOf(4 * c4));
      d[4 * c4] = v4.x;
      d[4 * c4 + 1] = v4.y;
      d[4 * c4 + 2] = v4.z;
      d[4 * c4 + 3] = v4.w;
    }
  }
#pragma unroll
  for (int i = 0; i < kTileSteps; ++i) {
#pragma unroll
    for (int c = 0; c < kTileColsPerLane; ++c) {
      s[i][c] = Fma(kk[i], d[c], kFolded ? s[i][c] : a[i] * s[i][c]);
    }
  }
  return Fma(qk, db, qsum);
}

__device__ __forceinline__ float LoadInput(int dtype, const void* p, int64_t i) {
  if (dtype == 0) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  if (dtype == 1) return __uint_as_float(static_cast<uint32_t>(b) << 16);
  return __half2float(__ushort_as_half(b));
}

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_TILE_COMMON_CUH_
