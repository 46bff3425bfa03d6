// StepFastDecodeKernel: the STEPQuant decode kernel that keeps the CPU
// backend's summation order (bytes equal to the CPU backend's), for decode
// steps of 128 x 128 heads (StepFastDecodeEligible) when
// LaunchOptions::stepquant_variant is kH2 / kC2 / kC3, or when the tiled
// kernel is not eligible. Launched by LaunchStepRecurrence
// (stepquant_kernel.cu) through LaunchStepFastDecode; contract in
// stepquant_params.h, design in kernels/stepquant/README.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/glibc_expf.h"
#include "kernels/cuda/internal/async_copy.cuh"
#include "kernels/cuda/internal/kernel_params.h"
#include "kernels/cuda/internal/stepquant_device.cuh"
#include "kernels/cuda/internal/stepquant_params.h"
#include "kernels/cuda/internal/validation_block.cuh"
#include "kernels/formats/numeric.h"
#include "kernels/formats/packed_bytes.h"
#include "kernels/formats/stepquant_codec.h"


namespace statecache {
namespace cuda_internal {
namespace {

// ---- Fast decode (T = 1, d_k = d_v = 128) -----------------------------------
//
// StepFastDecodeKernel: persistent CTAs of 128 threads, thread j = value
// column j holding its whole column (128 FP32 values) in registers from the
// decode to the encode (or 256 threads holding half a column each, kHalves
// below). This mapping keeps every order-dependent sum of the
// contract local to one thread: the recurrence's S^T k and S^T q chains run
// over the stored rows in order exactly as the CPU's HeadStep (and the slow
// kernel), and so do the column least-squares sums with their 64-row chunk
// partials. Cross-column work is order-free (maxima) or pure data movement:
//   row maxima  per 32-row chunk a warp max reduce-scatter (lane L ends with
//               row L of the chunk), then a max over the 4 warps in shared
//               memory;
//   code bytes  each thread stores its int8 codes into a [128][128] shared
//               buffer; then (row, 8-column segment) tasks pack 8 codes into
//               b bytes and store them (32-/16-/8-bit stores).
// Per-row quantities (width, code offset, scales, w_i^2, q, k, decay) are
// computed once per head by thread r into a shared table and read as
// broadcasts. The next items' packed heads and inputs are fetched into one of
// two shared-memory stages by the bulk-copy engine (cp.async.bulk on an
// mbarrier) while the current item computes; a head larger than a stage
// (FP16 pivot heads) is decoded from global memory instead. Every byte of the
// head is written (padding as zeros), none outside it.
constexpr int kFastDim = 128;
constexpr int kFastMaxWarps = 8;  // 256 threads (two row halves)
// Stage capacity for a packed head: an all-8-bit 128 x 128 head is 16,896
// bytes; larger heads (pivot-heavy) are read from global memory.
constexpr int kFastHeadCap = 17408;
constexpr int kFastBulkChunk = 4096;

// Byte offsets inside one stage (multiples of 16).
constexpr int kFsHeader = 0;                            // int32 slot, int32 staged
constexpr int kFsHead = 16;                             // [kFastHeadCap] + 16 slack
constexpr int kFsQ = kFsHead + kFastHeadCap + 16;       // [d_k] dtype (<= 4 bytes)
constexpr int kFsK = kFsQ + 4 * kFastDim;
constexpr int kFsV = kFsK + 4 * kFastDim;
constexpr int kFsG = kFsV + 4 * kFastDim;               // KDA [d_k] fp32
constexpr int kFsPerm = kFsG + 4 * kFastDim;            // [d_k] int32
constexpr int kFsImpact = kFsPerm + 4 * kFastDim;       // [d_k] fp32
constexpr int kFsBytes = (kFsImpact + 4 * kFastDim + 127) / 128 * 128;
// After the two stages: code bytes [128][128], row-max partials
// [warps][128], the row table (9 arrays of 128).
constexpr int kFastCodeBytes = kFastDim * kFastDim;
constexpr int kFastRedBytes = 4 * kFastMaxWarps * kFastDim;
constexpr int kFastTableBytes = 3 * 16 * kFastDim;
constexpr int kFastSmemBytes = 2 * kFsBytes + kFastCodeBytes + kFastRedBytes + kFastTableBytes;

// The row table: three float4 records per stored row at fixed offsets of the
// dynamic shared memory (one 16-byte broadcast load per row and phase):
//   dec  {word offset of the row in the head (int), width b (int), old r, 1/Q_b}
//   rec  {k, decay, scale * q, 0}
//   enc  {Q_b / r, new r, w_i^2, 1/Q_b}
constexpr int kFastTableOff = 2 * kFsBytes + kFastCodeBytes + kFastRedBytes;
constexpr int kTabDec = 0;
constexpr int kTabRec = 1;
constexpr int kTabEnc = 2;

// A row-table record from shared memory. volatile asm with a memory clobber:
// the compiler neither merges the loads of two phases (which would keep 128
// rows of records live in registers next to the column) nor moves them
// across the table's stores.
__device__ __forceinline__ float4 LoadRecord(const float4* ptr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(ptr)))
               : "memory");
  return v;
}

