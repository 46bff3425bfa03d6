// Per-item helpers of the fused decode / prefill kernels
// (recurrence_kernels.cuh): token inputs by row, the value-axis map on v and
// o, the effective (fixed-shape) geometry, head addressing and the scratch
// carve-up. Device code only, internal linkage.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_COMMON_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_COMMON_CUH_

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/internal/async_copy.cuh"
#include "kernels/cuda/internal/grid_dependency.cuh"
#include "kernels/cuda/internal/kernel_params.h"
#include "kernels/cuda/internal/stage_layout.h"
#include "kernels/cuda/internal/tile_common.cuh"
#include "kernels/cuda/internal/validation_block.cuh"

namespace statecache {
namespace cuda_internal {
namespace {

// Per-row inputs of one token for the lane's rows, from q/k/g arrays indexed
// by key channel (either global tensors offset to this token's key head, or
// the staged copies in shared memory).
// kDtype >= 0 fixes the input dtype at compile time (no per-load branches);
// -1 reads it from `dtype`.
template <int kDtype>
__device__ __forceinline__ float LoadInputT(int dtype, const void* p, int64_t i) {
  return LoadInput(kDtype >= 0 ? kDtype : dtype, p, i);
}

// Where one token's per-key-channel inputs of a head are (global tensors
// offset to the token's key head, or the staged copies in shared memory).
// has_perm / kda are flags rather than null tests of the pointers: a shared
// address tested against null costs a generic conversion per item.
struct RowSource {
  const int32_t* perm;  // stored row -> key channel (used when has_perm)
  const void* q;
  const void* k;
  const float* g;  // KDA per-channel gates, or their decays (used when kda)
  bool has_perm;
  bool kda;
  bool g_decayed;  // g holds DecayExp of the gates (the pipelined kernel's producers)
  int dtype;
  float a_head;  // GDN: exp(g) of the head
  float scale;
};

// Whether the staged KDA gates are raw (their DecayExp still to take).
__device__ __forceinline__ bool GatesRaw(const RowSource& in) { return in.kda && !in.g_decayed; }

// One stored row's inputs {k, scale * q, g, 0}, g as staged: the row's decay
// unless GatesRaw (then its raw gate; RowInput takes the decay).
template <int kDtype>
__device__ __forceinline__ float4 RowInputStaged(int r, const RowSource& in) {
  const int c = in.has_perm ? in.perm[r] : r;
  return make_float4(LoadInputT<kDtype>(in.dtype, in.k, c),
                     in.scale * LoadInputT<kDtype>(in.dtype, in.q, c),
                     in.kda ? in.g[c] : in.a_head, 0.0f);
}

// One stored row's inputs {k, scale * q, a, 0} (a: the row's decay).
template <int kDtype>
__device__ __forceinline__ float4 RowInput(int r, const RowSource& in) {
  float4 x = RowInputStaged<kDtype>(r, in);
  if (GatesRaw(in)) x.z = DecayExp(x.z);
  return x;
}

template <int kDtype = -1>
__device__ __forceinline__ void GatherRows(const LaneMap& m, int d_k, const RowSource& in,
                                           float (&kk)[kTileSteps], float (&qs)[kTileSteps],
                                           float (&a)[kTileSteps]) {
#pragma unroll
  for (int i = 0; i < kTileSteps; ++i) {
    const int r = m.row(i);
    const float4 x = r < d_k ? RowInput<kDtype>(r, in) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    kk[i] = x.x;
    qs[i] = x.y;
    a[i] = x.z;
  }
}

// GatherRows for the pipelined kernel: the lane pair converts its 4 rows
// once (lane cl takes steps cl and cl + 2) into the warp's shared `rows`,
// then both lanes read all 4 (same values and arithmetic as GatherRows).
// No leading __syncwarp: the kernel's previous item released its stage
// (release(): a __syncwarp) after this warp's last reads of `rows`.
template <int kDtype, bool kAllRows>
__device__ __forceinline__ void GatherRowsPaired(const LaneMap& m, int d_k, const RowSource& in,
                                                 float4* rows, float (&kk)[kTileSteps],
                                                 float (&qs)[kTileSteps],
                                                 float (&a)[kTileSteps]) {
  float4 x[kTileSteps / 2];
#pragma unroll
  for (int j = 0; j < kTileSteps / 2; ++j) {
    const int r = m.row(m.cl + 2 * j);
    x[j] = (kAllRows || r < d_k) ? RowInputStaged<kDtype>(r, in)
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  // Raw gates (the first items of a CTA): one branch for both rows, not a
  // divergence region per row around DecayExp.
  if (GatesRaw(in)) {
#pragma unroll
    for (int j = 0; j < kTileSteps / 2; ++j) {
      if (kAllRows || m.row(m.cl + 2 * j) < d_k) x[j].z = DecayExp(x[j].z);
    }
  }
#pragma unroll
  for (int j = 0; j < kTileSteps / 2; ++j) rows[(m.cl + 2 * j) * kTileRowsPerStep + m.rl] = x[j];
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kTileSteps; ++i) {
    const float4 x = rows[i * kTileRowsPerStep + m.rl];
    kk[i] = x.x;
    qs[i] = x.y;
    a[i] = x.z;
  }
}

// v' = M^T v at the lane's reduced column (v indexed by value channel).
template <ValueTransform kVt, int kDtype = -1>
__device__ __forceinline__ float StoredValue(const LaneMap& m, int dtype, const void* v,
                                             const int32_t* order, const float* scale) {
  if constexpr (kVt == ValueTransform::kScaleReorder) {
    const int oj = order[m.jc];
    return LoadInputT<kDtype>(dtype, v, oj) / scale[oj];
  } else {
    float x = LoadInputT<kDtype>(dtype, v, m.jc);
    if constexpr (kVt == ValueTransform::kHadamard32) x = StripeHadamard(x, m.c32);
    return x;
  }
}

// o = M^-T o' (all lanes of row warp 0 call it; o indexed by value channel).
template <ValueTransform kVt>
__device__ __forceinline__ void StoreOutput(const LaneMap& m, float os, float* o,
                                            const int32_t* order, const float* scale) {
  if constexpr (kVt == ValueTransform::kScaleReorder) {
    const int oj = order[m.jc];
    o[oj] = os * scale[oj];
  } else if constexpr (kVt == ValueTransform::kHadamard32) {
    o[m.jc] = StripeHadamard(os, m.c32);
  } else {
    o[m.jc] = os;
  }
}

// The geometry a kernel instantiation sees: kFixed pins d_k = d_v = 128 and
// the default k_hi, so the packed layout and the tiling fold to constants
// (the common model shape; other shapes use the runtime instantiation).
template <StateFormat F, bool kFixed>
__device__ __forceinline__ HeadGeometry EffectiveGeometry(const HeadGeometry& in) {
  HeadGeometry g = in;
  if constexpr (kFixed) {
    g.d_k = 128;
    g.d_v = 128;
    g.layout = FixedShapeHeadLayout(F);
  }
  return g;
}

// n / d for the pipelined kernel's index math: a shift when d is a power of
// two (`shift` = log2 d: the common head counts), else a division (~20
// instructions).
__device__ __forceinline__ int DivIndex(int n, int d, int shift) {
  return shift >= 0 ? n >> shift : n / d;
}
__device__ __forceinline__ int Log2IfPow2(int d) { return (d & (d - 1)) == 0 ? __ffs(d) - 1 : -1; }
// The batch item of a (batch item, value head) index of h_v heads each.
__device__ __forceinline__ int BatchOf(int head_item, int h_v) {
  return DivIndex(head_item, h_v, Log2IfPow2(h_v));
}

__device__ __forceinline__ uint8_t* HeadPtr(const RecurrenceParams& p, const HeadGeometry& geo,
                                           int32_t slot, int h) {
  return p.pool.base + slot * p.pool.slot_stride +
         (int64_t{p.layer} * geo.h_v + h) * geo.layout.head_bytes;
}

__device__ __forceinline__ StepScratch MakeScratch(float* base, const DecodeTiling& t, int d_v,
                                                   const LaneMap& m, int parity) {
  const int64_t per = ScratchPer(t, d_v);
  float* p = base + parity * per;
  StepScratch sc;
  sc.red_k = p;
  sc.red_q = p + t.row_warps * d_v;
  sc.red_v = p + 2 * t.row_warps * d_v;
  sc.red_qk = p + (2 * t.row_warps + 1) * d_v;
  sc.wbuf = base + 2 * per + m.warp * 32;
  sc.wred = base + WarpScratchOffset(t, d_v) + int64_t{m.warp} * kWarpScratchFloats;
  return sc;
}
// The warp's staged row inputs (after its reduce-scatter buffer).
__device__ __forceinline__ float4* WarpRows(float* base, const DecodeTiling& t, int d_v,
                                            const LaneMap& m) {
  return reinterpret_cast<float4*>(base + WarpScratchOffset(t, d_v) +
                                   int64_t{m.warp} * kWarpScratchFloats + kWarpReduceFloats);
}
__device__ __forceinline__ float* GlobalScaleScratch(float* base, const DecodeTiling& t, int d_v) {
  return base + 2 * ScratchPer(t, d_v) + t.warps * 32;
}

// True when the binding's validation found an error (nothing may be written).
__device__ __forceinline__ bool ValidationFailed(const RecurrenceParams& p) {
  return ValidationBlockFailed(p.abort_if_error);
}

}  // namespace
}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_COMMON_CUH_
