// Host side of the fused decode / prefill kernels (recurrence_kernels.cuh):
// which kernel a call takes (PipelineEligible, IsStagedFormat, the fixed
// shape), its stages and tensor maps, and the launch itself (Launch<F>, as a
// programmatic dependent: grid_dependency.cuh). Included by
// recurrence_kernel.cu and recurrence_kernel_affine.cu, each instantiating
// Launch<F> for its formats (internal linkage: an anonymous namespace).
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_LAUNCH_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_LAUNCH_CUH_

#include <cuda.h>  // CUtensorMap and its encoder's types (the encoder is fetched at run time)
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "kernels/cuda/internal/format_dispatch.cuh"
#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/recurrence_kernels.cuh"
#include "kernels/cuda/internal/stage_layout.h"

namespace statecache {
namespace cuda_internal {
namespace {

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The bulk-copy path needs 16-byte aligned sources and sizes.
bool PipelineEligible(const RecurrenceParams& p) {
  const HeadGeometry& geo = p.geo;
  const int ds = p.dtype == 0 ? 4 : 2;
  if (p.tokens != 1 || p.o == nullptr) return false;
  if ((geo.d_k * ds) % 16 != 0 || (geo.d_v * ds) % 16 != 0 || (geo.d_k * 4) % 16 != 0 ||
      (geo.d_v * 4) % 16 != 0) {
    return false;
  }
  if (!Aligned16(p.pool.base) || p.pool.slot_stride % 16 != 0 || geo.layout.head_bytes % 16 != 0) {
    return false;
  }
  for (const void* ptr : {static_cast<const void*>(p.q), p.k, p.v,
                          static_cast<const void*>(p.maps.key_perm),
                          static_cast<const void*>(p.maps.value_order),
                          static_cast<const void*>(p.maps.value_scale)}) {
    if (!Aligned16(ptr)) return false;
  }
  return !geo.kda || Aligned16(p.g);
}

// The pipelined kernel's stage. fixed: the fixed-shape kernels' stage
// (FixedShapeStageOffsets). max_smem_per_block: the opt-in limit of one
// CTA's shared memory. forced_stages: LaunchOptions::forced_stages.
StageLayout MakeStageLayout(const RecurrenceParams& p, int max_smem_per_sm,
                            int max_smem_per_block, bool fixed, int forced_stages) {
  const HeadGeometry& geo = p.geo;
  const int ds = p.dtype == 0 ? 4 : 2;
  StageLayout sl = fixed ? FixedShapeStageOffsets(geo.format, ds)
                         : StageOffsets(geo.layout.head_bytes, geo.d_k, geo.d_v, ds, geo.kda,
                                        p.maps.key_perm != nullptr,
                                        p.maps.value_order != nullptr);
  ChooseStages(MakeDecodeTiling(geo.d_k, geo.d_v), geo.d_v, max_smem_per_sm, max_smem_per_block,
               forced_stages, &sl);
  return sl;
}

// The pool as a 2D tensor of 128-byte rows for tensor-map head copies with
// the 128-byte swizzle (Src::kSwizzled); false when the pool does not
// qualify (rows not 128-byte aligned, a head over 256 rows that is not a
// whole number of 256-row boxes, no encoder in the driver).
using TensorMapEncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                       const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                       const cuuint32_t*, CUtensorMapInterleave,
                                       CUtensorMapSwizzle, CUtensorMapL2promotion,
                                       CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder (nullptr when the driver has none).
TensorMapEncodeFn TensorMapEncoder() {
  static const TensorMapEncodeFn encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<TensorMapEncodeFn>(nullptr);
    }
    return reinterpret_cast<TensorMapEncodeFn>(fn);
  }();
  return encode;
}

bool EncodePoolTensorMap(const PoolParams& pool, int64_t head_bytes, CUtensorMap* map,
                         int* box_rows) {
  const TensorMapEncodeFn encode = TensorMapEncoder();
  const int64_t rows_per_head = head_bytes / 128;
  const int64_t pool_rows = pool.num_slots * pool.slot_stride / 128;
  if (encode == nullptr || pool.num_slots <= 0 || head_bytes % 128 != 0 ||
      pool.slot_stride % 128 != 0 || (reinterpret_cast<uintptr_t>(pool.base) & 127) != 0 ||
      (rows_per_head > 256 && rows_per_head % 256 != 0) || pool_rows > (int64_t{1} << 31)) {
    return false;
  }
  *box_rows = static_cast<int>(std::min<int64_t>(rows_per_head, 256));
  const cuuint64_t dims[2] = {128, static_cast<cuuint64_t>(pool_rows)};
  const cuuint64_t strides[1] = {128};
  const cuuint32_t box[2] = {128, static_cast<cuuint32_t>(*box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, pool.base, dims, strides, box,
                elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The pool as a 3D tensor [key rows][S][128 bytes] (S = row_bytes / 128,
// a key row of a FP format's head) for the copies of a head's column parts
// (ColumnParts): a box is S / parts columns of 128 bytes of d_k rows,
// 128-byte swizzled like the 2D map's boxes. False when the pool does not
// qualify.
bool EncodePoolPartsTensorMap(const PoolParams& pool, int64_t row_bytes, int d_k, int parts,
                              CUtensorMap* map) {
  const TensorMapEncodeFn encode = TensorMapEncoder();
  const int64_t s = row_bytes / 128;
  const int64_t pool_bytes = pool.num_slots * pool.slot_stride;
  if (encode == nullptr || pool.num_slots <= 0 || row_bytes % 128 != 0 || s % parts != 0 ||
      pool.slot_stride % row_bytes != 0 || (reinterpret_cast<uintptr_t>(pool.base) & 127) != 0 ||
      d_k < 1 || d_k > 256 || pool_bytes / row_bytes > (int64_t{1} << 31)) {
    return false;
  }
  const cuuint64_t dims[3] = {128, static_cast<cuuint64_t>(s),
                              static_cast<cuuint64_t>(pool_bytes / row_bytes)};
  const cuuint64_t strides[2] = {128, static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[3] = {128, static_cast<cuuint32_t>(s / parts),
                             static_cast<cuuint32_t>(d_k)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, pool.base, dims, strides, box,
                elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// EncodePoolTensorMap (parts == 1) or EncodePoolPartsTensorMap through a
// per-host-thread cache of the last pool and head shape (a decode loop
// launches every layer on one pool; encoding costs host microseconds per
// launch). box_rows: the 2D map's box rows (0 for parts maps).
bool MakePoolTensorMap(const PoolParams& pool, const PackedHeadLayout& layout, int d_k,
                       int parts, CUtensorMap* map, int* box_rows) {
  struct Cached {
    const uint8_t* base = nullptr;
    int64_t num_slots = -1, slot_stride = -1, head_bytes = -1;
    int parts = 0;
    bool ok = false;
    int box_rows = 0;
    CUtensorMap map;
  };
  thread_local Cached cache;
  const int64_t head_bytes = layout.head_bytes;
  if (cache.base != pool.base || cache.num_slots != pool.num_slots ||
      cache.slot_stride != pool.slot_stride || cache.head_bytes != head_bytes ||
      cache.parts != parts) {
    cache.box_rows = 0;
    cache.ok = parts == 1 ? EncodePoolTensorMap(pool, head_bytes, &cache.map, &cache.box_rows)
                          : EncodePoolPartsTensorMap(pool, layout.lo_code_row_bytes, d_k, parts,
                                                     &cache.map);
    cache.base = pool.base;
    cache.num_slots = pool.num_slots;
    cache.slot_stride = pool.slot_stride;
    cache.head_bytes = head_bytes;
    cache.parts = parts;
  }
  if (cache.ok) {
    *map = cache.map;
    *box_rows = cache.box_rows;
  }
  return cache.ok;
}

// Launches a persistent decode kernel (kKernel: PipelinedDecodeKernel or
// StagedFpDecodeKernel, both (params, stage layout, tensor map)) on as
// many CTAs as are resident, at most one per item, as a programmatic
// dependent of the stream's previous kernel (unless
// !LaunchOptions::programmatic_launch: plainly); cudaErrorNotSupported when none can be (the caller falls back to
// RecurrenceKernel).
// The shared-memory attribute (only ever raised, under a lock, so a launch
// never sees it below its size) and the occupancy query run once per
// kernel and shared-memory size; the last (size, blocks per SM) pair
// is cached (it changes only with the dtype / gates / maps of a call). Like
// DeviceLimits, this assumes the process drives one device.
template <auto kKernel>
int LaunchPersistent(const RecurrenceParams& p, const StageLayout& sl, const CUtensorMap& tmap,
                     size_t smem, int sms, int threads, int64_t items, bool programmatic,
                     cudaStream_t st) {
  static std::mutex mu;
  static size_t attribute_smem = 0;            // guarded by mu
  static std::atomic<uint64_t> last_config{0};  // (smem << 32) | blocks per SM; 0 = none
  const uint64_t c = last_config.load(std::memory_order_acquire);
  int per_sm = static_cast<int>(c & 0xffffffffu);
  if (c == 0 || (c >> 32) != smem) {
    std::lock_guard<std::mutex> lock(mu);
    if (smem > attribute_smem) {
      const cudaError_t e = cudaFuncSetAttribute(kKernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem));
      if (e != cudaSuccess) return e;
      attribute_smem = smem;
    }
    const cudaError_t e =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, smem);
    if (e != cudaSuccess) return e;
    last_config.store((uint64_t{smem} << 32) | static_cast<uint32_t>(per_sm),
                      std::memory_order_release);
  }
  if (per_sm == 0) return cudaErrorNotSupported;
  const int64_t grid = std::min<int64_t>(items, int64_t{per_sm} * sms);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.stream = st;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  if (programmatic) {
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kKernel, p, sl, tmap);
}
// launch(std::integral_constant<int, dtype>) for the input dtype of a call
// (0 fp32, 1 bf16, 2 fp16: the fixed-shape kernels' kDtype).
template <typename Launch>
int ForInputDtype(int dtype, Launch launch) {
  switch (dtype) {
    case 0: return launch(std::integral_constant<int, 0>{});
    case 1: return launch(std::integral_constant<int, 1>{});
    case 2: return launch(std::integral_constant<int, 2>{});
    default: return cudaErrorInvalidValue;
  }
}

// StagedFpDecodeKernel<F> for a fixed-shape call whose pool has the parts
// tensor map `tmap`: `items` column halves (StagedStageLayout).
template <StateFormat F>
int LaunchStaged(const RecurrenceParams& p, const LaunchOptions& o, const CUtensorMap& tmap,
                 int sms, int max_smem_per_sm, int max_smem_per_block, int64_t items,
                 cudaStream_t st) {
  const StageLayout sl = StagedStageLayout(F, p.dtype == 0 ? 4 : 2, max_smem_per_sm,
                                           max_smem_per_block, o.forced_stages);
  const size_t smem = sl.scratch_bytes + static_cast<size_t>(sl.stages) * sl.bytes;
  return ForInputDtype(p.dtype, [&](auto dtype) {
    return LaunchPersistent<StagedFpDecodeKernel<F, decltype(dtype)::value>>(
        p, sl, tmap, smem, sms, kStagedThreads, items, o.programmatic_launch, st);
  });
}

template <StateFormat F, bool kFixed>
int LaunchT(const RecurrenceParams& p, const LaunchOptions& o, void* stream) {
  const DecodeTiling t = MakeDecodeTiling(p.geo.d_k, p.geo.d_v);
  const int64_t items = int64_t{p.batch} * p.geo.h_v;  // heads
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (o.pipeline && PipelineEligible(p)) {
    // Read once per process (thread-safe static initialization: launches
    // come from several threads, e.g. the data plane's decode queues).
    struct DeviceLimits {
      int sms = 0;
      int max_smem_per_sm = 0;
      int max_smem_per_block = 0;
    };
    static const DeviceLimits limits = [] {
      DeviceLimits d;
      int dev = 0;
      cudaGetDevice(&dev);
      cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
      cudaDeviceGetAttribute(&d.max_smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
      cudaDeviceGetAttribute(&d.max_smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
      return d;
    }();
    const int sms = limits.sms;
    CUtensorMap tmap{};
    int tma_rows = 0;
    // The fixed tile code expects swizzled heads (the staged kernel: the
    // parts map's column halves); without them the general one runs.
    constexpr int kParts = ColumnParts(F, kFixed);
    const bool fixed = kFixed && MakePoolTensorMap(p.pool, p.geo.layout, p.geo.d_k, kParts,
                                                   &tmap, &tma_rows);
    if constexpr (kParts > 1) {
      if (fixed) {
        const int e = LaunchStaged<F>(p, o, tmap, sms, limits.max_smem_per_sm,
                                      limits.max_smem_per_block, items * kParts, st);
        if (e != cudaErrorNotSupported) return e;
      }
    }
    const bool pipelined_fixed = fixed && kParts == 1;
    StageLayout sl = MakeStageLayout(p, limits.max_smem_per_sm, limits.max_smem_per_block,
                                     pipelined_fixed, o.forced_stages);
    sl.tma_rows = tma_rows;
    const size_t smem = sl.scratch_bytes + static_cast<size_t>(sl.stages) * sl.bytes;
    // A head too large for one stage per CTA takes the direct kernel.
    const bool fits = smem + 1024 <= static_cast<size_t>(limits.max_smem_per_block);
    int e = cudaErrorNotSupported;
    if (fits) {
      if (!pipelined_fixed) {
        e = LaunchPersistent<PipelinedDecodeKernel<F, false, -1>>(
            p, sl, tmap, smem, sms, t.threads, items, o.programmatic_launch, st);
      } else if constexpr (kFixed && kParts == 1) {  // (not instantiated for staged formats)
        e = ForInputDtype(p.dtype, [&](auto dtype) {
          return LaunchPersistent<PipelinedDecodeKernel<F, true, decltype(dtype)::value>>(
              p, sl, tmap, smem, sms, t.threads, items, o.programmatic_launch, st);
        });
      }
    }
    if (e != cudaErrorNotSupported) return e;
  }
  const size_t smem = sizeof(float) * ScratchFloats(t, p.geo.d_v);
  RecurrenceKernel<F, kFixed><<<static_cast<unsigned>(items), t.threads, smem, st>>>(p);
  return cudaGetLastError();
}

template <StateFormat F>
int Launch(const RecurrenceParams& p, const LaunchOptions& o, void* stream) {
  if (int64_t{p.batch} * p.geo.h_v == 0) return cudaSuccess;
  const PackedHeadLayout fixed = FixedShapeHeadLayout(F);
  const bool is_fixed = p.geo.d_k == 128 && p.geo.d_v == 128 &&
                        p.geo.layout.k_hi == fixed.k_hi &&
                        p.geo.layout.head_bytes == fixed.head_bytes;
  return is_fixed ? LaunchT<F, true>(p, o, stream) : LaunchT<F, false>(p, o, stream);
}

}  // namespace

// LaunchRecurrence (launchers.h) for the formats of CUDA unit kRecurrenceAffine
// (the format table; recurrence_kernel_affine.cu).
int LaunchAffineRecurrence(const RecurrenceParams& p, const LaunchOptions& o, void* stream);

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_LAUNCH_CUH_