// Thread 0 only: stages item `item` (its head when it fits, and its inputs)
// into `stage`; everything completes on `bar`.
__device__ void FastIssue(const StepKernelParams& p, uint8_t* stage, uint64_t* bar, int item) {
  const int b = item / p.h_v;
  const int h = item % p.h_v;
  const int32_t slot = p.slots[b];
  int32_t* header = reinterpret_cast<int32_t*>(stage + kFsHeader);
  header[0] = slot;
  if (slot < 0) {
    MbarrierArrive(bar);
    return;
  }
  const int64_t hi = int64_t{p.layer} * p.h_v + h;
  const int hb = static_cast<int>(p.heads[hi].head_bytes);
  const bool staged = hb <= kFastHeadCap;
  header[1] = staged ? 1 : 0;
  const int ds = p.dtype == 0 ? 4 : 2;
  const int kh = h / (p.h_v / p.h_qk);
  int total = 3 * kFastDim * ds;
  if (staged) total += hb;
  if (p.kda) total += 4 * kFastDim;
  if (p.key_perm != nullptr) total += 4 * kFastDim;
  if (p.row_impact != nullptr) total += 4 * kFastDim;
  MbarrierExpectTx(bar, total);
  if (staged) {
    const uint8_t* src = p.pool_base + slot * p.slot_stride + p.head_offsets[hi];
    for (int off = 0; off < hb; off += kFastBulkChunk) {
      BulkCopy(stage + kFsHead + off, src + off,
                   hb - off < kFastBulkChunk ? hb - off : kFastBulkChunk, bar);
    }
  }
  const int64_t qk_off = (int64_t{b} * p.h_qk + kh) * kFastDim * ds;
  BulkCopy(stage + kFsQ, static_cast<const uint8_t*>(p.q) + qk_off, kFastDim * ds, bar);
  BulkCopy(stage + kFsK, static_cast<const uint8_t*>(p.k) + qk_off, kFastDim * ds, bar);
  BulkCopy(stage + kFsV, static_cast<const uint8_t*>(p.v) + int64_t{item} * kFastDim * ds,
               kFastDim * ds, bar);
  if (p.kda) BulkCopy(stage + kFsG, p.g + int64_t{item} * kFastDim, 4 * kFastDim, bar);
  if (p.key_perm != nullptr) {
    BulkCopy(stage + kFsPerm, p.key_perm + hi * kFastDim, 4 * kFastDim, bar);
  }
  if (p.row_impact != nullptr) {
    BulkCopy(stage + kFsImpact, p.row_impact + hi * kFastDim, 4 * kFastDim, bar);
  }
}

// One level of a max reduce-scatter over x[0, 2 kHalf): lanes differing in
// lane bit kBit exchange the half they do not keep; x[0, kHalf) keeps the
// maxima.
template <int kHalf, int kBit>
__device__ __forceinline__ void RowMaxLevel(float (&x)[16], int lane) {
  const bool up = (lane & kBit) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = up ? x[i] : x[i + kHalf];
    const float keep = up ? x[i + kHalf] : x[i];
    x[i] = fmaxf(keep, __shfl_xor_sync(0xffffffffu, send, kBit));
  }
}

