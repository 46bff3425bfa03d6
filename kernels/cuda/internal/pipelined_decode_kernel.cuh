// PipelinedDecodeKernel: the persistent, copy-engine-fed decode kernel (the
// serving path; recurrence_kernels.cuh lists the kernels, the launch is
// LaunchPersistent in recurrence_launch.cuh). The staging helpers here
// (IssueItem and its parts, the stage header) are shared with
// StagedFpDecodeKernel (staged_decode_kernel.cuh). Design notes and
// measurements: docs/BENCHMARKS.md, "Kernel design notes".
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_PIPELINED_DECODE_KERNEL_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_PIPELINED_DECODE_KERNEL_CUH_

#include "kernels/cuda/internal/recurrence_common.cuh"

namespace statecache {
namespace cuda_internal {
namespace {

// Bulk copies of a head are issued in chunks of this many bytes by one
// thread (the measured choice: docs/BENCHMARKS.md, "Kernel design notes").
inline constexpr int kBulkChunk = 4096;

// The first column of a head's column part in the pool viewed as [key
// rows][S][128 bytes], S = a key row's bytes / 128 (EncodePoolPartsTensorMap;
// a box is S / kParts columns of 128 bytes of d_k rows).
template <int kParts>
__device__ __forceinline__ int PartColumn(const HeadGeometry& geo, int part) {
  return part * (static_cast<int>(geo.layout.lo_code_row_bytes) / 128 / kParts);
}

// The staged item's head as the outer coordinate of its tensor-map copy
// (header word 3, written by IssueItem when the head arrives by tensor-map
// copies): its first row of the pool viewed as [rows][128 bytes] (whole
// heads, sl.tma_rows > 0), or its first key row of the parts map (kParts >
// 1). The write-back addresses it without HeadPtr's 64-bit products.
__device__ __forceinline__ int32_t& StagedHeadRow(uint8_t* stage, const StageLayout& sl) {
  static_assert(kStageHeaderWords == 8, "slot, beta, exp(g), head row, gates decayed, 3 unused");
  return reinterpret_cast<int32_t*>(stage + sl.header)[3];
}
// Header word 4: 1 when the stage's KDA gates area holds their decays
// (written by the producer warp, PipelinedDecodeKernel), 0 when it holds
// the gates as copied.
__device__ __forceinline__ int32_t& StagedGatesDecayed(uint8_t* stage, const StageLayout& sl) {
  return reinterpret_cast<int32_t*>(stage + sl.header)[4];
}

// Where a work item's copies go and come from. A work item is head item *
// kParts + part. copy_gates: KDA's gates are copied (else the producer
// wrote their decays into the stage).
template <int kParts>
struct ItemCopies {
  int part, head_item, b, h, kh;  // part, head item, batch entry, value head, key head
  int ds;                         // bytes per input value
  int hb, dv;                     // head bytes and columns of one part
  int input_bytes;                // every copied input vector's bytes
  bool copy_gates;
  __device__ ItemCopies(const RecurrenceParams& p, const HeadGeometry& geo, int item,
                        bool copy_gates_in = true) {
    copy_gates = geo.kda && copy_gates_in;
    part = item % kParts;
    head_item = item / kParts;
    b = BatchOf(head_item, geo.h_v);
    h = head_item - b * geo.h_v;
    const int group = geo.h_v / geo.h_qk;
    kh = DivIndex(h, group, Log2IfPow2(group));
    ds = p.dtype == 0 ? 4 : 2;
    hb = static_cast<int>(geo.layout.head_bytes) / kParts;
    dv = geo.d_v / kParts;
    input_bytes = 2 * geo.d_k * ds + dv * ds;
    if (copy_gates) input_bytes += geo.d_k * 4;
    if (p.maps.key_perm != nullptr) input_bytes += geo.d_k * 4;
    if (p.maps.value_order != nullptr) input_bytes += 2 * geo.d_v * 4;
  }
};

// The tensor-map row of pool slot `slot`'s head for the item (the parts
// map's key rows, or the 2D map's 128-byte rows), also written to the stage
// header (StagedHeadRow) when a tensor map copies it; before the arrival
// that publishes the header.
template <int kParts>
__device__ __forceinline__ int StageHeadRow(const RecurrenceParams& p, const HeadGeometry& geo,
                                            const StageLayout& sl, uint8_t* stage,
                                            const ItemCopies<kParts>& c, int32_t slot) {
  const int64_t offset = HeadPtr(p, geo, slot, c.h) - p.pool.base;
  const int row0 =
      static_cast<int>(kParts > 1 ? offset / geo.layout.lo_code_row_bytes : offset >> 7);
  if (kParts > 1 || sl.tma_rows > 0) StagedHeadRow(stage, sl) = row0;
  return row0;
}

// The packed head (or its column half) of pool slot `slot` (tensor-map row
// row0, StageHeadRow) into `stage`, completing on `bar` (the caller
// accounted its bytes).
template <int kParts>
__device__ __forceinline__ void CopyItemHead(const RecurrenceParams& p, const HeadGeometry& geo,
                                             const StageLayout& sl, const CUtensorMap* tmap,
                                             uint8_t* stage, uint64_t* bar,
                                             const ItemCopies<kParts>& c, int32_t slot, int row0) {
  if constexpr (kParts > 1) {
    TensorCopy3D(stage + sl.head, tmap, 0, PartColumn<kParts>(geo, c.part), row0, bar);
  } else if (sl.tma_rows > 0) {
    for (int r = 0; r < c.hb / 128; r += sl.tma_rows) {
      TensorCopy2D(stage + sl.head + r * 128, tmap, 0, row0 + r, bar);
    }
  } else {
    const uint8_t* src = HeadPtr(p, geo, slot, c.h);
    for (int off = 0; off < c.hb; off += kBulkChunk) {
      BulkCopy(stage + sl.head + off, src + off,
               c.hb - off < kBulkChunk ? c.hb - off : kBulkChunk, bar);
    }
  }
}

// The item's input vectors (q, k, v, KDA gates, maps) into `stage`.
template <int kParts>
__device__ __forceinline__ void CopyItemInputs(const RecurrenceParams& p, const HeadGeometry& geo,
                                               const StageLayout& sl, uint8_t* stage,
                                               uint64_t* bar, const ItemCopies<kParts>& c) {
  const int ds = c.ds;
  const int64_t qk_off = (int64_t{c.b} * geo.h_qk + c.kh) * geo.d_k * ds;
  BulkCopy(stage + sl.q, static_cast<const uint8_t*>(p.q) + qk_off, geo.d_k * ds, bar);
  BulkCopy(stage + sl.k, static_cast<const uint8_t*>(p.k) + qk_off, geo.d_k * ds, bar);
  BulkCopy(stage + sl.v,
           static_cast<const uint8_t*>(p.v) +
               ((int64_t{c.b} * geo.h_v + c.h) * geo.d_v + c.part * c.dv) * ds,
           c.dv * ds, bar);
  if (c.copy_gates) BulkCopy(stage + sl.g, p.g + int64_t{c.head_item} * geo.d_k, geo.d_k * 4, bar);
  if (p.maps.key_perm != nullptr) {
    BulkCopy(stage + sl.perm, p.maps.key_perm + int64_t{c.h} * geo.d_k, geo.d_k * 4, bar);
  }
  if (p.maps.value_order != nullptr) {
    BulkCopy(stage + sl.order, p.maps.value_order + int64_t{c.h} * geo.d_v, geo.d_v * 4, bar);
    BulkCopy(stage + sl.scale, p.maps.value_scale + int64_t{c.h} * geo.d_v, geo.d_v * 4, bar);
  }
}

// The item's scalars into the stage header (read after `bar` completes);
// gates_decayed: StagedGatesDecayed.
__device__ __forceinline__ void WriteItemScalars(uint8_t* stage, const StageLayout& sl,
                                                 int32_t slot, float beta, float a_head,
                                                 bool gates_decayed = false) {
  *reinterpret_cast<int32_t*>(stage + sl.header) = slot;
  reinterpret_cast<float*>(stage + sl.header)[1] = beta;
  reinterpret_cast<float*>(stage + sl.header)[2] = a_head;
  StagedGatesDecayed(stage, sl) = gates_decayed ? 1 : 0;
}

// One thread (the item's producer) only: stage work item `item` (pool slot
// `slot`) into `stage`: its scalars into the header, the packed head (or,
// kParts = 2, the item's column half of it, ColumnParts), then one copy per
// input vector; all complete on `bar` (whose arrival publishes the header).
// gates_decayed: KDA's gate decays are in the stage already (written by
// threads ordered before this one), so the gates are not copied.
template <int kParts>
__device__ __forceinline__ void IssueItem(const RecurrenceParams& p, const HeadGeometry& geo,
                                          const StageLayout& sl, const CUtensorMap* tmap,
                                          uint8_t* stage, uint64_t* bar, int item, int32_t slot,
                                          float beta, float a_head, bool gates_decayed = false) {
  WriteItemScalars(stage, sl, slot, beta, a_head, gates_decayed);
  if (slot < 0) {
    MbarrierArrive(bar);
    return;
  }
  const ItemCopies<kParts> c(p, geo, item, !gates_decayed);
  const int row0 = StageHeadRow<kParts>(p, geo, sl, stage, c, slot);
  MbarrierExpectTx(bar, c.hb + c.input_bytes);  // publishes the header
  CopyItemHead<kParts>(p, geo, sl, tmap, stage, bar, c, slot, row0);
  CopyItemInputs<kParts>(p, geo, sl, stage, bar, c);
}

// The row inputs of the item staged in `stage` (a_head: its GDN exp(g);
// gates_decayed: StagedGatesDecayed).
__device__ __forceinline__ RowSource StagedRowSource(const RecurrenceParams& p,
                                                     const HeadGeometry& geo,
                                                     const StageLayout& sl, const uint8_t* stage,
                                                     float a_head, bool gates_decayed = false) {
  return RowSource{reinterpret_cast<const int32_t*>(stage + sl.perm),
                   stage + sl.q,
                   stage + sl.k,
                   reinterpret_cast<const float*>(stage + sl.g),
                   p.maps.key_perm != nullptr,
                   geo.kda,
                   gates_decayed,
                   p.dtype,
                   a_head,
                   geo.scale};
}

// The stage layout a pipelined kernel uses: the launcher's, with the
// offsets of FixedShapeStageOffsets as compile-time constants for the fixed
// shape (its stage count, scratch size and tensor-map rows stay).
template <StateFormat F, bool kFixed, int kDtype>
__device__ __forceinline__ StageLayout FixedStageLayout(const StageLayout& in) {
  if constexpr (!kFixed) {
    return in;
  } else {
    static_assert(kDtype >= 0, "the fixed-shape kernels fix the input dtype");
    StageLayout sl = FixedShapeStageOffsets(F, kDtype == 0 ? 4 : 2);
    sl.stages = in.stages;
    sl.scratch_bytes = in.scratch_bytes;
    sl.tma_rows = in.tma_rows;
    return sl;
  }
}

// Tile load / store of the pipelined kernel: the fixed shape runs the
// branch-free LoadTileFixed / StoreTileFixed (step 0 of row warp 0 holds the
// hi rows of a mixed format: a warp-uniform choice).
template <StateFormat F, bool kFixed>
__device__ __forceinline__ void LoadItemTile(const PackedHeadLayout& l, const uint8_t* head_s,
                                             const LaneMap& m, float global_scale,
                                             float (&s)[kTileSteps][kTileColsPerLane],
                                             const float (&a)[kTileSteps]) {
  if constexpr (kFixed) {  // fixed-shape heads always arrive swizzled
    LoadTileFixed<F, Src::kSwizzled>(l, SmemAddr(head_s), m, global_scale, m.row_warp == 0, s, a);
  } else {
    LoadTile<F, Src::kShared>(l, head_s, m, global_scale, s, a);
  }
}

template <StateFormat F, bool kFixed>
__device__ __forceinline__ void StoreItemTile(const PackedHeadLayout& l, uint8_t* head,
                                              const LaneMap& m, float global_scale,
                                              const float (&s)[kTileSteps][kTileColsPerLane],
                                              float* buf) {
  if constexpr (kFixed) {
    StoreTileFixed<F>(l, head, m, global_scale, m.row_warp == 0, s, buf);
  } else {
    StoreTile<F>(l, head, m, global_scale, s);
  }
}

// Every lane of a KDA producer warp, its next item's gates complete in
// `gates` (the warp's slot of the scratch, GatesAheadFloats): their decays
// into the gate inputs of `stage` (each channel's DecayExp once per item).
__device__ __forceinline__ void DecayGates(uint8_t* stage, const StageLayout& sl,
                                           const float* gates, int lane, int d_k) {
  float* decays = reinterpret_cast<float*>(stage + sl.g);
  for (int c = 4 * lane; c < d_k; c += 128) {
    const float4 g = *reinterpret_cast<const float4*>(gates + c);
    *reinterpret_cast<float4*>(decays + c) =
        make_float4(DecayExp(g.x), DecayExp(g.y), DecayExp(g.z), DecayExp(g.w));
  }
  __syncwarp();  // every lane's decays before lane 0's arrival publishes them
}

// The end of an item: the last row warp maps its readout o' back and
// stores it to o (the item's [d_v] row); every lane stores its tile of the
// updated head (s) to the pool, requantized (wred: TokenStep's reduction
// buffer, free by now); thread 0 its global scale.
template <StateFormat F, bool kFixed>
__device__ __forceinline__ void WriteBackItem(const RecurrenceParams& p, const HeadGeometry& geo,
                                              const LaneMap& m, const DecodeTiling& t,
                                              float* scratch,
                                              const float (&s)[kTileSteps][kTileColsPerLane],
                                              float os, float* o, int h, int32_t slot,
                                              int32_t head_row, float* wred) {
  constexpr ValueTransform kVt = ValueTransformOf(F);
  const PackedHeadLayout& l = geo.layout;
  if (m.row_warp == t.row_warps - 1) {  // o' -> o (see vp)
    // damp-sr: the stage is released by now; its maps are per-layer
    // constants, read from global memory (L2-resident) instead.
    StoreOutput<kVt>(m, os, o,
                     kVt == ValueTransform::kScaleReorder ? p.maps.value_order + h * geo.d_v
                                                          : nullptr,
                     kVt == ValueTransform::kScaleReorder ? p.maps.value_scale + h * geo.d_v
                                                          : nullptr);
  }
  // The fixed shape's heads arrive by tensor-map copies (their row in the
  // header: one product instead of HeadPtr's).
  uint8_t* head = kFixed ? p.pool.base + uint64_t{static_cast<uint32_t>(head_row)} * 128
                         : HeadPtr(p, geo, slot, h);
  const float gs = TileGlobalScale<F>(l, m, s, GlobalScaleScratch(scratch, t, geo.d_v), t.warps);
  StoreItemTile<F, kFixed>(l, head, m, gs, s, wred);
  if (l.has_global_scale && threadIdx.x == 0) {
    *reinterpret_cast<float*>(head + l.global_offset) = gs;
  }
}

// PipelinedDecodeKernel<F, kFixed, kDtype>: one decode step (T = 1) of the
// CTA's items (batch item, value head) blockIdx.x, blockIdx.x + gridDim.x,
// ...: the next items' heads and inputs are copied into shared-memory
// stages by the copy engine while the current item computes.
//   p       RecurrenceParams with tokens == 1 and o != nullptr, every pointer
//           and row 16-byte aligned (PipelineEligible): slots [batch]; q, k
//           [batch, h_qk, d_k]; v [batch, h_v, d_v]; g [batch, h_v] (GDN) or
//           [batch, h_v, d_k] (KDA); beta [batch, h_v]; o [batch, h_v, d_v].
//   sl_in   the stage layout (StageOffsets; stages, scratch_bytes, tma_rows
//           from the launcher); for kFixed its offsets become the constants
//           of FixedShapeStageOffsets (FixedStageLayout).
//   tmap    the pool as 128-byte rows (EncodePoolTensorMap) when
//           sl.tma_rows > 0: fixed-shape heads then arrive 128-byte swizzled.
//   kFixed  the 128 x 128 fixed-shape layout; kDtype: the input dtype when
//           fixed at compile time (kFixed: 0 fp32, 1 bf16, 2 fp16), else -1.
//   grid    min(items, resident CTAs) persistent CTAs of
//           MakeDecodeTiling(d_k, d_v).threads threads (2 per SM).
//   smem    dynamic: sl.scratch_bytes + sl.stages * sl.bytes, stages
//           1024-byte aligned (a misaligned one traps); static: the full /
//           empty mbarriers of each stage and the producers' scalar slots.
//   trusts  the binding's checks; with p.early_heads the previous kernel of
//           the stream writes neither slots nor pool; with p.defer_writes it
//           is the validation kernel: every thread waits for it before its
//           first global write and exits when its verdict is set.
//
// Synchronization (no CTA-wide barrier per item): the two row warps of a
// column stripe exchange their column sums through a named barrier of their
// own (TokenStep<.., true>); a stage is released by each warp after its last
// read of it (an arrival on empty[stage], expected from every warp), and
// the producer of a later item (for the CTA's j-th item, lane 0 of warp
// j % stripes, a row-warp-0 warp) refills it once that phase completed. The
// item's scalars (slot, beta, exp(g)) ride in the stage header, published
// by the stage's full barrier. So warps of different stripes drift freely
// within the staged items and never wait on each other's work; only a
// producer waits, for a stage every warp released long before (except with
// a single stage).
// No deadlock: the lowest warp, at pass n, waits only for item n's stage,
// staged at pass n - stages + 1 < n by a warp that is at pass >= n, and a
// producer's empty barrier needs releases of item n - 1, which every warp
// at pass >= n has given.
template <StateFormat F, bool kFixed, int kDtype>
__global__ void __launch_bounds__(kMaxTileThreads, 2)
    PipelinedDecodeKernel(const RecurrenceParams p, const StageLayout sl_in,
                          const __grid_constant__ CUtensorMap tmap) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full[kMaxStages];   // stage staged (producer + copies)
  __shared__ __align__(8) uint64_t empty[kMaxStages];  // stage read by every warp
  static_assert(!kFixed || !IsStagedFormat(F), "fixed-shape fp32 heads run StagedFpDecodeKernel");
  const StageLayout sl = FixedStageLayout<F, kFixed, kDtype>(sl_in);
  // early: the first items' slots and heads are staged before the wait for
  // the previous kernel (p.early_heads: it writes neither); only heads that
  // arrive by tensor map (an out-of-range row reads zeros, no fault), and
  // only for launches whose items all fit the first stages (small batches;
  // measurements: docs/BENCHMARKS.md, "Kernel design notes").
  // defer: p.defer_writes; every thread waits before its first write
  // (verdict_failed, in the item loop), everything before it only reads.
  const bool defer = p.defer_writes;
  const bool early = !defer && kFixed && p.early_heads && sl.tma_rows > 0 &&
                     p.batch * p.geo.h_v <= sl.stages * static_cast<int>(gridDim.x);
  if (!early && !defer) WaitForPrecedingGrids();  // before any global access (grid_dependency.cuh)
  AllowDependentLaunch();
  const HeadGeometry geo = EffectiveGeometry<F, kFixed>(p.geo);
  const PackedHeadLayout& l = geo.layout;
  const DecodeTiling t = MakeDecodeTiling(geo.d_k, geo.d_v);
  const LaneMap m = MakeLaneMap<LaneWidth<F>()>(t.stripes);
  constexpr ValueTransform kVt = ValueTransformOf(F);
  const int items = p.batch * geo.h_v;
  const int stride = gridDim.x;
  if (!early && !defer && ValidationFailed(p)) return;
  float* scratch = reinterpret_cast<float*>(smem_raw);
  // Stages start 1024-byte aligned (the swizzle pattern's period): the
  // dynamic shared memory is declared 1024-aligned and scratch_bytes is a
  // multiple of 1024 (checked at the end: a misaligned stage fails the launch;
  // the GPU tests would also see wrong bytes).
  uint8_t* stage_base = smem_raw + sl.scratch_bytes;

