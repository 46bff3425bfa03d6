// Shared-memory layout of the decode kernels: the per-CTA scratch and the
// stages of the pipelined kernel (host and device; stage_layout_test checks
// the stage counts chosen for the H200's limits).
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_STAGE_LAYOUT_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_STAGE_LAYOUT_H_

#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/cuda/decode_math.h"
#include "kernels/formats/format.h"
#include "kernels/formats/head_layout.h"

namespace statecache {
namespace cuda_internal {

// Floats of one warp's reduce-scatter buffer (tile_common.cuh,
// WarpReduceScatter16Smem: two column halves of 16 row lanes x 20 floats,
// padded to 336).
inline constexpr int kWarpReduceFloats = 2 * 336;

// Scratch: [2 parities] x (red_k, red_q [row_warps][d_v], red_v [d_v],
// red_qk [warps]),
// wbuf [warps][32], red [warps] (rounded up to 4), then per warp
// kWarpScratchFloats: the reduce-scatter buffer and (pipelined kernel) the
// warp's 64 staged row inputs (float4 each).
// Each part starts 16-byte aligned (wbuf, wred and rows are read as float4).
inline constexpr int kWarpRowsFloats = 4 * kTileRowsPerWarp;
inline constexpr int kWarpScratchFloats = kWarpReduceFloats + kWarpRowsFloats;

SC_HD int64_t ScratchPer(const DecodeTiling& t, int d_v) {
  return ((2 * int64_t{t.row_warps} + 1) * d_v + t.warps + 3) / 4 * 4;  // red_qk per stripe
}
SC_HD int64_t WarpScratchOffset(const DecodeTiling& t, int d_v) {
  return 2 * ScratchPer(t, d_v) + t.warps * 32 + (t.warps + 3) / 4 * 4;
}
SC_HD int64_t ScratchFloats(const DecodeTiling& t, int d_v) {
  return WarpScratchOffset(t, d_v) + int64_t{t.warps} * kWarpScratchFloats;
}
// The pipelined kernel's scratch: ScratchFloats, then one KDA gate vector
// (row_warps * 64 floats, 16-byte aligned) per producer warp (one per
// stripe), fetched one staging ahead of the item it decays
// (PipelinedDecodeKernel).
SC_HD int64_t GatesAheadFloats(const DecodeTiling& t) {
  return int64_t{t.row_warps} * kTileRowsPerWarp;
}
SC_HD int64_t PipelinedScratchFloats(const DecodeTiling& t, int d_v) {
  return ScratchFloats(t, d_v) + t.stripes * GatesAheadFloats(t);
}

// 4-byte words of a stage's header (StageLayout::header).
inline constexpr int kStageHeaderWords = 8;

// Byte offsets inside one shared-memory stage (all multiples of 16; the
// stage itself is 1024-byte aligned and a multiple of 1024 bytes).
struct StageLayout {
  int header = 0;      // kStageHeaderWords: the staged item's int32 slot, float beta,
                       // float exp(g) (GDN), int32 head row (StagedHeadRow), int32
                       // 1 when the KDA gates are decays already (StagedGatesDecayed)
  int head = 0;        // packed head [head_bytes], 1024-byte aligned
  int tma_rows = 0;    // > 0: the head arrives by tensor-map copies of tma_rows
                       // 128-byte rows each, 128-byte swizzled (Src::kSwizzled)
  int q = 0, k = 0;    // [d_k] dtype
  int v = 0;           // [d_v] dtype
  int g = 0;           // KDA [d_k] fp32
  int perm = 0;        // [d_k] int32 (when the layout has a permutation)
  int order = 0;       // damp-sr [d_v] int32
  int scale = 0;       // damp-sr [d_v] fp32
  int bytes = 0;       // stage size
  int stages = 1;      // 1 .. kMaxStages
  int64_t scratch_bytes = 0;
};

inline constexpr int kMaxStages = 3;
static_assert(kMaxStages <= kMaxTileThreads / 32, "the prologue uses one scalar slot per stage");

// The offsets and size of one stage for a head of head_bytes and the inputs
// present (ds: bytes per q / k / v element). The fixed-shape kernels pass
// true for every optional input, so their offsets follow from template
// arguments alone and fold into the shared-memory instructions.
SC_HD StageLayout StageOffsets(int64_t head_bytes, int d_k, int d_v, int ds,
                                                    bool kda, bool perm, bool order) {
  StageLayout sl;
  int off = 0;
  sl.head = off;  // first: the stage base is 1024-byte aligned
  off += static_cast<int>((head_bytes + 15) / 16 * 16);
  sl.q = off;
  off += d_k * ds;
  sl.k = off;
  off += d_k * ds;
  sl.v = off;
  off += d_v * ds;
  sl.g = off;
  if (kda) off += d_k * 4;
  sl.perm = off;
  if (perm) off += d_k * 4;
  sl.order = off;
  sl.scale = off + d_v * 4;
  if (order) off += 2 * d_v * 4;
  sl.header = off;
  off += 4 * kStageHeaderWords;
  sl.bytes = (off + 1023) / 1024 * 1024;
  return sl;
}

// IsStagedFormat (the format table's staged column, format.h): the formats
// whose fixed-shape heads run the staged kernel (StagedFpDecodeKernel):
// fp32. Its rows hold FP values only, so a head's columns are independent (no group parameters across a row, no global
// scale, no value-axis map) and the updated tile is written back into its
// stage as is. fp16 / bf16 qualify too but measured slower there
// (docs/BENCHMARKS.md, "Kernel design notes"), so they stay on the
// pipelined kernel.

// The column parts a head of format f is split into: a staged kernel's work
// item is a fixed-shape head's column half (two stripes, four compute
// warps: half the stage, so more stages per SM); 1 (whole heads) for
// everything else.
SC_HD constexpr int ColumnParts(StateFormat f, bool fixed) {
  return fixed && IsStagedFormat(f) ? 2 : 1;
}

// The staged kernel's CTA: four compute warps (MakeDecodeTiling(128, 64))
// and one producer warp; two CTAs per SM, each with three 35 KiB fp32
// stages (measured against three CTAs of two stages: docs/BENCHMARKS.md,
// "Kernel design notes").
inline constexpr int kStagedComputeWarps = 4;
inline constexpr int kStagedThreads = 32 * (kStagedComputeWarps + 1);
inline constexpr int kStagedCtasPerSm = 2;

// The head layout of the fixed-shape kernels: d_k = d_v = 128 and, for the
// mixed formats, the default k_hi (the common model shape; heads of this
// layout run kernels specialized for it).
SC_HD PackedHeadLayout FixedShapeHeadLayout(StateFormat f) {
  return MakeHeadLayout(FormatSpec{f, IsMixedFormat(f) ? kDefaultKHi : 0}, 128, 128);
}

// The stage of the fixed-shape kernels for format f and q / k / v elements
// of ds bytes: a column part of the head (ColumnParts) and room for every
// optional input, so the offsets follow from (f, ds) alone and the kernels
// fold them into constants.
SC_HD StageLayout FixedShapeStageOffsets(StateFormat f, int ds) {
  const int parts = ColumnParts(f, true);
  const PackedHeadLayout l = FixedShapeHeadLayout(f);
  return StageOffsets(l.head_bytes / parts, 128, 128 / parts, ds, true, true,
                      ValueTransformOf(f) == ValueTransform::kScaleReorder);
}

// Stage count (into sl->stages) for `ctas` CTAs per SM of sl->scratch_bytes
// of scratch each: as many stages (up to kMaxStages) as fit (1 KB of static
// shared memory per CTA, 2 KB reserved per SM); `forced` (1..kMaxStages, 0:
// none) overrides that choice, but never beyond what one CTA can hold.
inline void FitStages(int ctas, int max_smem_per_sm, int max_smem_per_block, int forced,
                      StageLayout* sl) {
  sl->stages = 1;
  while (sl->stages < kMaxStages &&
         ctas * (sl->scratch_bytes + (sl->stages + 1) * sl->bytes + 1024) + 2048 <=
             max_smem_per_sm) {
    ++sl->stages;
  }
  if (forced >= 1 && forced <= kMaxStages) sl->stages = forced;
  while (sl->stages > 1 &&
         sl->scratch_bytes + int64_t{sl->stages} * sl->bytes + 1024 > max_smem_per_block) {
    --sl->stages;
  }
}

// The stage count of a pipelined launch (into sl->stages, with
// sl->scratch_bytes): FitStages for 16 warps per SM (two CTAs of 256
// threads). d_v: the columns of one CTA's item.
inline void ChooseStages(const DecodeTiling& t, int d_v, int max_smem_per_sm,
                         int max_smem_per_block, int forced, StageLayout* sl) {
  sl->scratch_bytes = AlignUp(PipelinedScratchFloats(t, d_v) * 4, 1024);
  FitStages(t.threads >= 512 ? 1 : 512 / t.threads, max_smem_per_sm, max_smem_per_block, forced,
            sl);
}

// Scratch of the staged kernel: the stripe exchange's arrays only (both
// parities; its reductions go through shuffles, TokenStep<.., true>).
SC_HD int64_t StagedScratchBytes() {
  const DecodeTiling t = MakeDecodeTiling(128, 128 / 2);
  return AlignUp(2 * ScratchPer(t, 128 / 2) * 4, 1024);
}

// The staged kernel's stage for format f (IsStagedFormat) and q / k / v
// elements of ds bytes: FixedShapeStageOffsets with the scratch and as many
// stages as fit kStagedCtasPerSm CTAs per SM (FitStages).
inline StageLayout StagedStageLayout(StateFormat f, int ds, int max_smem_per_sm,
                                     int max_smem_per_block, int forced) {
  StageLayout sl = FixedShapeStageOffsets(f, ds);
  sl.scratch_bytes = StagedScratchBytes();
  FitStages(kStagedCtasPerSm, max_smem_per_sm, max_smem_per_block, forced, &sl);
  return sl;
}

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_STAGE_LAYOUT_H_