// Max of x[i] (row i of a 16-row chunk) over the lanes that hold the same
// rows. kLanes = 32 (a thread per column): lanes 2i and 2i + 1 return row i's
// maximum over the warp's 32 columns (lane bits 4..1, then the pair).
// kLanes = 16 (two row halves per warp): lane i and i + 16 return row i's
// maximum over their 16-lane half (lane bits 3..0).
template <int kLanes>
__device__ __forceinline__ float RowMaxScatter16(float (&x)[16], int lane) {
  if constexpr (kLanes == 32) {
    RowMaxLevel<8, 16>(x, lane);
    RowMaxLevel<4, 8>(x, lane);
    RowMaxLevel<2, 4>(x, lane);
    RowMaxLevel<1, 2>(x, lane);
    return fmaxf(x[0], __shfl_xor_sync(0xffffffffu, x[0], 1));
  } else {
    RowMaxLevel<8, 8>(x, lane);
    RowMaxLevel<4, 4>(x, lane);
    RowMaxLevel<2, 2>(x, lane);
    RowMaxLevel<1, 1>(x, lane);
    return x[0];
  }
}

// Writes the b bytes of `bits` (little-endian) at dst, with the widest
// stores dst's alignment allows (dst is b-aligned within a 16-aligned row).
__device__ __forceinline__ void StoreCodeBytes(uint8_t* dst, uint64_t bits, int b) {
  if ((b & 3) == 0) {
    for (int i = 0; i < b; i += 4) {
      *reinterpret_cast<uint32_t*>(dst + i) = static_cast<uint32_t>(bits >> (8 * i));
    }
  } else if ((b & 1) == 0) {
    for (int i = 0; i < b; i += 2) {
      *reinterpret_cast<uint16_t*>(dst + i) = static_cast<uint16_t>(bits >> (8 * i));
    }
  } else {
    for (int i = 0; i < b; ++i) dst[i] = static_cast<uint8_t>(bits >> (8 * i));
  }
}

