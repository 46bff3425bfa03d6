// The fused decode / prefill kernel: one CTA per (batch item, value head).
//
// Each lane keeps its 4 x 16 slice of the head in registers from the load to
// the store (the head is read once and written once): dequantize, then per
// token decay + S^T k (reduce-scatter over the warp's row lanes, then over the
// row warps through shared memory), delta, rank-1 update + S^T q, readout;
// after the last token requantize with fresh group parameters in place.
// The value-axis map runs once per head on v and o (DESIGN.md section 7), so
// the per-element work is the same for every format apart from the codec.
// The arithmetic is decode_math.h's ReferenceHeadStep, bit for bit.
#include <cuda_runtime.h>

#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/tile_common.cuh"

namespace statecache {
namespace cuda_internal {
namespace {

template <StateFormat F>
__global__ void __launch_bounds__(kMaxTileThreads, 2) RecurrenceKernel(const RecurrenceParams p) {
  extern __shared__ float smem[];
  const HeadGeometry& geo = p.geo;
  const PackedHeadLayout& l = geo.layout;
  const DecodeTiling t = MakeDecodeTiling(geo.d_k, geo.d_v);
  // smem: red_k [row_warps][d_v] | red_o [row_warps][d_v] | dbuf [warps][32] | red [warps]
  float* red_k = smem;
  float* red_o = red_k + t.row_warps * geo.d_v;
  float* dbuf = red_o + t.row_warps * geo.d_v;
  float* red = dbuf + t.warps * 32;

  const int b = blockIdx.x / geo.h_v;
  const int h = blockIdx.x % geo.h_v;
  const int32_t slot = p.slots[b];
  const LaneMap m = MakeLaneMap(t.stripes);

  if (slot < 0) {  // skipped item: o is zeroed, the pool is untouched
    if (p.o != nullptr && m.row_warp == 0) {
      for (int tok = 0; tok < p.tokens; ++tok) {
        const int64_t row = int64_t{b} * p.tokens + tok;
        p.o[(row * geo.h_v + h) * geo.d_v + m.jc] = 0.0f;
      }
    }
    return;
  }

  uint8_t* head = p.pool.base + slot * p.pool.slot_bytes +
                  (int64_t{p.layer} * geo.h_v + h) * l.head_bytes;
  const float global_scale = l.has_global_scale ? *reinterpret_cast<const float*>(head + l.global_offset) : 0.0f;

  float s[kTileSteps][kTileColsPerLane];
  LoadTile<F>(l, head, m, global_scale, s);

  const int kh = h / (geo.h_v / geo.h_qk);
  const int32_t* perm = p.maps.key_perm != nullptr ? p.maps.key_perm + int64_t{h} * geo.d_k : nullptr;
  constexpr ValueTransform kVt = ValueTransformOf(F);
  const int32_t* vorder = kVt == ValueTransform::kScaleReorder ? p.maps.value_order + int64_t{h} * geo.d_v : nullptr;
  const float* vscale = kVt == ValueTransform::kScaleReorder ? p.maps.value_scale + int64_t{h} * geo.d_v : nullptr;
  const int c32 = m.cl * 16 + m.rl;

  for (int tok = 0; tok < p.tokens; ++tok) {
    const int64_t row = int64_t{b} * p.tokens + tok;
    const int64_t qk_base = (row * geo.h_qk + kh) * geo.d_k;
    const int64_t v_base = (row * geo.h_v + h) * geo.d_v;
    const int64_t gh = row * geo.h_v + h;
    const float beta = p.beta[gh];
    float kk[kTileSteps], qs[kTileSteps], a[kTileSteps];
    const float a_head = geo.kda ? 0.0f : DecayExp(p.g[gh]);
#pragma unroll
    for (int i = 0; i < kTileSteps; ++i) {
      const int r = m.row(i);
      if (r < geo.d_k) {
        const int c = perm != nullptr ? perm[r] : r;
        kk[i] = LoadInput(p.dtype, p.k, qk_base + c);
        qs[i] = geo.scale * LoadInput(p.dtype, p.q, qk_base + c);
        a[i] = geo.kda ? DecayExp(p.g[gh * geo.d_k + c]) : a_head;
      } else {
        kk[i] = 0.0f;
        qs[i] = 0.0f;
        a[i] = 0.0f;
      }
    }
    // v' = M^T v for this lane's reduced column.
    float vp;
    if constexpr (kVt == ValueTransform::kScaleReorder) {
      const int oj = vorder[m.jc];
      vp = LoadInput(p.dtype, p.v, v_base + oj) / vscale[oj];
    } else {
      vp = LoadInput(p.dtype, p.v, v_base + m.jc);
      if constexpr (kVt == ValueTransform::kHadamard32) vp = StripeHadamard(vp, c32);
    }

    // Pass 1: decay and the S^T k partials.
    float part[kTileColsPerLane];
#pragma unroll
    for (int c = 0; c < kTileColsPerLane; ++c) part[c] = 0.0f;
#pragma unroll
    for (int i = 0; i < kTileSteps; ++i) {
#pragma unroll
      for (int c = 0; c < kTileColsPerLane; ++c) {
        s[i][c] = a[i] * s[i][c];
        part[c] = Fma(kk[i], s[i][c], part[c]);
      }
    }
    float ks = WarpReduceScatter16(part, m.lane);
    if (t.row_warps > 1) {
      red_k[m.row_warp * geo.d_v + m.jc] = ks;
      __syncthreads();
      ks = red_k[m.jc];
      for (int w = 1; w < t.row_warps; ++w) ks = ks + red_k[w * geo.d_v + m.jc];
    }
    const float db = beta * (vp - ks);
    // All-gather the 16 deltas of this lane's columns through shared memory.
    float* wbuf = dbuf + m.warp * 32;
    wbuf[c32] = db;
    __syncwarp();
    float d[kTileColsPerLane];
#pragma unroll
    for (int c4 = 0; c4 < 4; ++c4) {
      const float4 v4 = reinterpret_cast<const float4*>(wbuf + m.cl * 16)[c4];
      d[4 * c4] = v4.x;
      d[4 * c4 + 1] = v4.y;
      d[4 * c4 + 2] = v4.z;
      d[4 * c4 + 3] = v4.w;
    }

    // Pass 2: rank-1 update and the S^T q partials.
#pragma unroll
    for (int c = 0; c < kTileColsPerLane; ++c) part[c] = 0.0f;
#pragma unroll
    for (int i = 0; i < kTileSteps; ++i) {
#pragma unroll
      for (int c = 0; c < kTileColsPerLane; ++c) {
        s[i][c] = Fma(kk[i], d[c], s[i][c]);
        part[c] = Fma(qs[i], s[i][c], part[c]);
      }
    }
    float os = WarpReduceScatter16(part, m.lane);
    if (t.row_warps > 1) {
      red_o[m.row_warp * geo.d_v + m.jc] = os;
      __syncthreads();
      os = red_o[m.jc];
      for (int w = 1; w < t.row_warps; ++w) os = os + red_o[w * geo.d_v + m.jc];
    }
    if (p.o != nullptr && m.row_warp == 0) {
      float* o = p.o + v_base;
      if constexpr (kVt == ValueTransform::kScaleReorder) {
        const int oj = vorder[m.jc];
        o[oj] = os * vscale[oj];
      } else if constexpr (kVt == ValueTransform::kHadamard32) {
        o[m.jc] = StripeHadamard(os, c32);
      } else {
        o[m.jc] = os;
      }
    }
  }

  const float gs = TileGlobalScale<F>(l, m, s, red, t.warps);
  StoreTile<F>(l, head, m, gs, s);
  if (l.has_global_scale && threadIdx.x == 0) {
    *reinterpret_cast<float*>(head + l.global_offset) = gs;
  }
}

template <StateFormat F>
int Launch(const RecurrenceParams& p, void* stream) {
  const DecodeTiling t = MakeDecodeTiling(p.geo.d_k, p.geo.d_v);
  const size_t smem = sizeof(float) * (2 * t.row_warps * p.geo.d_v + t.warps * 32 + t.warps);
  const int64_t blocks = int64_t{p.batch} * p.geo.h_v;
  if (blocks == 0) return cudaSuccess;
  RecurrenceKernel<F><<<static_cast<unsigned>(blocks), t.threads, smem,
                        static_cast<cudaStream_t>(stream)>>>(p);
  return cudaGetLastError();
}

}  // namespace

bool TilingSupported(int d_k, int d_v) {
  if (d_k < 1 || d_v < kTileStripe || d_v % kTileStripe != 0) return false;
  return MakeDecodeTiling(d_k, d_v).threads <= kMaxTileThreads;
}

int LaunchRecurrence(const RecurrenceParams& p, void* stream) {
  switch (p.geo.format) {
    case StateFormat::kFp32: return Launch<StateFormat::kFp32>(p, stream);
    case StateFormat::kFp16: return Launch<StateFormat::kFp16>(p, stream);
    case StateFormat::kBf16: return Launch<StateFormat::kBf16>(p, stream);
    case StateFormat::kInt8: return Launch<StateFormat::kInt8>(p, stream);
    case StateFormat::kInt8Hadamard: return Launch<StateFormat::kInt8Hadamard>(p, stream);
    case StateFormat::kInt4: return Launch<StateFormat::kInt4>(p, stream);
    case StateFormat::kInt4Hadamard: return Launch<StateFormat::kInt4Hadamard>(p, stream);
    case StateFormat::kFp8E4m3: return Launch<StateFormat::kFp8E4m3>(p, stream);
    case StateFormat::kNvfp4: return Launch<StateFormat::kNvfp4>(p, stream);
    case StateFormat::kDamp: return Launch<StateFormat::kDamp>(p, stream);
    case StateFormat::kDampSr: return Launch<StateFormat::kDampSr>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda_internal
}  // namespace statecache
