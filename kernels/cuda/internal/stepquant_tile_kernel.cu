// STEPQuant tiled decode kernel (StepTileDecodeKernel): decode steps
// (T = 1) of 128 x 128 STEPQuant heads on damp's thread map and TokenStep
// (tile_common.cuh, decode_math.h), with the STEPQuant row codec per lane.
//
// Contract: the bytes and outputs equal the tile reference, not the CPU
// backend's serial order (the CPU bytes differ from these in rounding only):
//   w = StepDecodeHead(head, row_scale = a)      a_r = DecayExp(g) per stored row
//   ReferenceHeadStep(a = 1, k, scale * q, beta, v, w) -> o   (decode_math.h)
//   StepEncodeHead(w, row_impact, StepSumOrder::kTile)        (stepquant_codec.h)
// (kernels/cuda/stepquant_cuda_test.cc, StepTileDecodeTest, checks it).
//
// Thread map (decode_math.h): 256 threads, warp w = stripe w % 4 (32 value
// columns) x row warp w / 4 (64 stored rows); lane (rl, cl) holds rows
// (rw * 4 + i) * 16 + rl, i = 0..3, and the 16 columns stripe * 32 + cl * 16
// + c, in registers from decode to encode. Per item:
//   B0  (named, the 4 warps of a row warp) the row table: rows of the row warp
//       built once, one thread per row (width, code offset, old row scale
//       with the decay folded in, 1 / Q_b, k, scale * q, w_i^2);
//   decode: each lane reads its 2b code bytes per row (4 words, one funnel
//       shift, two 64-bit halves), codes -> StepDecodeValue;
//   B1  (CTA) TokenStep<true> (decay folded), then the stage is refilled;
//   B2  (named, the 2 warps of a stripe) column absmax over the integer rows
//       (warp max reduce-scatter + both row warps) -> c0, 1 / c0;
//   B3  (named, the 4 warps of a row warp) row maxima of |x| / c0 -> r, Q / r;
//   codes: per row, rint / clamp, packed in registers (runtime width: quarter
//       words, two 64-bit halves), stored as 32-bit words (a lane pair
//       exchanges the shared word of odd widths); the w^2-weighted column
//       sums per lane over its 4 rows, then WarpReduceScatter16Smem;
//   B4  (named; row warp 1 arrives, row warp 0 waits) chunk partials added,
//       c = num / den -> fp16 column scales.
// Pivot rows (FP16) decode / store directly; section padding is written as
// zeros, every byte of the head is written once and none outside it.
// Heads and inputs of the item after next are fetched into one of two
// shared-memory stages by the bulk-copy engine (cp.async.bulk on an
// mbarrier) while the current item computes; a stage holds any 128 x 128
// STEPQuant head (<= 32,912 bytes).
// Built with --fmad=false: only explicit fmaf() / Fma() is fused.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/decode_math.h"
#include "kernels/cuda/internal/async_copy.cuh"
#include "kernels/cuda/internal/kernel_params.h"
#include "kernels/cuda/internal/stepquant_params.h"
#include "kernels/cuda/internal/tile_common.cuh"
#include "kernels/cuda/internal/validation_block.cuh"
#include "kernels/formats/numeric.h"
#include "kernels/formats/packed_bytes.h"
#include "kernels/formats/stepquant_codec.h"