  // The producer role rotates: the CTA's j-th item (blockIdx.x + j * stride)
  // is staged by lane 0 (with KDA's producer decays, below, the whole warp)
  // of warp j % producers (the first `stages` by thread
  // 0 up front), so the extra work is spread over warps instead of pacing
  // the CTA at warp 0's speed. The producers are the row-warp-0 warps (one
  // per stripe): they hold the FP16 hi rows of mixed formats (cheaper than
  // affine rows), so they wait at the stripe barrier for their partners;
  // the staging fills that wait. Each producer
  // fetches the scalars of its next item one staging ahead (4-byte cp.async
  // into its own slot, completed by itself before it stages the item): no
  // producer waits on a dependent DRAM read.
  const int producers = t.stripes;
  __shared__ float ahead_beta[kMaxTileThreads / 32], ahead_g[kMaxTileThreads / 32];
  __shared__ int32_t ahead_slot[kMaxTileThreads / 32];
  // Fetches the scalars of the CTA's j-th item into slot w.
  const auto fetch_ahead = [&](int w, int j) {
    const int it = blockIdx.x + j * stride;
    if (it < items) {
      CopyAsync4(&ahead_beta[w], p.beta + it);
      if (!geo.kda) CopyAsync4(&ahead_g[w], p.g + it);
      CopyAsync4(&ahead_slot[w], p.slots + BatchOf(it, geo.h_v));
    }
    CpAsyncCommit();
  };
  // Whether the producers write KDA's gate decays (see fetch_gates).
  constexpr bool kProducerDecays =
      LoRowCodec(F) == RowCodec::kAffineU8 || LoRowCodec(F) == RowCodec::kAffineU4;
  // Stages the CTA's j-th item, whose scalars are in slot w (complete), into
  // stage s (gates_decayed: below; thread 0's first items always false).
  const auto issue = [&](int s, int w, int j, bool gates_decayed = false) {
    IssueItem<1>(p, geo, sl, &tmap, stage_base + s * sl.bytes, &full[s], blockIdx.x + j * stride,
                 ahead_slot[w], ahead_beta[w], geo.kda ? 0.0f : DecayExp(ahead_g[w]),
                 gates_decayed);
  };
  // KDA: the whole producer warp also fetches the gates of its next item
  // one staging ahead (16-byte cp.async per lane into the warp's gates slot
  // of the scratch, PipelinedScratchFloats) and, at its turn, writes their
  // decays into the stage, so each channel's DecayExp runs once per item
  // instead of once per stripe in every warp's row inputs (4x); the
  // stage's consumers read decays (StagedGatesDecayed). The first `stages`
  // items (thread 0's) carry the gates as copied. Only for the formats with
  // affine rows, where it measured faster (docs/BENCHMARKS.md, "Kernel
  // design notes").
  const bool producer_decays = kProducerDecays && geo.kda;
  const auto gates_ahead = [&] {
    return scratch + ScratchFloats(t, geo.d_v) + m.warp * GatesAheadFloats(t);
  };
  const auto fetch_gates = [&](int j) {  // every lane of a producer warp
    const int it = blockIdx.x + j * stride;
    if (it < items) {
      for (int c = 4 * m.lane; c < geo.d_k; c += 128) {
        CopyAsync16(gates_ahead() + c, p.g + int64_t{it} * geo.d_k + c);
      }
    }
    CpAsyncCommit();
  };
  // The producer of the CTA's j-th item (j >= stages; lane 0, and with
  // producer_decays the whole warp): stages it into stage s (its decays
  // first), then fetches the scalars (and gates) of its next one.
  const auto stage_item = [&](int s, int j) {
    CpAsyncWaitAll();
    if (producer_decays) DecayGates(stage_base + s * sl.bytes, sl, gates_ahead(), m.lane, geo.d_k);
    if (m.lane == 0) {
      issue(s, m.warp, j, producer_decays);
      fetch_ahead(m.warp, j + producers);
    }
    if (producer_decays) fetch_gates(j + producers);
  };
  // Early heads: bit s of `headed` (thread 0) says the first-stage item s's
  // head copy is in flight on full[s], its bytes expected, no arrival yet.
  uint32_t headed = 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < sl.stages; ++s) {
      MbarrierInit(&full[s], 1);
      MbarrierInit(&empty[s], t.warps);
    }
    FenceMbarrierInit();
    if (early) {
#pragma unroll 1
      for (int s = 0; s < sl.stages && blockIdx.x + s * stride < items; ++s) {
        CopyAsync4(&ahead_slot[s], p.slots + BatchOf(blockIdx.x + s * stride, geo.h_v));
      }
      CpAsyncCommit();
      CpAsyncWaitAll();
#pragma unroll 1
      for (int s = 0; s < sl.stages && blockIdx.x + s * stride < items; ++s) {
        const int32_t slot = ahead_slot[s];
        if (slot < 0 || slot >= p.pool.num_slots) continue;  // staged after the wait
        uint8_t* stage = stage_base + s * sl.bytes;
        const ItemCopies<1> c(p, geo, blockIdx.x + s * stride);
        const int row0 = StageHeadRow<1>(p, geo, sl, stage, c, slot);
        MbarrierExpectTxOnly(&full[s], c.hb);
        CopyItemHead<1>(p, geo, sl, &tmap, stage, &full[s], c, slot, row0);
        headed |= 1u << s;
      }
    }
  }
  if (early) {
    WaitForPrecedingGrids();  // every thread, before the rest of its global accesses
    if (ValidationFailed(p)) {
      // Nothing is written; the early heads land before the CTA exits.
#pragma unroll 1
      for (int s = 0; s < sl.stages; ++s) {
        if ((headed >> s & 1u) != 0) {
          MbarrierArrive(&full[s]);
          MbarrierWait(&full[s], 0);
        }
      }
      return;
    }
  }
  if (threadIdx.x == 0) {
    // An early head's inputs need no scalar: their copies go first, and
    // the scalars' round trip overlaps them.
#pragma unroll 1
    for (int s = 0; s < sl.stages; ++s) {
      if ((headed >> s & 1u) != 0) {
        const ItemCopies<1> c(p, geo, blockIdx.x + s * stride);
        MbarrierExpectTxOnly(&full[s], c.input_bytes);
        CopyItemInputs<1>(p, geo, sl, stage_base + s * sl.bytes, &full[s], c);
      }
    }
    // The first `stages` items: all scalars in one round trip (slot s of
    // item s; stages <= warps), then their copies (an early head's stage
    // just gets its header and the arrival).
#pragma unroll 1
    for (int s = 0; s < sl.stages; ++s) fetch_ahead(s, s);
    CpAsyncWaitAll();
#pragma unroll 1  // one copy of IssueItem's code here (instruction cache)
    for (int s = 0; s < sl.stages && blockIdx.x + s * stride < items; ++s) {
      if ((headed >> s & 1u) != 0) {
        WriteItemScalars(stage_base + s * sl.bytes, sl, ahead_slot[s], ahead_beta[s],
                         geo.kda ? 0.0f : DecayExp(ahead_g[s]));
        MbarrierArrive(&full[s]);  // publishes the header
      } else {
        issue(s, s, s);
      }
    }
  }
  __syncthreads();  // barriers initialized; the prologue's slots are read
  // Every producer's first item j >= stages.
  if (m.warp < producers) {
    const int j = sl.stages + (m.warp - sl.stages % producers + producers) % producers;
    if (m.lane == 0) fetch_ahead(m.warp, j);
    if (producer_decays) fetch_gates(j);
  }

