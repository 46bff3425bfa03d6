// StagedFpDecodeKernel: the decode kernel of fixed-shape heads of the staged
// formats (IsStagedFormat: fp32), on column halves with a producer warp that
// also stores the heads back (recurrence_kernels.cuh lists the kernels; the
// launch: LaunchStaged in recurrence_launch.cuh).
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_STAGED_DECODE_KERNEL_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_STAGED_DECODE_KERNEL_CUH_

#include "kernels/cuda/internal/pipelined_decode_kernel.cuh"

namespace statecache {
namespace cuda_internal {
namespace {

// StagedFpDecodeKernel: the fixed-shape heads of fp32 (IsStagedFormat; a
// work item is a head's column half, ColumnParts) on CTAs of
// kStagedComputeWarps compute warps and one producer warp, kStagedCtasPerSm
// per SM, each with its own stages (StagedStageLayout: three), and no head
// ever leaves shared memory through the compute warps' stores:
//  - the producer (lane 0 of the last warp) stages the CTA's items in turn
//    (IssueItem; its scalars loaded one item ahead), and before refilling a
//    stage stores the item it held back to the pool with one tensor-map copy
//    (TensorStore3D, the load's box and swizzle) once every compute warp
//    marked it written;
//  - the compute warps decode the staged half with the decay folded in,
//    run TokenStep with shuffle reductions (no per-warp buffers: the
//    scratch is the stripe exchange's only) and write the updated tile back
//    into the stage where they read it (StoreTileStaged), then arrive on
//    the stage's `written` barrier.
// So a CTA's next items are in flight while it computes (the pipelined
// kernel's fp32 CTAs at 16 warps per SM fit one 32 KiB stage each), and the
// stores leave as whole boxes (docs/BENCHMARKS.md, "Kernel design notes").
//   p       as PipelinedDecodeKernel's (decode, T = 1, 16-byte aligned), a
//           fixed-shape head layout of a staged format.
//   sl_in   StagedStageLayout (its offsets become FixedShapeStageOffsets'
//           constants); tmap: the pool as [key rows][S][128 bytes]
//           (EncodePoolPartsTensorMap), the column halves' boxes.
//   grid    min(2 * batch * h_v, resident CTAs) persistent CTAs of
//           kStagedThreads threads, kStagedCtasPerSm per SM.
//   smem    dynamic: sl.scratch_bytes + sl.stages * sl.bytes (1024-byte
//           aligned stages); static: full / written mbarriers per stage.
//   trusts  as PipelinedDecodeKernel (p.defer_writes likewise).
template <StateFormat F, int kDtype>
__global__ void __launch_bounds__(kStagedThreads, kStagedCtasPerSm)
    StagedFpDecodeKernel(const RecurrenceParams p, const StageLayout sl_in,
                         const __grid_constant__ CUtensorMap tmap) {
  static_assert(IsStagedFormat(F), "the staged formats only");
  constexpr int kParts = ColumnParts(F, true);
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full[kMaxStages];     // stage staged (producer + copies)
  __shared__ __align__(8) uint64_t written[kMaxStages];  // tile written back by every compute warp
  // defer (p.defer_writes): every thread waits before its first global
  // write (verdict_failed below); everything before it only reads.
  const bool defer = p.defer_writes;
  if (!defer) WaitForPrecedingGrids();  // before any global access (grid_dependency.cuh)
  AllowDependentLaunch();
  const HeadGeometry geo = EffectiveGeometry<F, true>(p.geo);
  const int dv = geo.d_v / kParts;
  PackedHeadLayout ls = geo.layout;  // the staged part: the part's row bytes
  ls.lo_code_row_bytes /= kParts;
  const DecodeTiling t = MakeDecodeTiling(geo.d_k, dv);
  const StageLayout sl = FixedStageLayout<F, true, kDtype>(sl_in);
  const int items = p.batch * geo.h_v * kParts;
  const int stride = gridDim.x;
  if (!defer && ValidationFailed(p)) return;
  // defer: true until this thread waited for the validation kernel and read
  // its verdict (one verdict: every thread reaches the same decision). The
  // compute warps call it in their first pass before writing o (and mark
  // the stage written either way, so the producer proceeds); the producer
  // calls it before its first store (pass j = stages, after the first
  // item's written barrier) and on a failure lets the stages it filled
  // (phase 0 of full[0 .. min(count, stages) - 1]: nothing refilled yet)
  // land before it exits.
  bool pending = defer;
  const auto verdict_failed = [&]() -> bool {
    if (!pending) return false;
    pending = false;
    WaitForPrecedingGrids();
    return ValidationFailed(p);
  };
  float* scratch = reinterpret_cast<float*>(smem_raw);
  uint8_t* stage_base = smem_raw + sl.scratch_bytes;  // 1024-aligned (StagedScratchBytes)
  if (threadIdx.x == 0) {
    for (int s = 0; s < sl.stages; ++s) {
      MbarrierInit(&full[s], 1);
      MbarrierInit(&written[s], t.warps);
    }
    FenceMbarrierInit();
  }
  __syncthreads();  // the last CTA-wide barrier: the roles split here

  if (threadIdx.x >= 32 * t.warps) {  // the producer warp
    if (threadIdx.x != 32 * t.warps) return;
    // The swizzle needs 1024-byte aligned stages (as in PipelinedDecodeKernel).
    if ((SmemAddr(stage_base) & 1023u) != 0) __trap();
    int32_t next_slot = 0;
    float next_beta = 0.0f, next_g = 0.0f;
    const auto fetch = [&](int it) {  // plain loads: consumed one iteration later
      const int head_item = it / kParts;
      next_slot = p.slots[BatchOf(head_item, geo.h_v)];
      next_beta = p.beta[head_item];
      if (!geo.kda) next_g = p.g[head_item];
    };
    const int count = blockIdx.x < items ? (items - 1 - blockIdx.x) / stride + 1 : 0;
    if (count > 0) fetch(blockIdx.x);
    // Pass j stores item j - stages (if any) from stage j % stages, then
    // stages item j (if any) there.
    int st = 0;
    uint32_t parity = 0;
    for (int j = 0; j < count + sl.stages; ++j) {
      uint8_t* stage = stage_base + st * sl.bytes;
      if (j >= sl.stages) {
        MbarrierWait(&written[st], parity ^ 1u);
        if (verdict_failed()) {
#pragma unroll 1
          for (int s = 0; s < sl.stages && s < count; ++s) MbarrierWait(&full[s], 0);
          return;
        }
        const int32_t slot = *reinterpret_cast<const int32_t*>(stage + sl.header);
        if (slot >= 0) {
          const int old = blockIdx.x + (j - sl.stages) * stride;
          TensorStore3D(&tmap, 0, PartColumn<kParts>(geo, old % kParts),
                        StagedHeadRow(stage, sl), stage + sl.head);
          BulkCommitGroup();
        }
      }
      if (j < count) {
        const int item = blockIdx.x + j * stride;
        const int32_t slot = next_slot;
        const float beta = next_beta, g = next_g;
        if (j + 1 < count) fetch(item + stride);
        if (j >= sl.stages) BulkWaitGroupRead0();  // the store has read the stage
        IssueItem<kParts>(p, geo, sl, &tmap, stage, &full[st], item, slot, beta,
                          geo.kda ? 0.0f : DecayExp(g));
      }
      parity ^= st + 1 == sl.stages ? 1u : 0u;
      st = st + 1 == sl.stages ? 0 : st + 1;
    }
    // The stores must have read the stages before the CTA's shared memory
    // goes; their writes are visible at the grid's completion (as CUTLASS's
    // tensor-map store epilogues end).
    BulkWaitGroupRead0();
    return;
  }

  // The compute warps. Pass n uses stage n % stages in phase parity
  // (n / stages) & 1.
  int st = 0;
  uint32_t parity = 0;
  for (int n = 0, item = blockIdx.x; item < items;
       ++n, item += stride, parity ^= st + 1 == sl.stages ? 1u : 0u,
           st = st + 1 == sl.stages ? 0 : st + 1) {
    uint8_t* stage = stage_base + st * sl.bytes;
    const LaneMap m = MakeLaneMap<LaneWidth<F>()>(t.stripes, OpaqueThreadIdx());
    // After this warp's last access of the stage (its write-back included).
    const auto mark_written = [&] {
      FenceProxyAsyncShared();
      __syncwarp();
      if (m.lane == 0) MbarrierArrive(&written[st]);
    };
    MbarrierWait(&full[st], parity);
    const int32_t slot = *reinterpret_cast<const int32_t*>(stage + sl.header);
    const int head_item = item / kParts;
    float* o = p.o + int64_t{head_item} * geo.d_v + (item % kParts) * dv;
    if (slot < 0) {
      if (verdict_failed()) {
        mark_written();
        return;
      }
      if (m.row_warp == 0) o[m.jc] = 0.0f;
      mark_written();
      continue;
    }
    const float beta = reinterpret_cast<const float*>(stage + sl.header)[1];
    const float a_head = reinterpret_cast<const float*>(stage + sl.header)[2];  // exp(g)
    const uint8_t* head_s = stage + sl.head;
    float kk[kTileSteps], qs[kTileSteps], a[kTileSteps];
    const RowSource in = StagedRowSource(p, geo, sl, stage, a_head);
    GatherRows<kDtype>(m, geo.d_k, in, kk, qs, a);
    float s[kTileSteps][kTileColsPerLane];
    LoadItemTile<F, true>(ls, head_s, m, 0.0f, s, a);
    const float vp = m.row_warp == 0
                         ? StoredValue<ValueTransform::kNone, kDtype>(m, p.dtype, stage + sl.v,
                                                                      nullptr, nullptr)
                         : 0.0f;
    // Only the exchange arrays of the scratch exist (kShuffle needs no
    // wbuf / wred).
    const StepScratch sc = MakeScratch(scratch, t, dv, m, n & 1);
    const float os = TokenStep<true, true, true>(s, kk, qs, a, vp, beta, m, t, dv, sc);
    StoreTileStaged<F>(ls, SmemAddr(head_s), m, s);
    if (verdict_failed()) {  // after the item's compute: it overlaps the validation
      mark_written();
      return;
    }
    if (m.row_warp == t.row_warps - 1) o[m.jc] = os;
    mark_written();
  }
}

}  // namespace
}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_STAGED_DECODE_KERNEL_CUH_