// kHalves = 1: 128 threads, thread j = column j with all 128 rows.
// kHalves = 2: 256 threads, warp w holds columns 16w..16w+15; lanes 0-15 rows
//   0-63 and lanes 16-31 rows 64-127 of the same columns (64 values per
//   thread, half the registers, twice the warps). The serial chains run half
//   0, then half 1 from half 0's running sum (one shuffle), so every sum keeps
//   the reference order; the column sums' 64-row chunks are the halves.
// kMinBlocks = CTAs per SM the register budget is sized for.
// LaunchOptions::stepquant_variant selects the build: kH2 (kHalves 2, 2 CTAs,
// 128 registers; the fastest: kernels/stepquant/README.md), kC2 (kHalves 1,
// 2 CTAs, 255 registers), kC3 (kHalves 1, 3 CTAs, 168 registers).
//   p       StepKernelParams (stepquant_params.h) of an eligible decode step
//           (StepFastDecodeEligible: T = 1, 128 x 128, 16-byte aligned).
//   grid    min(batch * h_v, resident CTAs) persistent CTAs of
//           kFastDim * kHalves threads, kMinBlocks per SM.
//   smem    kFastSmemBytes of dynamic shared memory: two stages, the code
//           buffer, the row-max partials and the row table (offsets above).
//   sync    CTA barriers between the phases of an item; stage refills on
//           mbarriers (bulk copies).
//   trusts  the binding's checks; exits without writing when the
//           validation block p.abort_if_error is set.
template <int kHalves, int kMinBlocks>
__global__ void __launch_bounds__(kFastDim * kHalves, kMinBlocks)
    StepFastDecodeKernel(const StepKernelParams p) {
  constexpr int kThreads = kFastDim * kHalves;
  constexpr int kWarps = kThreads / 32;
  constexpr int kRows = kFastDim / kHalves;  // rows per thread
  constexpr unsigned kAll = 0xffffffffu;
  static_assert(kWarps <= kFastMaxWarps, "red buffer");
  extern __shared__ __align__(128) uint8_t fsmem[];
  __shared__ __align__(8) uint64_t bars[2];
  if (Aborted(p.abort_if_error)) return;
  const int items = p.batch * p.h_v;
  const int stride = gridDim.x;
  const int t = threadIdx.x;
  const int lane = t & 31;
  const int warp = t >> 5;
  const int half = kHalves == 1 ? 0 : lane >> 4;
  const int j = kHalves == 1 ? t : warp * 16 + (lane & 15);  // this thread's column
  const int row0 = half * kRows;                              // its first stored row
  int8_t* codebuf = reinterpret_cast<int8_t*>(fsmem + 2 * kFsBytes);
  float* red = reinterpret_cast<float*>(fsmem + 2 * kFsBytes + kFastCodeBytes);
  float4* const tab_dec = reinterpret_cast<float4*>(fsmem + kFastTableOff) + kTabDec * kFastDim;
  float4* const tab_rec = reinterpret_cast<float4*>(fsmem + kFastTableOff) + kTabRec * kFastDim;
  float4* const tab_enc = reinterpret_cast<float4*>(fsmem + kFastTableOff) + kTabEnc * kFastDim;

  if (t == 0) {
    StartStages(bars, 2, blockIdx.x, stride, items, [&](int s, int item) {
      FastIssue(p, fsmem + s * kFsBytes, &bars[s], item);
    });
  }
  __syncthreads();

  for (int n = 0, item = blockIdx.x; item < items; ++n, item += stride) {
    const int st = n & 1;
    const uint32_t parity = static_cast<uint32_t>((n >> 1) & 1);
    uint8_t* stage = fsmem + st * kFsBytes;
    const int h = item % p.h_v;
    const int next = item + 2 * stride;
    const int64_t hi = int64_t{p.layer} * p.h_v + h;
    const float beta = p.beta[item];
    const float g_head = p.kda ? 0.0f : p.g[item];
    MbarrierWait(&bars[st], parity);
    const int32_t slot = reinterpret_cast<const int32_t*>(stage + kFsHeader)[0];
    float* o = p.o != nullptr ? p.o + int64_t{item} * kFastDim : nullptr;
    if (slot < 0) {  // skipped item: o is zeroed, the pool is untouched
      if (o != nullptr && half == 0) o[j] = 0.0f;
      __syncthreads();
      if (t == 0 && next < items) FastIssue(p, stage, &bars[st], next);
      continue;
    }
    const bool staged = reinterpret_cast<const int32_t*>(stage + kFsHeader)[1] != 0;
    uint8_t* head = p.pool_base + slot * p.slot_stride + p.head_offsets[hi];
    const uint8_t* src = staged ? stage + kFsHead : head;
    const StepHeadLayout& l = p.heads[hi];
    const int pivots = l.pivot_rows;
    const bool has_int = l.int_rows() > 0;

    // Row table (thread r builds row r) and this column's old scale and input.
    if (t < kFastDim) {
      const int r = t;
      const int b = l.RowBits(r);
      const int cbyte = r < pivots ? static_cast<int>(l.pivot_offset) + r * kFastDim * 2
                                   : static_cast<int>(l.codes_offset + l.RowCodeOffset(r));
      const float rf_old =
          r < pivots ? 0.0f : HalfBitsToFloat(LoadU16(src + l.row_scale_offset + 2 * (r - pivots)));
      const float invq = r < pivots ? 0.0f : StepInvQ(b);
      tab_dec[r] = make_float4(__int_as_float(cbyte >> 2), __int_as_float(b), rf_old, invq);
      const float wi =
          p.row_impact != nullptr ? reinterpret_cast<const float*>(stage + kFsImpact)[r] : 1.0f;
      tab_enc[r] = make_float4(0.0f, 0.0f, wi * wi, invq);
      const int c = p.key_perm != nullptr ? reinterpret_cast<const int32_t*>(stage + kFsPerm)[r] : r;
      tab_rec[r] = make_float4(
          LoadIn(p.dtype, stage + kFsK, c),
          GlibcExpf(p.kda ? reinterpret_cast<const float*>(stage + kFsG)[c] : g_head),
          p.scale * LoadIn(p.dtype, stage + kFsQ, c), 0.0f);
    }
    const float cj = has_int ? HalfBitsToFloat(LoadU16(src + l.col_scale_offset + 2 * j)) : 0.0f;
    const float vj = LoadIn(p.dtype, stage + kFsV, j);
    __syncthreads();

    // Decode this thread's rows of the column (StepDecodeHead).
    float s[kRows];
    const uint32_t* words = reinterpret_cast<const uint32_t*>(src);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = row0 + i;
      const float4 d = LoadRecord(tab_dec + r);
      const int word0 = __float_as_int(d.x);
      if (r < pivots) {
        s[i] = HalfBitsToFloat(*reinterpret_cast<const uint16_t*>(src + 4 * word0 + 2 * j));
      } else {
        const int b = __float_as_int(d.y);
        const int bit = j * b;
        const int w = word0 + (bit >> 5);
        // The funnel shift takes the shift modulo 32.
        const uint32_t u = __funnelshift_r(words[w], words[w + 1], bit);
        const int z = static_cast<int>(u << (32 - b)) >> (32 - b);
        s[i] = StepDecodeValue(z, d.z, cj, d.w);
      }
    }
    __syncthreads();  // the stage is consumed: fetch the item after next into it
    if (t == 0 && next < items) FastIssue(p, stage, &bars[st], next);

    // Recurrence (HeadStep's order: decay and S^T k over rows, delta, update
    // and S^T q over rows).
    //
    // Scheduling fences: every kFenceRows rows the running sum is stored to
    // shared memory before a warp barrier (memory operations do not cross
    // it), so the next rows' record loads wait for the chain instead of being
    // hoisted above it (which would hold up to 128 rows of records in
    // registers next to the column). The code buffer is free here (read by
    // the previous item's pack, written after two more barriers).
    constexpr int kFenceRows = 32;
    float* const fence = reinterpret_cast<float*>(codebuf);
    float oj = 0.0f;
    if constexpr (kHalves == 1) {
      float kv = 0.0f;
#pragma unroll
      for (int r = 0; r < kFastDim; ++r) {
        if (r > 0 && r % kFenceRows == 0) {
          fence[t] = kv;
          __syncwarp();
        }
        const float4 e = LoadRecord(tab_rec + r);
        const float x = s[r] * e.y;
        s[r] = x;
        kv = fmaf(e.x, x, kv);
      }
      const float delta = beta * (vj - kv);
#pragma unroll
      for (int r = 0; r < kFastDim; ++r) {
        if (r % kFenceRows == 0) {
          fence[t] = r == 0 ? delta : oj;
          __syncwarp();
        }
        const float4 e = LoadRecord(tab_rec + r);
        const float x = fmaf(e.x, delta, s[r]);
        s[r] = x;
        oj = fmaf(e.z, x, oj);
      }
    } else {
      // Decay in both halves; the S^T k chain over rows 0-63 (half 0), then
      // 64-127 (half 1) from half 0's running sum.
#pragma unroll
      for (int i = 0; i < kRows; ++i) s[i] = s[i] * LoadRecord(tab_rec + row0 + i).y;
      float kv = 0.0f;
      if (half == 0) {
#pragma unroll
        for (int i = 0; i < kRows; ++i) kv = fmaf(LoadRecord(tab_rec + i).x, s[i], kv);
      }
      const float kv_lo = __shfl_xor_sync(kAll, kv, 16);
      if (half == 1) {
        kv = kv_lo;
#pragma unroll
        for (int i = 0; i < kRows; ++i) kv = fmaf(LoadRecord(tab_rec + kRows + i).x, s[i], kv);
      }
      const float kv_hi = __shfl_xor_sync(kAll, kv, 16);
      const float delta = beta * (vj - (half == 1 ? kv : kv_hi));
#pragma unroll
      for (int i = 0; i < kRows; ++i) s[i] = fmaf(LoadRecord(tab_rec + row0 + i).x, delta, s[i]);
      if (half == 0) {
#pragma unroll
        for (int i = 0; i < kRows; ++i) oj = fmaf(LoadRecord(tab_rec + i).z, s[i], oj);
      }
      const float o_lo = __shfl_xor_sync(kAll, oj, 16);
      if (half == 1) {
        oj = o_lo;
#pragma unroll
        for (int i = 0; i < kRows; ++i) oj = fmaf(LoadRecord(tab_rec + kRows + i).z, s[i], oj);
      }
    }
    if (o != nullptr && half == kHalves - 1) o[j] = oj;

    // Encode (StepEncodeHead). 1. Column absmax over the integer rows.
    float nmax = 0.0f;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      if (row0 + i >= pivots) nmax = fmaxf(nmax, fabsf(s[i]));
    }
    if constexpr (kHalves == 2) nmax = fmaxf(nmax, __shfl_xor_sync(kAll, nmax, 16));
    const float c0 = HalfBitsToFloat(StepScaleBits(nmax));
    const float inv_c = StepInvColumn(c0);
    // 2. Row maxima in column-normalized units: per 16-row chunk a max
    // reduce-scatter over the lanes holding those rows, then over the warps.
