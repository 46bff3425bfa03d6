// Pack / unpack of natural-order FP32 states, one CTA per (item, layer, head),
// same lane map as the recurrence kernel. Pack: gather rows by key_perm, map
// each row to the stored value domain (M^T: H32 or damp-sr scale/reorder, as
// value_transform.h), encode. Unpack: decode, map back (M^-T), scatter rows.
#include <cuda_runtime.h>

#include "kernels/cuda/internal/format_dispatch.cuh"
#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/tile_common.cuh"
#include "kernels/cuda/internal/validation_block.cuh"

namespace statecache {
namespace cuda_internal {
namespace {

struct PackItem {
  int item, layer, h;
  int32_t slot;
  const int32_t* perm;
  const int32_t* order;
  const float* scale;
  float* state;  // natural [d_k][d_v]
  uint8_t* head;
};

__device__ __forceinline__ PackItem MakePackItem(const PackParams& p) {
  const HeadGeometry& geo = p.geo;
  PackItem it;
  const int per_slot = p.pool.layers * geo.h_v;
  it.item = blockIdx.x / per_slot;
  const int lh = blockIdx.x % per_slot;
  it.layer = lh / geo.h_v;
  it.h = lh % geo.h_v;
  it.slot = p.slots[it.item];
  it.perm = p.key_perm != nullptr ? p.key_perm + int64_t{lh} * geo.d_k : nullptr;
  it.order = p.value_order != nullptr ? p.value_order + int64_t{lh} * geo.d_v : nullptr;
  it.scale = p.value_scale != nullptr ? p.value_scale + int64_t{lh} * geo.d_v : nullptr;
  it.state = p.states + int64_t{blockIdx.x} * geo.d_k * geo.d_v;
  it.head = it.slot < 0 ? nullptr
                        : p.pool.base + it.slot * p.pool.slot_stride +
                              int64_t{lh} * geo.layout.head_bytes;
  return it;
}

// Zeroes the alignment padding of a head (EncodeHead writes zeros there).
__device__ void ZeroPadding(const PackedHeadLayout& l, uint8_t* head) {
  const int64_t ends[4] = {l.hi_offset + l.k_hi * l.hi_row_bytes,
                           l.lo_codes_offset + l.lo_rows() * l.lo_code_row_bytes,
                           l.lo_meta_offset + l.lo_rows() * l.lo_meta_row_bytes,
                           l.global_offset + (l.has_global_scale ? 4 : 0)};
  const int64_t next[4] = {l.lo_codes_offset, l.lo_meta_offset, l.global_offset, l.head_bytes};
  for (int s = 0; s < 4; ++s) {
    for (int64_t i = ends[s] + threadIdx.x; i < next[s]; i += blockDim.x) head[i] = 0;
  }
}

template <StateFormat F>
__global__ void __launch_bounds__(kMaxTileThreads) PackKernel(const PackParams p) {
  __shared__ float red[kMaxTileThreads / 32];
  const HeadGeometry& geo = p.geo;
  const PackedHeadLayout& l = geo.layout;
  const DecodeTiling t = MakeDecodeTiling(geo.d_k, geo.d_v);
  if (ValidationBlockFailed(p.abort_if_error)) return;
  const PackItem it = MakePackItem(p);
  if (it.slot < 0) return;
  const LaneMap m = MakeLaneMap<LaneWidth<F>()>(t.stripes);
  constexpr ValueTransform kVt = ValueTransformOf(F);
  float s[kTileSteps][kTileColsPerLane];
#pragma unroll
  for (int i = 0; i < kTileSteps; ++i) {
    const int r = m.row(i);
    if (r >= geo.d_k) {
#pragma unroll
      for (int c = 0; c < kTileColsPerLane; ++c) s[i][c] = 0.0f;
      continue;
    }
    const float* src = it.state + int64_t{it.perm != nullptr ? it.perm[r] : r} * geo.d_v;
    if constexpr (kVt == ValueTransform::kScaleReorder) {
#pragma unroll
      for (int c = 0; c < kTileColsPerLane; ++c) {
        const int oj = it.order[m.stripe * kTileStripe + m.ColOf(c)];
        s[i][c] = src[oj] / it.scale[oj];
      }
    } else {
#pragma unroll
      for (int c4 = 0; c4 < 4; ++c4) {
        const float4 v =
            *reinterpret_cast<const float4*>(src + m.stripe * kTileStripe + m.ColOf(4 * c4));
        s[i][4 * c4] = v.x;
        s[i][4 * c4 + 1] = v.y;
        s[i][4 * c4 + 2] = v.z;
        s[i][4 * c4 + 3] = v.w;
      }
    }
  }
  if constexpr (kVt == ValueTransform::kHadamard32) {
    // Lanes of a pair share a row, so the whole warp takes this together.
#pragma unroll
    for (int i = 0; i < kTileSteps; ++i) PairHadamard(s[i], m.cl);
  }
  const float gs = TileGlobalScale<F>(l, m, s, red, t.warps);
  StoreTile<F>(l, it.head, m, gs, s);
  if (threadIdx.x == 0 && l.has_global_scale) {
    *reinterpret_cast<float*>(it.head + l.global_offset) = gs;
  }
  ZeroPadding(l, it.head);
}

template <StateFormat F>
__global__ void __launch_bounds__(kMaxTileThreads) UnpackKernel(const PackParams p) {
  if (ValidationBlockFailed(p.abort_if_error)) return;
  const HeadGeometry& geo = p.geo;
  const PackedHeadLayout& l = geo.layout;
  const DecodeTiling t = MakeDecodeTiling(geo.d_k, geo.d_v);
  const PackItem it = MakePackItem(p);
  const LaneMap m = MakeLaneMap<LaneWidth<F>()>(t.stripes);
  if (it.slot < 0) {
    for (int64_t i = threadIdx.x; i < int64_t{geo.d_k} * geo.d_v; i += blockDim.x) {
      it.state[i] = 0.0f;
    }
    return;
  }
  constexpr ValueTransform kVt = ValueTransformOf(F);
  const float gs = l.has_global_scale ? *reinterpret_cast<const float*>(it.head + l.global_offset) : 0.0f;
  float s[kTileSteps][kTileColsPerLane];
  LoadTile<F>(l, it.head, m, gs, s);
  if constexpr (kVt == ValueTransform::kHadamard32) {
#pragma unroll
    for (int i = 0; i < kTileSteps; ++i) PairHadamard(s[i], m.cl);
  }
#pragma unroll
  for (int i = 0; i < kTileSteps; ++i) {
    const int r = m.row(i);
    if (r >= geo.d_k) continue;
    float* dst = it.state + int64_t{it.perm != nullptr ? it.perm[r] : r} * geo.d_v;
    if constexpr (kVt == ValueTransform::kScaleReorder) {
#pragma unroll
      for (int c = 0; c < kTileColsPerLane; ++c) {
        const int oj = it.order[m.stripe * kTileStripe + m.ColOf(c)];
        dst[oj] = s[i][c] * it.scale[oj];
      }
    } else {
#pragma unroll
      for (int c4 = 0; c4 < 4; ++c4) {
        *reinterpret_cast<float4*>(dst + m.stripe * kTileStripe + m.ColOf(4 * c4)) =
            make_float4(s[i][4 * c4], s[i][4 * c4 + 1], s[i][4 * c4 + 2], s[i][4 * c4 + 3]);
      }
    }
  }
}

template <StateFormat F>
int LaunchPackT(const PackParams& p, bool pack, void* stream) {
  const DecodeTiling t = MakeDecodeTiling(p.geo.d_k, p.geo.d_v);
  const int64_t blocks = int64_t{p.n} * p.pool.layers * p.geo.h_v;
  if (blocks == 0) return cudaSuccess;
  if (pack) {
    PackKernel<F><<<static_cast<unsigned>(blocks), t.threads, 0,
                    static_cast<cudaStream_t>(stream)>>>(p);
  } else {
    UnpackKernel<F><<<static_cast<unsigned>(blocks), t.threads, 0,
                      static_cast<cudaStream_t>(stream)>>>(p);
  }
  return cudaGetLastError();
}

int Dispatch(const PackParams& p, bool pack, void* stream) {
  return DispatchFormat<CudaUnit::kRecurrence, CudaUnit::kRecurrenceAffine>(
      p.geo.format, [&](auto f) { return LaunchPackT<decltype(f)::value>(p, pack, stream); });
}

}  // namespace

int LaunchPack(const PackParams& p, void* stream) { return Dispatch(p, true, stream); }
int LaunchUnpack(const PackParams& p, void* stream) { return Dispatch(p, false, stream); }

}  // namespace cuda_internal
}  // namespace statecache
