// Shared device helpers of the tile kernels: the lane map of decode_math.h,
// whole-tile load / store of a packed head, value-axis maps and reductions.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_TILE_COMMON_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_TILE_COMMON_CUH_

#include <cuda_fp16.h>
#include <cstdint>

#include "kernels/cuda/decode_math.h"
#include "kernels/cuda/internal/kernel_params.h"
#include "kernels/cuda/internal/tile_codec.cuh"
#include "kernels/formats/format.h"
#include "kernels/formats/hadamard.h"
#include "kernels/formats/head_layout.h"

namespace statecache {
namespace cuda_internal {

// Where this lane sits in the tile (see decode_math.h).
struct LaneMap {
  int warp, lane, stripe, row_warp, rl, cl;
  int col0;  // first of the lane's 16 columns
  int jc;    // the single column this lane holds after a reduce-scatter
  __device__ int row(int i) const { return (row_warp * kTileSteps + i) * kTileRowsPerStep + rl; }
};

__device__ __forceinline__ LaneMap MakeLaneMap(int stripes) {
  LaneMap m;
  m.warp = threadIdx.x >> 5;
  m.lane = threadIdx.x & 31;
  m.stripe = m.warp % stripes;
  m.row_warp = m.warp / stripes;
  m.rl = m.lane >> 1;
  m.cl = m.lane & 1;
  m.col0 = m.stripe * kTileStripe + m.cl * kTileColsPerLane;
  m.jc = m.col0 + m.rl;
  return m;
}

// Loads the lane's kTileSteps x 16 values of a packed head (rows >= d_k are 0).
template <StateFormat F>
__device__ __forceinline__ void LoadTile(const PackedHeadLayout& l, const uint8_t* head,
                                         const LaneMap& m, float global_scale,
                                         float (&s)[kTileSteps][kTileColsPerLane]) {
  constexpr RowCodec kLo = LoRowCodec(F);
  constexpr RowCodec kHi = HiRowCodec(F);
#pragma unroll
  for (int i = 0; i < kTileSteps; ++i) {
    const int r = m.row(i);
    if (r >= l.d_k) {
#pragma unroll
      for (int c = 0; c < kTileColsPerLane; ++c) s[i][c] = 0.0f;
    } else if (IsMixedFormat(F) && r < l.k_hi) {
      LoadRow16<kHi>(head + l.hi_offset + r * l.hi_row_bytes, nullptr, m.col0, 0.0f, s[i]);
    } else {
      const int lr = r - l.k_hi;
      LoadRow16<kLo>(head + l.lo_codes_offset + lr * l.lo_code_row_bytes,
                     head + l.lo_meta_offset + lr * l.lo_meta_row_bytes, m.col0, global_scale,
                     s[i]);
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
      StoreRow16<kHi>(head + l.hi_offset + r * l.hi_row_bytes, nullptr, m.col0, 0.0f, false,
                      s[i]);
    } else {
      const int lr = r - l.k_hi;
      StoreRow16<kLo>(head + l.lo_codes_offset + lr * l.lo_code_row_bytes,
                      head + l.lo_meta_offset + lr * l.lo_meta_row_bytes, m.col0, global_scale,
                      m.cl == 0, s[i]);
    }
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
// warp (pairs differing in rl bit 3, 2, 1, 0 = lane bit 4, 3, 2, 1). Returns
// the warp sum of column col0 + rl (tree of WarpTreeSum).
__device__ __forceinline__ float WarpReduceScatter16(const float (&p)[16], int lane) {
  float a8[8];
  const bool u16 = lane & 16;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float send = u16 ? p[j] : p[j + 8];
    const float keep = u16 ? p[j + 8] : p[j];
    a8[j] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
  float a4[4];
  const bool u8 = lane & 8;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float send = u8 ? a8[j] : a8[j + 4];
    const float keep = u8 ? a8[j + 4] : a8[j];
    a4[j] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  float a2[2];
  const bool u4 = lane & 4;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float send = u4 ? a4[j] : a4[j + 2];
    const float keep = u4 ? a4[j + 2] : a4[j];
    a2[j] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  }
  const bool u2 = lane & 2;
  const float send = u2 ? a2[0] : a2[1];
  const float keep = u2 ? a2[1] : a2[0];
  return keep + __shfl_xor_sync(0xffffffffu, send, 2);
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
