// STEPQuant (stepquant-6 / stepquant-4) CUDA kernels: fused decode / prefill
// and pack / unpack over packed heads of per-head sizes (issue 9; design note
// in kernels/stepquant/README.md, contract in stepquant_params.h).
//
// One CTA (kThreads threads) per (batch item or slot entry, value head). The
// head is decoded cooperatively into shared memory as FP32 [d_k][d_v] (stored
// row order), the recurrence runs one thread per value column, and the head is
// re-encoded with the shared element functions of stepquant_codec.h:
//   column absmax  one thread per column (order-free max)
//   row scale and codes  one thread per integer row (its own code bytes)
//   column least squares one thread per column, stored rows in order with the
//                  64-row chunk partials of the reference (exact)
// The decays are GlibcExpf (glibc_expf.h), bit-equal to the CPU's std::exp.
// Built with --fmad=false: only explicit fmaf() is fused.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/glibc_expf.h"
#include "kernels/cuda/internal/async_copy.cuh"
#include "kernels/cuda/internal/kernel_params.h"
#include "kernels/cuda/internal/stepquant_params.h"
#include "kernels/cuda/internal/validation_block.cuh"
#include "kernels/formats/numeric.h"
#include "kernels/formats/packed_bytes.h"
#include "kernels/formats/stepquant_codec.h"