  // defer: true until this thread waited for the validation kernel. Every
  // thread calls verdict_failed in its first pass (n = 0: every CTA has an
  // item), before that pass's first global write and before any refill, so
  // a failed call is known uniformly (one verdict) while the only copies in
  // flight are the prologue's: stages 1 .. stages - 1 (thread 0, phase 0 of
  // full[]) and the producers' cp.async of scalars and gates; drain() lets
  // them land before the CTA exits.
  bool pending = defer;
  const auto verdict_failed = [&]() -> bool {
    if (!pending) return false;
    pending = false;
    WaitForPrecedingGrids();
    return ValidationFailed(p);
  };
  const auto drain = [&] {
    CpAsyncWaitAll();
    if (threadIdx.x == 0) {
#pragma unroll 1
      for (int s = 1; s < sl.stages && blockIdx.x + s * stride < items; ++s) {
        MbarrierWait(&full[s], 0);
      }
    }
  };

  // The item's value head, kept incrementally (a runtime modulo per use
  // costs ~20 instructions).
  const int h_step = stride % geo.h_v;
  int h = blockIdx.x % geo.h_v;
  // Pass n uses stage st = n % stages in phase parity (n / stages) & 1.
  int st = 0;
  uint32_t parity = 0;
  for (int n = 0, item = blockIdx.x; item < items;
       ++n, item += stride, h = h + h_step >= geo.h_v ? h + h_step - geo.h_v : h + h_step,
           parity ^= st + 1 == sl.stages ? 1u : 0u, st = st + 1 == sl.stages ? 0 : st + 1) {
    uint8_t* stage = stage_base + st * sl.bytes;
    const LaneMap m = MakeLaneMap<LaneWidth<F>()>(t.stripes, OpaqueThreadIdx());
    // After this warp's last read of the stage.
    const auto release = [&] {
      __syncwarp();
      if (m.lane == 0) MbarrierArrive(&empty[st]);
    };
    // The producer of the item to stage (after its column-sum exchange,
    // where the sums' registers are free): with several stages, refills the
    // stage of the previous item, which every warp released long ago (so it
    // rarely waits), with the item stages - 1 passes ahead; with one stage,
    // refills this item's stage once every warp released it.
    const auto refill = [&] {
      const bool one = sl.stages == 1;
      const int j = n + (one ? 1 : sl.stages - 1);  // the CTA-local item to stage
      if ((m.lane != 0 && !producer_decays) ||
          static_cast<unsigned>(j) % producers != static_cast<unsigned>(m.warp)) {
        return;  // (unsigned: j >= 0, a mask for the usual power-of-two stripe count)
      }
      if ((!one && n == 0) || item + (j - n) * stride >= items) return;  // n == 0: staged up front
      const int sx = one ? st : (st == 0 ? sl.stages - 1 : st - 1);
      if (m.lane == 0) MbarrierWait(&empty[sx], one || st > 0 ? parity : parity ^ 1u);
      if (producer_decays) __syncwarp();  // the stage is free for every lane's writes
      stage_item(sx, j);
    };
    MbarrierWait(&full[st], parity);
    const int32_t slot = *reinterpret_cast<const int32_t*>(stage + sl.header);
    float* o = p.o + int64_t{item} * geo.d_v;
    if (slot < 0) {
      if (verdict_failed()) {
        drain();
        return;
      }
      if (m.row_warp == 0) o[m.jc] = 0.0f;
      release();
      refill();
      continue;
    }
    const float beta = reinterpret_cast<const float*>(stage + sl.header)[1];
    const float a_head = reinterpret_cast<const float*>(stage + sl.header)[2];  // exp(g)
    const int32_t head_row = kFixed ? StagedHeadRow(stage, sl) : 0;
    // Registers <- staged inputs, then the staged head decoded with the
    // decay folded in (decode_math.h).
    const uint8_t* head_s = stage + sl.head;
    const SwizzledRef global_ref{SmemAddr(head_s), 0, static_cast<uint32_t>(l.global_offset)};
    const float global_scale = !l.has_global_scale ? 0.0f
                               : kFixed ? LdMeta<Src::kSwizzled, float>(global_ref)
                                        : LdMeta<Src::kShared, float>(head_s + l.global_offset);
    float kk[kTileSteps], qs[kTileSteps], a[kTileSteps];
    const bool gates_decayed = kProducerDecays && geo.kda && StagedGatesDecayed(stage, sl) != 0;
    const RowSource in = StagedRowSource(p, geo, sl, stage, a_head, gates_decayed);
    GatherRowsPaired<kDtype, kFixed>(m, geo.d_k, in, WarpRows(scratch, t, geo.d_v, m), kk, qs, a);
    float s[kTileSteps][kTileColsPerLane];
    LoadItemTile<F, kFixed>(l, head_s, m, global_scale, s, a);
    const int32_t* order_s = reinterpret_cast<const int32_t*>(stage + sl.order);
    const float* scale_s = reinterpret_cast<const float*>(stage + sl.scale);
    // The stripe's two value-axis maps are split between its row warps:
    // row warp 0 computes v' (TokenStep<.., true> passes it on), the last
    // row warp maps o' back (faster: docs/BENCHMARKS.md, "Kernel design
    // notes").
    const float vp = m.row_warp == 0
                         ? StoredValue<kVt, kDtype>(m, p.dtype, stage + sl.v, order_s, scale_s)
                         : 0.0f;
    release();
    const StepScratch sc = MakeScratch(scratch, t, geo.d_v, m, n & 1);
    // kWredSynced: GatherRowsPaired and release() synced the warp since the
    // previous item's reads of sc.wred (TokenStep, StoreItemTile).
    const float os = TokenStep<true, true, false, true>(s, kk, qs, a, vp, beta, m, t, geo.d_v, sc);
    if (verdict_failed()) {  // after the item's compute: it overlaps the validation
      drain();
      return;
    }
    refill();
    WriteBackItem<F, kFixed>(p, geo, m, t, scratch, s, os, o, h, slot, head_row, sc.wred);
  }
  if (threadIdx.x == 0 && (SmemAddr(stage_base) & 1023u) != 0) __trap();
}

}  // namespace
}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_PIPELINED_DECODE_KERNEL_CUH_