namespace statecache {
namespace cuda_internal {
namespace {

constexpr int kTDim = 128;
constexpr int kTThreads = 256;
constexpr unsigned kFull = 0xffffffffu;
// The largest 128 x 128 head: 127 pivot rows (32,512 bytes) + one 8-bit row
// (128) + row scales (16) + column scales (256) = 32,912; all pivots 32,768.
constexpr int kTHeadCap = 32912;
static_assert(sizeof(StepHeadLayout) == 96, "the layout is bulk-copied (16-byte multiple)");

// Stage (bytes, 16-aligned offsets).
constexpr int kTsHeader = 0;                       // int32 slot, pad, int64 head offset
constexpr int kTsLayout = 16;                      // StepHeadLayout
constexpr int kTsHead = 128;                       // [kTHeadCap] + 32 slack (window reads)
constexpr int kTsQ = kTsHead + kTHeadCap + 32;     // [128] dtype (<= 4 bytes)
constexpr int kTsK = kTsQ + 4 * kTDim;
constexpr int kTsV = kTsK + 4 * kTDim;
constexpr int kTsG = kTsV + 4 * kTDim;             // KDA [128] fp32
constexpr int kTsPerm = kTsG + 4 * kTDim;          // [128] int32
constexpr int kTsImpact = kTsPerm + 4 * kTDim;     // [128] fp32
constexpr int kTsBytes = (kTsImpact + 4 * kTDim + 127) / 128 * 128;
static_assert(kTsQ % 16 == 0, "bulk-copy destinations are 16-aligned");

// Scratch (floats) before the stages.
constexpr int kScRedK = 0;        // [2 parity][2 row warps][128]
constexpr int kScRedQ = 512;
constexpr int kScRedQk = 1024;    // [2 parity][4]
constexpr int kScWbuf = 1032;     // [8 warps][32]
constexpr int kScWred = 1288;     // [8 warps][kWarpReduceFloats]
constexpr int kScColMax = kScWred + 8 * kWarpReduceFloats;  // [2 row warps][128]
constexpr int kScRowMax = kScColMax + 256;                  // [128 rows][4 stripes]
constexpr int kScNum = kScRowMax + 512;                     // [2 row warps][128]
constexpr int kScDen = kScNum + 256;
constexpr int kScInfo = kScDen + 256;                       // [2 parity][2 row warps][16] ints
constexpr int kScTable = kScInfo + 64;                      // [2 parity][128 rows][8]
constexpr int kScFloats = kScTable + 2 * kTDim * 8;
constexpr int kScBytes = (4 * kScFloats + 127) / 128 * 128;
constexpr int kTSmemBytes = kScBytes + 2 * kTsBytes;
static_assert(kScWred % 4 == 0 && kScTable % 4 == 0 && kScRowMax % 4 == 0, "float4 access");

// Item info (ints) copied from the staged layout / header per row warp.
enum InfoField {
  kInPivots = 0,
  kInIntRows,
  kInCodesOff,
  kInCodeBytes,
  kInRowScaleOff,
  kInColScaleOff,
  kInHeadBytes,
  kInHeadOffLo,
  kInHeadOffHi,
  kInFields
};

__device__ __forceinline__ bool TAborted(const int32_t* errors) {
  return ValidationBlockFailed(errors);
}

// Thread 0 only: stages item `item` into `stage` (all completes on `bar`).
__device__ void TileIssue(const StepKernelParams& p, uint8_t* stage, uint64_t* bar, int item) {
  const int b = item / p.h_v;
  const int h = item % p.h_v;
  const int32_t slot = p.slots[b];
  *reinterpret_cast<int32_t*>(stage + kTsHeader) = slot;
  if (slot < 0) {
    MbarrierArrive(bar);
    return;
  }
  const int64_t hi = int64_t{p.layer} * p.h_v + h;
  const int hb = static_cast<int>(p.heads[hi].head_bytes);
  if (hb > kTHeadCap) __trap();  // impossible for 128 x 128 heads
  *reinterpret_cast<int64_t*>(stage + kTsHeader + 8) = p.head_offsets[hi];
  const int ds = p.dtype == 0 ? 4 : 2;
  const int kh = h / (p.h_v / p.h_qk);
  int total = static_cast<int>(sizeof(StepHeadLayout)) + hb + 3 * kTDim * ds;
  if (p.kda) total += 4 * kTDim;
  if (p.key_perm != nullptr) total += 4 * kTDim;
  if (p.row_impact != nullptr) total += 4 * kTDim;
  MbarrierExpectTx(bar, total);
  BulkCopy(stage + kTsLayout, p.heads + hi, static_cast<int>(sizeof(StepHeadLayout)), bar);
  const uint8_t* src = p.pool_base + slot * p.slot_stride + p.head_offsets[hi];
  constexpr int kChunk = 4096;
  for (int off = 0; off < hb; off += kChunk) {
    BulkCopy(stage + kTsHead + off, src + off, hb - off < kChunk ? hb - off : kChunk, bar);
  }
  const int64_t qk_off = (int64_t{b} * p.h_qk + kh) * kTDim * ds;
  BulkCopy(stage + kTsQ, static_cast<const uint8_t*>(p.q) + qk_off, kTDim * ds, bar);
  BulkCopy(stage + kTsK, static_cast<const uint8_t*>(p.k) + qk_off, kTDim * ds, bar);
  BulkCopy(stage + kTsV, static_cast<const uint8_t*>(p.v) + int64_t{item} * kTDim * ds,
            kTDim * ds, bar);
  if (p.kda) BulkCopy(stage + kTsG, p.g + int64_t{item} * kTDim, 4 * kTDim, bar);
  if (p.key_perm != nullptr) BulkCopy(stage + kTsPerm, p.key_perm + hi * kTDim, 4 * kTDim, bar);
  if (p.row_impact != nullptr) {
    BulkCopy(stage + kTsImpact, p.row_impact + hi * kTDim, 4 * kTDim, bar);
  }
}

// 64-bit shifts by 0..64 (64 gives 0).
__device__ __forceinline__ uint64_t Shr64(uint64_t x, int n) { return n < 64 ? x >> n : 0; }
__device__ __forceinline__ uint64_t Shl64(uint64_t x, int n) { return n < 64 ? x << n : 0; }

// Decodes the lane's 16 codes of a b-bit row: the lane's segment is 2b bytes
// at byte `seg` of the staged head (seg is even). Writes float(z_c) into fz.
__device__ __forceinline__ void LoadCodes16(const uint8_t* head_s, int seg, int b,
                                            float (&fz)[16]) {
  const uint32_t* wp = reinterpret_cast<const uint32_t*>(head_s + (seg & ~3));
  const uint32_t w0 = wp[0], w1 = wp[1], w2 = wp[2], w3 = wp[3];
  const int sh = (seg & 3) * 8;  // 0 or 16
  const uint32_t l0 = __funnelshift_r(w0, w1, sh);
  const uint32_t l1 = __funnelshift_r(w1, w2, sh);
  const uint32_t l2 = __funnelshift_r(w2, w3, sh);
  const uint32_t l3 = w3 >> sh;
  const uint64_t L0 = l0 | (static_cast<uint64_t>(l1) << 32);
  const uint64_t L1 = l2 | (static_cast<uint64_t>(l3) << 32);
  const int hb = 8 * b;  // bits per 8 values
  const uint64_t H[2] = {L0, Shr64(L0, hb) | Shl64(L1, 64 - hb)};
  const uint32_t mask = (1u << b) - 1u;
  const uint32_t key = (1u << (b - 1)) | 0x4B000000u;  // sign flip + 2^23 exponent
  const float bias = 8388608.0f + static_cast<float>(1 << (b - 1));
  const int s1 = b, s2 = 2 * b, s3 = 3 * b;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t lo = static_cast<uint32_t>(H[h]);
    const uint32_t hi = static_cast<uint32_t>(H[h] >> 32);
    const uint32_t q[2] = {lo, __funnelshift_rc(lo, hi, 4 * b)};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const uint32_t word = q[e / 4];
      const int s = e % 4 == 0 ? 0 : e % 4 == 1 ? s1 : e % 4 == 2 ? s2 : s3;
      const uint32_t f = ((word >> s) & mask) ^ key;
      fz[8 * h + e] = __uint_as_float(f) - bias;
    }
  }
}

// Stores the lane's 16 codes as 32-bit words at byte `seg` of the global
// head `head_g`. quarter[k] holds codes 4k..4k+3 (two's complement, b bits
// each, code 4k + e at bit e * b). Both lanes of a pair call it together (odd
// widths share a word).
__device__ __forceinline__ void StoreCodes16(uint8_t* head_g, int seg, int b,
                                             const uint32_t (&quarter)[4], int lane) {
  uint64_t H[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    H[h] = static_cast<uint64_t>(quarter[2 * h]) |
           (static_cast<uint64_t>(quarter[2 * h + 1]) << (4 * b));
  }
  const int hb = 8 * b;
  uint64_t L0 = H[0] | Shl64(H[1], hb);
  uint64_t L1 = Shr64(H[1], 64 - hb);
  const int sh = (seg & 3) * 8;  // 16 for the odd-width lane cl = 1
  if (sh != 0) {
    L1 = (L1 << sh) | (L0 >> (64 - sh));
    L0 = L0 << sh;
  }
  const unsigned pair = 3u << (lane & 30);
  const uint32_t from_partner = __shfl_xor_sync(pair, static_cast<uint32_t>(L0), 1);
  const bool odd = (b & 1) != 0;
  const int nw = (sh / 8 + 2 * b + 3) / 4;     // words touched by this lane
  const int first = (odd && sh != 0) ? 1 : 0;  // word 0 is the partner's
  // An odd-width lane cl = 0 ends mid-word: the partner's first two bytes
  // complete it (selects, not an indexed array: no local memory).
  const uint32_t extra = (odd && sh == 0) ? from_partner : 0u;
  const uint32_t w0 = static_cast<uint32_t>(L0) | (nw == 1 ? extra : 0u);
  const uint32_t w1 = static_cast<uint32_t>(L0 >> 32) | (nw == 2 ? extra : 0u);
  const uint32_t w2 = static_cast<uint32_t>(L1) | (nw == 3 ? extra : 0u);
  const uint32_t w3 = static_cast<uint32_t>(L1 >> 32) | (nw == 4 ? extra : 0u);
  uint32_t* base = reinterpret_cast<uint32_t*>(head_g + (seg & ~3));
  if (first == 0) base[0] = w0;
  if (nw > 1) base[1] = w1;
  if (nw > 2) base[2] = w2;
  if (nw > 3) base[3] = w3;
}

__device__ __forceinline__ void ZeroBytes(uint8_t* head, int from, int to, int t) {
  if (from + t < to) head[from + t] = 0;
}

__global__ void __launch_bounds__(kTThreads, 2) StepTileDecodeKernel(const StepKernelParams p) {
  extern __shared__ __align__(128) uint8_t tsmem[];
  __shared__ __align__(8) uint64_t bars[2];
  if (TAborted(p.abort_if_error)) return;
  const DecodeTiling tiling = MakeDecodeTiling(kTDim, kTDim);
  const LaneMap m = MakeLaneMap<kTileColsPerLane>(tiling.stripes);
  const int items = p.batch * p.h_v;
  const int stride = gridDim.x;
  const int t = threadIdx.x;
  float* scratch = reinterpret_cast<float*>(tsmem);
  uint8_t* stages = tsmem + kScBytes;
  // Thread index inside the row warp's 4 warps (128 threads).
  const int tg = m.stripe * 32 + m.lane;

  if (t == 0) {
    StartStages(bars, 2, blockIdx.x, stride, items, [&](int s, int item) {
      TileIssue(p, stages + s * kTsBytes, &bars[s], item);
    });
  }
  __syncthreads();

  for (int n = 0, item = blockIdx.x; item < items; ++n, item += stride) {
    const int st = n & 1;
    const int par = n & 1;
    const uint32_t bar_parity = static_cast<uint32_t>((n >> 1) & 1);
    uint8_t* stage = stages + st * kTsBytes;
    const float beta = p.beta[item];
    const float g_head = p.kda ? 0.0f : p.g[item];
    MbarrierWait(&bars[st], bar_parity);
    const int32_t slot = *reinterpret_cast<const int32_t*>(stage + kTsHeader);
    if (slot < 0) {  // skipped item: o is zeroed, the pool is untouched
      if (p.o != nullptr && m.row_warp == 0) p.o[int64_t{item} * kTDim + m.jc] = 0.0f;
      __syncthreads();
      if (t == 0 && item + 2 * stride < items) TileIssue(p, stage, &bars[st], item + 2 * stride);
      continue;
    }
    const uint8_t* head_s = stage + kTsHead;
    int* info = reinterpret_cast<int*>(scratch + kScInfo) + (par * 2 + m.row_warp) * 16;
    float* table = scratch + kScTable + par * kTDim * 8;

    // ---- B0: the row table of this row warp's 64 rows, one thread per row.
    {
      const StepHeadLayout& L = *reinterpret_cast<const StepHeadLayout*>(stage + kTsLayout);
      if (tg < kInFields) {
        const int64_t hoff = *reinterpret_cast<const int64_t*>(stage + kTsHeader + 8);
        const int v = tg == kInPivots       ? L.pivot_rows
                      : tg == kInIntRows    ? L.int_rows()
                      : tg == kInCodesOff   ? static_cast<int>(L.codes_offset)
                      : tg == kInCodeBytes  ? static_cast<int>(L.code_bytes)
                      : tg == kInRowScaleOff ? static_cast<int>(L.row_scale_offset)
                      : tg == kInColScaleOff ? static_cast<int>(L.col_scale_offset)
                      : tg == kInHeadBytes  ? static_cast<int>(L.head_bytes)
                      : tg == kInHeadOffLo  ? static_cast<int>(static_cast<uint64_t>(hoff) & 0xffffffffu)
                                            : static_cast<int>(static_cast<uint64_t>(hoff) >> 32);
        info[tg] = v;
      }
      if (tg < kTileRowsPerWarp) {
        const int r = m.row_warp * kTileRowsPerWarp + tg;
        const int P = L.pivot_rows;
        int bits = kStepPivotBits;
        int off = static_cast<int>(L.pivot_offset) + r * kTDim * 2;
        if (r >= P) {
          int start = P;
          int acc = static_cast<int>(L.codes_offset);
          bits = 0;
#pragma unroll
          for (int b = kStepMaxCodeBits; b >= kStepMinCodeBits; --b) {
            const int cnt = L.rows_at[b];
            if (bits == 0 && r < start + cnt) {
              bits = b;
              off = acc + (r - start) * 16 * b;
            }
            acc += cnt * 16 * b;
            start += cnt;
          }
        }
        const int c = p.key_perm != nullptr ? reinterpret_cast<const int32_t*>(stage + kTsPerm)[r] : r;
        const float a =
            DecayExp(p.kda ? reinterpret_cast<const float*>(stage + kTsG)[c] : g_head);
        float rs = a;  // pivots: x = a * fp16 value
        float invq = 0.0f;
        if (r >= P) {
          rs = a * HalfBitsToFloat(LoadU16(head_s + L.row_scale_offset + 2 * (r - P)));
          invq = StepInvQ(bits);
        }
        const float wi =
            p.row_impact != nullptr ? reinterpret_cast<const float*>(stage + kTsImpact)[r] : 1.0f;
        const float kr = LoadInput(p.dtype, stage + kTsK, c);
        const float qr = p.scale * LoadInput(p.dtype, stage + kTsQ, c);
        float4* rec = reinterpret_cast<float4*>(table + r * 8);
        rec[0] = make_float4(kr, qr, wi * wi, 0.0f);
        rec[1] = make_float4(__int_as_float(off), __int_as_float(bits), rs, invq);
      }
    }
    NamedSync(1 + m.row_warp, 128);  // B0

    // ---- Decode (StepDecodeHead with the decay folded in).
    const int pivots = info[kInPivots];
    const bool has_int = info[kInIntRows] > 0;
    float s[kTileSteps][kTileColsPerLane];
    float kk[kTileSteps], qs[kTileSteps], ones[kTileSteps];
    {
      float cs[16];
      if (has_int) {
        const uint8_t* col_scales = head_s + info[kInColScaleOff];
        LoadRow16<RowCodec::kFp16, Src::kShared>(col_scales, col_scales, m.col0, 0.0f, cs);
      } else {
#pragma unroll
        for (int c = 0; c < 16; ++c) cs[c] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kTileSteps; ++i) {
        const int r = m.row(i);
        const float4* rec = reinterpret_cast<const float4*>(table + r * 8);
        const float4 r0 = rec[0];
        const float4 r1 = rec[1];
        kk[i] = r0.x;
        qs[i] = r0.y;
        ones[i] = 1.0f;
        const int off = __float_as_int(r1.x);
        const int b = __float_as_int(r1.y);
        if (b == kStepPivotBits) {
          const uint8_t* pivot_row = head_s + off;
          LoadRow16<RowCodec::kFp16, Src::kShared>(pivot_row, pivot_row, m.col0, 0.0f, s[i], r1.z);
        } else {
          float fz[16];
          LoadCodes16(head_s, off + 2 * b * (m.col0 >> 4), b, fz);
#pragma unroll
          for (int c = 0; c < 16; ++c) {
            // StepDecodeValue: (r * c) * (z * (1 / Q_b)), z exact in fz.
            const float rc = r1.z * cs[c];
            const float zn = fz[c] * r1.w;
            s[i][c] = rc * zn;
          }
        }
      }
    }
    const float vp = LoadInput(p.dtype, stage + kTsV, m.jc);

    // ---- B1: the token (decode_math.h), then the stage is free.
    StepScratch sc;
    sc.red_k = scratch + kScRedK + par * 256;
    sc.red_q = scratch + kScRedQ + par * 256;
    sc.red_v = nullptr;  // TokenStep<true>: no stripe barrier
    sc.red_qk = scratch + kScRedQk + par * 4;
    sc.wbuf = scratch + kScWbuf + m.warp * 32;
    sc.wred = scratch + kScWred + m.warp * kWarpReduceFloats;
    const float os = TokenStep<true>(s, kk, qs, ones, vp, beta, m, tiling, kTDim, sc);
    if (t == 0 && item + 2 * stride < items) {
      TileIssue(p, stages + st * kTsBytes, &bars[st], item + 2 * stride);
    }
    if (p.o != nullptr && m.row_warp == 0) p.o[int64_t{item} * kTDim + m.jc] = os;

    const int64_t head_off = static_cast<int64_t>(
        static_cast<uint64_t>(static_cast<uint32_t>(info[kInHeadOffLo])) |
        (static_cast<uint64_t>(static_cast<uint32_t>(info[kInHeadOffHi])) << 32));
    uint8_t* head = p.pool_base + slot * p.slot_stride + head_off;

    if (!has_int) {
      // Every row is a pivot: fp16 rows only (head_bytes = 256 * d_k).
#pragma unroll
      for (int i = 0; i < kTileSteps; ++i) {
        uint32_t w[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float x0 = fminf(fmaxf(s[i][2 * e], -kFp16Max), kFp16Max);
          const float x1 = fminf(fmaxf(s[i][2 * e + 1], -kFp16Max), kFp16Max);
          const __half2 hh = __floats2half2_rn(x0, x1);
          w[e] = *reinterpret_cast<const uint32_t*>(&hh);
        }
        uint4* dst = reinterpret_cast<uint4*>(head + m.row(i) * kTDim * 2 + 2 * m.col0);
        dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
        dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
      }
      continue;
    }

    // ---- B2: column absmax over the integer rows -> c0, 1 / c0.
    float c0;
    {
      float cm[16];
#pragma unroll
      for (int c = 0; c < 16; ++c) cm[c] = 0.0f;
#pragma unroll
      for (int i = 0; i < kTileSteps; ++i) {
        if (m.row(i) >= pivots) {
#pragma unroll
          for (int c = 0; c < 16; ++c) cm[c] = fmaxf(cm[c], fabsf(s[i][c]));
        }
      }
      const float wmax = WarpMaxScatter16Smem(cm, sc.wred, m.rl, m.cl);
      scratch[kScColMax + m.row_warp * kTDim + m.jc] = wmax;
      NamedSync(3 + m.stripe, 64);  // B2
      const float nmax = fmaxf(scratch[kScColMax + m.jc], scratch[kScColMax + kTDim + m.jc]);
      c0 = HalfBitsToFloat(StepScaleBits(nmax));
      __syncwarp();
      sc.wbuf[m.c32] = StepInvColumn(c0);  // all-gather of 1 / c0 in the warp
      __syncwarp();
    }
    const float* inv_cw = sc.wbuf + m.cl * 16;  // the lane's 16 columns (W = 16)

    // ---- B3: row maxima of |x| / c0 over the 4 stripes -> r, Q / r.
#pragma unroll
    for (int i = 0; i < kTileSteps; ++i) {
      float rm = 0.0f;
#pragma unroll
      for (int c4 = 0; c4 < 4; ++c4) {
        const float4 ic = *reinterpret_cast<const float4*>(inv_cw + 4 * c4);
        rm = fmaxf(rm, fabsf(s[i][4 * c4]) * ic.x);
        rm = fmaxf(rm, fabsf(s[i][4 * c4 + 1]) * ic.y);
        rm = fmaxf(rm, fabsf(s[i][4 * c4 + 2]) * ic.z);
        rm = fmaxf(rm, fabsf(s[i][4 * c4 + 3]) * ic.w);
      }
      rm = fmaxf(rm, __shfl_xor_sync(kFull, rm, 1));
      if (m.cl == 0) scratch[kScRowMax + m.row(i) * 4 + m.stripe] = rm;
    }
    NamedSync(7 + m.row_warp, 128);  // B3
    // Row scales and multipliers of the lane's rows (divisions here, where
    // few registers are live; stored row scales by one lane per row).
    float rfs[kTileSteps], mults[kTileSteps];
#pragma unroll
    for (int i = 0; i < kTileSteps; ++i) {
      const int r = m.row(i);
      const int b = __float_as_int(reinterpret_cast<const float4*>(table + r * 8)[1].y);
      const float4 mx4 = *reinterpret_cast<const float4*>(scratch + kScRowMax + r * 4);
      const float mrow = fmaxf(fmaxf(mx4.x, mx4.y), fmaxf(mx4.z, mx4.w));
      const uint16_t rbits = StepScaleBits(mrow);
      rfs[i] = HalfBitsToFloat(rbits);
      mults[i] = 0.0f;
      if (b != kStepPivotBits) {
        if (m.stripe == 0 && m.cl == 0) {
          StoreU16(head + info[kInRowScaleOff] + 2 * (r - pivots), rbits);
        }
        mults[i] = StepRowMultiplier(rfs[i], b);
      }
    }

    // ---- Codes, pivots and the column sums (tile order).
    float pnum[16], pden[16];
#pragma unroll
    for (int c = 0; c < 16; ++c) pnum[c] = pden[c] = 0.0f;
#pragma unroll
    for (int i = 0; i < kTileSteps; ++i) {
      const int r = m.row(i);
      const float4 r0 = reinterpret_cast<const float4*>(table + r * 8)[0];
      const float4 r1 = reinterpret_cast<const float4*>(table + r * 8)[1];
      const int off = __float_as_int(r1.x);
      const int b = __float_as_int(r1.y);
      if (b == kStepPivotBits) {
        uint32_t w[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float x0 = fminf(fmaxf(s[i][2 * e], -kFp16Max), kFp16Max);
          const float x1 = fminf(fmaxf(s[i][2 * e + 1], -kFp16Max), kFp16Max);
          const __half2 hh = __floats2half2_rn(x0, x1);
          w[e] = *reinterpret_cast<const uint32_t*>(&hh);
        }
        uint4* dst = reinterpret_cast<uint4*>(head + off + 2 * m.col0);
        dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
        dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
        continue;
      }
      const float rf = rfs[i];
      const float mult = mults[i];
      const float qmax = static_cast<float>(StepQMax(b));
      const float invq = r1.w;
      const float ww = r0.z;
      const uint32_t mask = (1u << b) - 1u;
      const uint32_t mul[4] = {1u, 1u << b, 1u << (2 * b), 1u << (3 * b)};
      uint32_t quarter[4];
#pragma unroll
      for (int c4 = 0; c4 < 4; ++c4) {
        const float4 ic = *reinterpret_cast<const float4*>(inv_cw + 4 * c4);
        const float icv[4] = {ic.x, ic.y, ic.z, ic.w};
        quarter[c4] = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 4 * c4 + e;
          const float x = s[i][c];
          const float tt = x * icv[e];
          const float u = tt * mult;
          const float uc = fminf(fmaxf(u, -qmax), qmax);
          const float v = __fadd_rn(uc, kRoundMagic);  // rint (|uc| <= 127)
          // v's low bits are z's two's complement (1.5 * 2^23 + z).
          quarter[c4] += (__float_as_uint(v) & mask) * mul[e];
          const float fz = __fsub_rn(v, kRoundMagic);
          const float zn = fz * invq;
          const float a = rf * zn;
          const float wa = ww * a;
          pnum[c] = fmaf(wa, x, pnum[c]);
          pden[c] = fmaf(wa, a, pden[c]);
        }
      }
      StoreCodes16(head, off + 2 * b * (m.col0 >> 4), b, quarter, m.lane);
    }
    const float wnum = WarpReduceScatter16Smem(pnum, sc.wred, m.rl, m.cl);
    const float wden = WarpReduceScatter16Smem(pden, sc.wred, m.rl, m.cl);
    scratch[kScNum + m.row_warp * kTDim + m.jc] = wnum;
    scratch[kScDen + m.row_warp * kTDim + m.jc] = wden;
    // Section padding is zero (the reference zero-fills the head).
    if (m.row_warp == 1 && m.stripe == 0 && m.lane < 16) {
      const int l = m.lane;
      ZeroBytes(head, pivots * kTDim * 2, info[kInCodesOff], l);
      ZeroBytes(head, info[kInCodesOff] + info[kInCodeBytes], info[kInRowScaleOff], l);
      ZeroBytes(head, info[kInRowScaleOff] + 2 * info[kInIntRows], info[kInColScaleOff], l);
      ZeroBytes(head, info[kInColScaleOff] + 2 * kTDim, info[kInHeadBytes], l);
    }
    if (m.row_warp == 1) {
      NamedArrive(9 + m.stripe, 64);  // B4
    } else {
      NamedSync(9 + m.stripe, 64);
      const float num = (0.0f + scratch[kScNum + m.jc]) + scratch[kScNum + kTDim + m.jc];
      const float den = (0.0f + scratch[kScDen + m.jc]) + scratch[kScDen + kTDim + m.jc];
      const float cj = (num > 0.0f && den > 0.0f) ? num / den : c0;
      StoreU16(head + info[kInColScaleOff] + 2 * m.jc, StepScaleBits(cj));
    }
  }
}

}  // namespace

int TileSharedBytes() { return kTSmemBytes; }

bool StepTileDecodeEligible(const StepKernelParams& p) {
  return StepFastDecodeEligible(p) && (reinterpret_cast<uintptr_t>(p.heads) & 15) == 0;
}

int LaunchStepTileDecode(const StepKernelParams& p, void* stream) {
  const int64_t items = int64_t{p.batch} * p.h_v;
  if (items == 0) return 0;
  static const int grid_cap = []() -> int {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaFuncSetAttribute(StepTileDecodeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kTSmemBytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, StepTileDecodeKernel, kTThreads,
                                                      kTSmemBytes) != cudaSuccess) {
      return -1;
    }
    return per_sm * sms;
  }();
  if (grid_cap < 1) return static_cast<int>(cudaErrorInvalidConfiguration);
  const int64_t grid = std::min<int64_t>(items, grid_cap);
  StepTileDecodeKernel<<<static_cast<unsigned>(grid), kTThreads, kTSmemBytes,
                         static_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cuda_internal
}  // namespace statecache