#pragma unroll
    for (int ch = 0; ch < kRows / 16; ++ch) {
      float x[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) x[i] = fabsf(s[ch * 16 + i]) * inv_c;
      if constexpr (kHalves == 1) {
        const float m = RowMaxScatter16<32>(x, lane);
        if ((lane & 1) == 0) red[warp * kFastDim + ch * 16 + (lane >> 1)] = m;
      } else {
        red[warp * kFastDim + row0 + ch * 16 + (lane & 15)] = RowMaxScatter16<16>(x, lane);
      }
    }
    __syncthreads();
    if (t < kFastDim) {
      const int r = t;
      if (r >= pivots) {
        float m = red[r];
        for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w * kFastDim + r]);
        const uint16_t rbits = StepScaleBits(m);
        const float rf = HalfBitsToFloat(rbits);
        StoreU16(head + l.row_scale_offset + 2 * (r - pivots), rbits);
        float4 e = tab_enc[r];
        e.x = StepRowMultiplier(rf, __float_as_int(tab_dec[r].y));
        e.y = rf;
        tab_enc[r] = e;
      }
    }
    __syncthreads();
    // 3-4. Codes (to the shared buffer), pivots (stored), and the weighted
    // column sums in stored row order with the 64-row chunk partials (with
    // two halves, each thread's rows are one chunk; half 0 adds half 1's).
    float num = 0.0f, den = 0.0f, pnum = 0.0f, pden = 0.0f;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = row0 + i;
      if (r % kStepReduceRows == 0) pnum = pden = 0.0f;
      if (r < pivots) {
        *reinterpret_cast<uint16_t*>(head + 4 * __float_as_int(LoadRecord(tab_dec + r).x) + 2 * j) =
            FloatToHalfBits(s[i]);
      } else {
        const int b = __float_as_int(LoadRecord(tab_dec + r).y);
        const float4 e = LoadRecord(tab_enc + r);
        const float x = s[i];
        const int z = StepEncodeValue(x, inv_c, e.x, b);
        codebuf[r * kFastDim + j] = static_cast<int8_t>(z);
        const float zn = static_cast<float>(z) * e.w;
        const float a = e.y * zn;
        const float wa = e.z * a;
        pnum = fmaf(wa, x, pnum);
        pden = fmaf(wa, a, pden);
      }
      if (r % kStepReduceRows == kStepReduceRows - 1 || r == kFastDim - 1) {
        num = num + pnum;
        den = den + pden;
      }
    }
    if constexpr (kHalves == 2) {
      static_assert(kRows == kStepReduceRows, "one reduction chunk per half");
      const float num_hi = __shfl_xor_sync(kAll, num, 16);
      const float den_hi = __shfl_xor_sync(kAll, den, 16);
      num = num + num_hi;  // half 0: (0 + p0) + p1
      den = den + den_hi;
    }
    if (has_int && half == 0) {
      const float c = (num > 0.0f && den > 0.0f) ? num / den : c0;
      StoreU16(head + l.col_scale_offset + 2 * j, StepScaleBits(c));
    }
    // Section padding is zero (the reference zero-fills the head).
    if (t < 16) {
      auto zero = [&](int64_t from, int64_t to) {
        if (from + t < to) head[from + t] = 0;
      };
      zero(int64_t{pivots} * kFastDim * 2, l.codes_offset);
      if (has_int) {
        zero(l.codes_offset + l.code_bytes, l.row_scale_offset);
        zero(l.row_scale_offset + 2LL * l.int_rows(), l.col_scale_offset);
        zero(l.col_scale_offset + 2LL * kFastDim, l.head_bytes);
      }
    }
    __syncthreads();
    // Pack: task = (row, 8-column segment) -> b bytes of the row stream.
    for (int task = t; task < kFastDim * (kFastDim / 8); task += kThreads) {
      const int r = task >> 4;
      const int seg = task & 15;
      if (r < pivots) continue;
      const float4 d = LoadRecord(tab_dec + r);
      const int b = __float_as_int(d.y);
      const uint2 raw = *reinterpret_cast<const uint2*>(codebuf + r * kFastDim + seg * 8);
      const uint64_t codes = (static_cast<uint64_t>(raw.y) << 32) | raw.x;
      const uint64_t mask = (uint64_t{1} << b) - 1;
      uint64_t packed = 0;
#pragma unroll
      for (int c = 0; c < 8; ++c) packed |= ((codes >> (8 * c)) & mask) << (c * b);
      StoreCodeBytes(head + 4 * __float_as_int(d.x) + seg * b, packed, b);
    }
    __syncthreads();  // the table and code buffer are reused by the next item
  }
}

}  // namespace

