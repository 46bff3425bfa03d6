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
#include "kernels/cuda/internal/stepquant_device.cuh"
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

// StepRecurrenceKernel: p.tokens recurrence steps of one (batch item, value
// head) per CTA; the CPU backend's bytes.
//   p       StepKernelParams (stepquant_params.h): slots [batch] (-1: o
//           zeroed, pool untouched); q, k [batch, tokens, h_qk, d_k]; v
//           [batch, tokens, h_v, d_v]; g [batch, tokens, h_v] (GDN) or
//           [.., h_v, d_k] (KDA); beta [batch, tokens, h_v]; o or nullptr;
//           heads at head_offsets[layer * h_v + h] of a slot, layouts heads[].
//   grid    batch * h_v CTAs of kThreads threads.
//   smem    SharedBytesFor(d_k, d_v) dynamic (StepShared: the FP32 head and
//           its row / column tables).
//   sync    CTA barriers between decode, recurrence phases and encode.
//   trusts  the binding's checks; exits without writing when the
//           validation block p.abort_if_error is set.
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
  uint8_t* head = p.pool_base + slot * p.slot_stride + p.head_offsets[hi];
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

// StepPackKernel: pack (kPack): natural-order states -> packed heads;
// unpack: back (zeros for slot -1).
//   p       StepKernelParams: n entries of slots [n]; states
//           [n][layers][h_v][d_k][d_v] (natural key order).
//   grid    n * layers * h_v CTAs of kThreads threads, one per (entry,
//           layer, head); smem as StepRecurrenceKernel's.
//   trusts  the binding's checks (slots, finite bounded states); exits
//           without writing when p.abort_if_error is set.
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
  uint8_t* head = p.pool_base + slot * p.slot_stride + p.head_offsets[hi];
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
