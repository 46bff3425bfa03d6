// RecurrenceKernel: the one-CTA-per-item fused kernel (prefill, and the
// decode steps the persistent kernels do not take). recurrence_kernels.cuh
// lists the kernels; the launch: recurrence_launch.cuh.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_DIRECT_KERNEL_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_DIRECT_KERNEL_CUH_

#include "kernels/cuda/internal/recurrence_common.cuh"

namespace statecache {
namespace cuda_internal {
namespace {

// RecurrenceKernel<F, kFixed>: p.tokens recurrence steps of one (batch item,
// value head) per CTA with direct global loads: dequantize (token 0's decay
// folded in), TokenStep per token (decode_math.h), readout, requantize in
// place.
//   p       RecurrenceParams (kernel_params.h): slots [batch] (-1: the item
//           writes zeros to o and leaves the pool alone); q, k
//           [batch, tokens, h_qk, d_k]; v [batch, tokens, h_v, d_v]; g
//           [batch, tokens, h_v] (GDN) or [batch, tokens, h_v, d_k] (KDA);
//           beta [batch, tokens, h_v]; o [batch, tokens, h_v, d_v] or
//           nullptr; heads in p.pool with layout p.geo.layout.
//   kFixed  the 128 x 128 fixed-shape head layout (FixedShapeHeadLayout).
//   grid    batch * h_v CTAs of MakeDecodeTiling(d_k, d_v).threads threads
//           (at most kMaxTileThreads).
//   smem    ScratchFloats(tiling, d_v) floats of dynamic shared memory (the
//           row-sum exchange, StepScratch).
//   sync    CTA barriers inside TokenStep; launched plainly (starts after
//           the stream's previous kernel completed).
//   trusts  the binding's checks (shapes, slots in range and distinct,
//           finite inputs); exits without writing when the validation block
//           p.abort_if_error is set.
template <StateFormat F, bool kFixed>
__global__ void __launch_bounds__(kMaxTileThreads, 2) RecurrenceKernel(const RecurrenceParams p) {
  extern __shared__ float smem[];
  const HeadGeometry geo = EffectiveGeometry<F, kFixed>(p.geo);
  const PackedHeadLayout& l = geo.layout;
  const DecodeTiling t = MakeDecodeTiling(geo.d_k, geo.d_v);
  if (ValidationFailed(p)) return;
  const int b = blockIdx.x / geo.h_v;
  const int h = blockIdx.x % geo.h_v;
  const int32_t slot = p.slots[b];
  const LaneMap m = MakeLaneMap<LaneWidth<F>()>(t.stripes);
  constexpr ValueTransform kVt = ValueTransformOf(F);

  if (slot < 0) {  // skipped item: o is zeroed, the pool is untouched
    if (p.o != nullptr && m.row_warp == 0) {
      for (int tok = 0; tok < p.tokens; ++tok) {
        const int64_t row = int64_t{b} * p.tokens + tok;
        p.o[(row * geo.h_v + h) * geo.d_v + m.jc] = 0.0f;
      }
    }
    return;
  }
  uint8_t* head = HeadPtr(p, geo, slot, h);
  const float global_scale =
      l.has_global_scale ? *reinterpret_cast<const float*>(head + l.global_offset) : 0.0f;
  // The head is decoded with token 0's decay folded in (decode_math.h).
  float s[kTileSteps][kTileColsPerLane];
  if (p.tokens == 0) LoadTile<F>(l, head, m, global_scale, s);

  const int kh = h / (geo.h_v / geo.h_qk);
  const bool reorder = kVt == ValueTransform::kScaleReorder;
  const int32_t* perm =
      p.maps.key_perm != nullptr ? p.maps.key_perm + int64_t{h} * geo.d_k : nullptr;
  const int32_t* vorder = reorder ? p.maps.value_order + int64_t{h} * geo.d_v : nullptr;
  const float* vscale = reorder ? p.maps.value_scale + int64_t{h} * geo.d_v : nullptr;
  const int ds = p.dtype == 0 ? 4 : 2;

  for (int tok = 0; tok < p.tokens; ++tok) {
    const int64_t row = int64_t{b} * p.tokens + tok;
    const int64_t qk_base = (row * geo.h_qk + kh) * geo.d_k;
    const int64_t v_base = (row * geo.h_v + h) * geo.d_v;
    const int64_t gh = row * geo.h_v + h;
    float kk[kTileSteps], qs[kTileSteps], a[kTileSteps];
    const RowSource in{perm,
                       static_cast<const uint8_t*>(p.q) + qk_base * ds,
                       static_cast<const uint8_t*>(p.k) + qk_base * ds,
                       p.g + gh * geo.d_k,  // read only for KDA
                       perm != nullptr,
                       geo.kda,
                       false,
                       p.dtype,
                       geo.kda ? 0.0f : DecayExp(p.g[gh]),
                       geo.scale};
    GatherRows(m, geo.d_k, in, kk, qs, a);
    if (tok == 0) {
      LoadTile<F>(l, head, m, global_scale, s, a);
#pragma unroll
      for (int i = 0; i < kTileSteps; ++i) a[i] = 1.0f;  // applied: x * 1 is exact
    }
    const float vp = StoredValue<kVt>(m, p.dtype, static_cast<const uint8_t*>(p.v) + v_base * ds,
                                      vorder, vscale);
    const StepScratch sc = MakeScratch(smem, t, geo.d_v, m, tok & 1);
    const float os = TokenStep(s, kk, qs, a, vp, p.beta[gh], m, t, geo.d_v, sc);
    if (p.o != nullptr && m.row_warp == 0) StoreOutput<kVt>(m, os, p.o + v_base, vorder, vscale);
  }

  const float gs = TileGlobalScale<F>(l, m, s, GlobalScaleScratch(smem, t, geo.d_v), t.warps);
  StoreTile<F>(l, head, m, gs, s);
  if (l.has_global_scale && threadIdx.x == 0) {
    *reinterpret_cast<float*>(head + l.global_offset) = gs;
  }
}

}  // namespace
}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_DIRECT_KERNEL_CUH_