bool StepFastDecodeEligible(const StepKernelParams& p) {
  auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  if (p.tokens != 1 || p.d_k != kFastDim || p.d_v != kFastDim) return false;
  if (p.heads == nullptr || p.head_offsets == nullptr || p.h_qk < 1 || p.h_v % p.h_qk != 0) {
    return false;
  }
  if (!aligned(p.pool_base) || p.slot_stride % 16 != 0) return false;
  for (const void* ptr : {p.q, p.k, p.v, static_cast<const void*>(p.key_perm),
                          static_cast<const void*>(p.row_impact)}) {
    if (!aligned(ptr)) return false;
  }
  return !p.kda || aligned(p.g);
}

// Shared-memory opt-in and the persistent grid size, once per process (one
// device; the host calls would otherwise cost microseconds per launch).
template <int kHalves, int kMinBlocks>
int LaunchFastT(const StepKernelParams& p, int64_t items, void* stream) {
  constexpr int kThreads = kFastDim * kHalves;
  static const int grid_cap = []() -> int {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaFuncSetAttribute(StepFastDecodeKernel<kHalves, kMinBlocks>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kFastSmemBytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, StepFastDecodeKernel<kHalves, kMinBlocks>, kThreads, kFastSmemBytes) !=
            cudaSuccess) {
      return -1;
    }
    return per_sm * sms;
  }();
  if (grid_cap < 1) return static_cast<int>(cudaErrorInvalidConfiguration);
  const int64_t grid = std::min<int64_t>(items, grid_cap);
  StepFastDecodeKernel<kHalves, kMinBlocks><<<static_cast<unsigned>(grid), kThreads,
                                              kFastSmemBytes, static_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

int LaunchStepFastDecode(const StepKernelParams& p, StepQuantVariant v, void* stream) {
  const int64_t items = int64_t{p.batch} * p.h_v;
  if (items == 0) return 0;
  if (v == StepQuantVariant::kC3) return LaunchFastT<1, 3>(p, items, stream);
  if (v == StepQuantVariant::kC2) return LaunchFastT<1, 2>(p, items, stream);
  if (v == StepQuantVariant::kH2 || !StepTileDecodeEligible(p)) {
    return LaunchFastT<2, 2>(p, items, stream);
  }
  return LaunchStepTileDecode(p, stream);
}

}  // namespace cuda_internal
}  // namespace statecache