namespace statecache {
namespace cuda_internal {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxSharedBytes = 227 * 1024;

// Shared-memory carve-up of one CTA.
struct StepShared {
  float* w;        // [d_k][d_v] working state, stored order
  float* q;        // [d_k] scale * q, stored order
  float* k;        // [d_k]
  float* a;        // [d_k] decay per stored row
  float* rf;       // [d_k] decoded row scales (0 for pivots)
  float* mult;     // [d_k] row multipliers Q_b / r
  float* v;        // [d_v]
  float* c;        // [d_v] column scales (decode), c0 (encode)
  float* inv_c;    // [d_v]
  int* bits;       // [d_k] row widths
  int* code_off;   // [d_k] code byte offset from codes_offset (integer rows)
};

__host__ __device__ int64_t SharedBytesFor(int d_k, int d_v) {
  return 4 * (int64_t{d_k} * d_v + 5LL * d_k + 3LL * d_v + 2LL * d_k);
}

__device__ StepShared CarveShared(float* base, int d_k, int d_v) {
  StepShared s;
  s.w = base;
  float* p = base + d_k * d_v;
  s.q = p; p += d_k;
  s.k = p; p += d_k;
  s.a = p; p += d_k;
  s.rf = p; p += d_k;
  s.mult = p; p += d_k;
  s.v = p; p += d_v;
  s.c = p; p += d_v;
  s.inv_c = p; p += d_v;
  s.bits = reinterpret_cast<int*>(p);
  s.code_off = s.bits + d_k;
  return s;
}

__device__ bool Aborted(const int32_t* errors) { return ValidationBlockFailed(errors); }

__device__ float LoadIn(int dtype, const void* p, int64_t i) {
  if (dtype == 0) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  if (dtype == 1) return __uint_as_float(static_cast<uint32_t>(b) << 16);
  return HalfBitsToFloat(b);
}

// Row widths and code offsets of head layout `l` into s.bits / s.code_off.
__device__ void LoadRowTable(const StepHeadLayout& l, const StepShared& s) {
  for (int r = threadIdx.x; r < l.d_k; r += blockDim.x) {
    s.bits[r] = l.RowBits(r);
    s.code_off[r] = r < l.pivot_rows ? 0 : static_cast<int>(l.RowCodeOffset(r));
  }
}

// StepDecodeHead, cooperatively: head -> s.w. Needs LoadRowTable first.
__device__ void DecodeHeadBlock(const StepHeadLayout& l, const uint8_t* head,
                                const StepShared& s) {
  const int d_k = l.d_k, d_v = l.d_v;
  const bool has_int = l.int_rows() > 0;
  for (int r = threadIdx.x; r < d_k; r += blockDim.x) {
    s.rf[r] = (has_int && r >= l.pivot_rows)
                  ? HalfBitsToFloat(LoadU16(head + l.row_scale_offset + 2LL * (r - l.pivot_rows)))
                  : 0.0f;
  }
  for (int j = threadIdx.x; j < d_v; j += blockDim.x) {
    s.c[j] = has_int ? HalfBitsToFloat(LoadU16(head + l.col_scale_offset + 2LL * j)) : 0.0f;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < d_k * d_v; i += blockDim.x) {
    const int r = i / d_v, j = i % d_v;
    if (r < l.pivot_rows) {
      s.w[i] = HalfBitsToFloat(LoadU16(head + l.pivot_offset + 2LL * i));
    } else {
      const int b = s.bits[r];
      const int z = StepLoadCode(head + l.codes_offset + s.code_off[r], j, b);
      s.w[i] = StepDecodeValue(z, s.rf[r], s.c[j], StepInvQ(b));
    }
  }
  __syncthreads();
}

// StepEncodeHead, cooperatively: s.w -> head (l.head_bytes, zero-filled
// first). `impact` [d_k] (stored order) or nullptr. Needs LoadRowTable first.
__device__ void EncodeHeadBlock(const StepHeadLayout& l, const float* impact, const StepShared& s,
                                uint8_t* head) {
  const int d_k = l.d_k, d_v = l.d_v;
  for (int64_t i = threadIdx.x; i < l.head_bytes; i += blockDim.x) head[i] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < l.pivot_rows * d_v; i += blockDim.x) {
    StoreU16(head + l.pivot_offset + 2LL * i, FloatToHalfBits(s.w[i]));
  }
  if (l.int_rows() == 0) return;
  // 1. Column absmax over the integer rows -> c0, 1 / c0.
  for (int j = threadIdx.x; j < d_v; j += blockDim.x) {
    float m = 0.0f;
    for (int r = l.pivot_rows; r < d_k; ++r) m = fmaxf(m, fabsf(s.w[r * d_v + j]));
    s.c[j] = HalfBitsToFloat(StepScaleBits(m));
    s.inv_c[j] = StepInvColumn(s.c[j]);
  }
  __syncthreads();
  // 2-3. Row scales and codes, one thread per integer row.
  for (int r = l.pivot_rows + threadIdx.x; r < d_k; r += blockDim.x) {
    const float* x = s.w + r * d_v;
    const int b = s.bits[r];
    float m = 0.0f;
    for (int j = 0; j < d_v; ++j) {
      const float t = fabsf(x[j]) * s.inv_c[j];
      m = fmaxf(m, t);
    }
    const uint16_t r_bits = StepScaleBits(m);
    const float rf = HalfBitsToFloat(r_bits);
    StoreU16(head + l.row_scale_offset + 2LL * (r - l.pivot_rows), r_bits);
    s.rf[r] = rf;
    s.mult[r] = StepRowMultiplier(rf, b);
    uint8_t* codes = head + l.codes_offset + s.code_off[r];
    for (int j = 0; j < d_v; ++j) {
      StepStoreCode(codes, j, b, StepEncodeValue(x[j], s.inv_c[j], s.mult[r], b));
    }
  }
  __syncthreads();
  // 4. Weighted least-squares column scales with the fixed codes, one thread
  // per column, stored rows in order, 64-row chunk partials.
  for (int j = threadIdx.x; j < d_v; j += blockDim.x) {
    float num = 0.0f, den = 0.0f, pnum = 0.0f, pden = 0.0f;
    for (int r = 0; r < d_k; ++r) {
      if (r % kStepReduceRows == 0) pnum = pden = 0.0f;
      if (r >= l.pivot_rows) {
        const int b = s.bits[r];
        const float x = s.w[r * d_v + j];
        const int z = StepEncodeValue(x, s.inv_c[j], s.mult[r], b);
        const float zn = static_cast<float>(z) * StepInvQ(b);
        const float a = s.rf[r] * zn;
        const float wi = impact != nullptr ? impact[r] : 1.0f;
        const float ww = wi * wi;
        const float wa = ww * a;
        pnum = fmaf(wa, x, pnum);
        pden = fmaf(wa, a, pden);
      }
      if (r % kStepReduceRows == kStepReduceRows - 1 || r == d_k - 1) {
        num = num + pnum;
        den = den + pden;
      }
    }
    const float cj = (num > 0.0f && den > 0.0f) ? num / den : s.c[j];
    StoreU16(head + l.col_scale_offset + 2LL * j, StepScaleBits(cj));
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) StepRecurrenceKernel(StepKernelParams p) {
  if (Aborted(p.abort_if_error)) return;
  extern __shared__ float smem[];
  const int b = blockIdx.x / p.h_v;
  const int h = blockIdx.x % p.h_v;
  const int d_k = p.d_k, d_v = p.d_v;
  const int32_t slot = p.slots[b];
  if (slot < 0) {
    if (p.o != nullptr) {
      for (int t = 0; t < p.tokens; ++t) {
        float* o = p.o + ((int64_t{b} * p.tokens + t) * p.h_v + h) * d_v;
        for (int j = threadIdx.x; j < d_v; j += blockDim.x) o[j] = 0.0f;
      }
    }
    return;
  }
  const StepShared s = CarveShared(smem, d_k, d_v);
  const int64_t hi = int64_t{p.layer} * p.h_v + h;
  const StepHeadLayout l = p.heads[hi];
  uint8_t* head = p.pool_base + slot * p.slot_bytes + p.head_offsets[hi];
  const int32_t* perm = p.key_perm != nullptr ? p.key_perm + hi * d_k : nullptr;
  LoadRowTable(l, s);
  __syncthreads();
  DecodeHeadBlock(l, head, s);
  const int kh = h / (p.h_v / p.h_qk);
  const int gate_width = p.kda ? d_k : 1;
  for (int t = 0; t < p.tokens; ++t) {
    const int64_t row = int64_t{b} * p.tokens + t;
    const int64_t qk_off = (row * p.h_qk + kh) * d_k;
    const int64_t v_off = (row * p.h_v + h) * d_v;
    const int64_t g_off = (row * p.h_v + h) * gate_width;
    // Gather q, k, the decay (stored order) and v.
    const float gdn_decay = p.kda ? 0.0f : GlibcExpf(p.g[g_off]);
    for (int r = threadIdx.x; r < d_k; r += blockDim.x) {
      const int c = perm != nullptr ? perm[r] : r;
      s.q[r] = p.scale * LoadIn(p.dtype, p.q, qk_off + c);
      s.k[r] = LoadIn(p.dtype, p.k, qk_off + c);
      s.a[r] = p.kda ? GlibcExpf(p.g[g_off + c]) : gdn_decay;
    }
    for (int j = threadIdx.x; j < d_v; j += blockDim.x) s.v[j] = LoadIn(p.dtype, p.v, v_off + j);
    __syncthreads();
    const float beta = p.beta[row * p.h_v + h];
    for (int j = threadIdx.x; j < d_v; j += blockDim.x) {
      float kv = 0.0f;
      for (int r = 0; r < d_k; ++r) {
        const float x = s.w[r * d_v + j] * s.a[r];
        s.w[r * d_v + j] = x;
        kv = fmaf(s.k[r], x, kv);
      }
      const float delta = beta * (s.v[j] - kv);
      float o = 0.0f;
      for (int r = 0; r < d_k; ++r) {
        const float x = fmaf(s.k[r], delta, s.w[r * d_v + j]);
        s.w[r * d_v + j] = x;
        o = fmaf(s.q[r], x, o);
      }
      if (p.o != nullptr) p.o[(row * p.h_v + h) * d_v + j] = o;
    }
    __syncthreads();
  }
  EncodeHeadBlock(l, p.row_impact != nullptr ? p.row_impact + hi * d_k : nullptr, s, head);
}

// Pack (pack = true): natural-order states -> packed heads; unpack: back
// (zeros for slot -1). One CTA per (entry, layer, head).
template <bool kPack>
__global__ void __launch_bounds__(kThreads) StepPackKernel(StepKernelParams p) {
  if (Aborted(p.abort_if_error)) return;
  extern __shared__ float smem[];
  const int heads_per_slot = p.layers * p.h_v;
  const int i = blockIdx.x / heads_per_slot;
  const int hi = blockIdx.x % heads_per_slot;
  const int d_k = p.d_k, d_v = p.d_v;
  const int64_t values = int64_t{d_k} * d_v;
  float* states = p.states + int64_t{blockIdx.x} * values;
  const int32_t slot = p.slots[i];
  if (slot < 0) {
    if (!kPack) {
      for (int64_t e = threadIdx.x; e < values; e += blockDim.x) states[e] = 0.0f;
    }
    return;
  }
  const StepShared s = CarveShared(smem, d_k, d_v);
  const StepHeadLayout l = p.heads[hi];
  uint8_t* head = p.pool_base + slot * p.slot_bytes + p.head_offsets[hi];
  const int32_t* perm = p.key_perm != nullptr ? p.key_perm + int64_t{hi} * d_k : nullptr;
  LoadRowTable(l, s);
  __syncthreads();
  if (kPack) {
    for (int e = threadIdx.x; e < d_k * d_v; e += blockDim.x) {
      const int r = e / d_v, j = e % d_v;
      const int c = perm != nullptr ? perm[r] : r;
      s.w[e] = states[int64_t{c} * d_v + j];
    }
    __syncthreads();
    EncodeHeadBlock(l, p.row_impact != nullptr ? p.row_impact + int64_t{hi} * d_k : nullptr, s,
                    head);
  } else {
    DecodeHeadBlock(l, head, s);
    for (int e = threadIdx.x; e < d_k * d_v; e += blockDim.x) {
      const int r = e / d_v, j = e % d_v;
      const int c = perm != nullptr ? perm[r] : r;
      states[int64_t{c} * d_v + j] = s.w[e];
    }
  }
}


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
    const uint8_t* src = p.pool_base + slot * p.slot_bytes + p.head_offsets[hi];
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
// STATECACHE_STEPQUANT_VARIANT selects (A/B benchmarks): h2 (default, the
// fastest on the H200: kHalves 2, 2 CTAs, 128 registers), c2 (kHalves 1,
// 2 CTAs, 255 registers), c3 (kHalves 1, 3 CTAs, 168 registers).
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
    uint8_t* head = p.pool_base + slot * p.slot_bytes + p.head_offsets[hi];
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

template <typename Kernel>
int LaunchWith(Kernel kernel, const StepKernelParams& p, int64_t blocks, void* stream) {
  if (blocks == 0) return 0;
  const int64_t smem = SharedBytesFor(p.d_k, p.d_v);
  if (smem > kMaxSharedBytes) return static_cast<int>(cudaErrorInvalidValue);
  cudaError_t rc =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (rc != cudaSuccess) return static_cast<int>(rc);
  kernel<<<static_cast<unsigned>(blocks), kThreads, static_cast<size_t>(smem),
           static_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int64_t StepSharedBytes(int d_k, int d_v) { return SharedBytesFor(d_k, d_v); }

bool StepShapeSupported(int d_k, int d_v) {
  return d_k >= 1 && d_v >= 1 && d_k <= kStepMaxDim && d_v <= kStepMaxDim &&
         SharedBytesFor(d_k, d_v) <= kMaxSharedBytes;
}

bool StepFastDecodeEligible(const StepKernelParams& p) {
  auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  if (p.tokens != 1 || p.d_k != kFastDim || p.d_v != kFastDim) return false;
  if (p.heads == nullptr || p.head_offsets == nullptr || p.h_qk < 1 || p.h_v % p.h_qk != 0) {
    return false;
  }
  if (!aligned(p.pool_base) || p.slot_bytes % 16 != 0) return false;
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

int LaunchStepRecurrence(const StepKernelParams& p, const LaunchOptions& o, void* stream) {
  if (o.stepquant_fast && StepFastDecodeEligible(p)) {
    return LaunchStepFastDecode(p, o.stepquant_variant, stream);
  }
  return LaunchWith(StepRecurrenceKernel, p, int64_t{p.batch} * p.h_v, stream);
}

int LaunchStepPack(const StepKernelParams& p, void* stream) {
  return LaunchWith(StepPackKernel<true>, p, int64_t{p.n} * p.layers * p.h_v, stream);
}

int LaunchStepUnpack(const StepKernelParams& p, void* stream) {
  return LaunchWith(StepPackKernel<false>, p, int64_t{p.n} * p.layers * p.h_v, stream);
}

}  // namespace cuda_internal
}  // namespace statecache
