// The StreamOps validation kernel and record initialization
// (op_validation.h; record layout in op_record.h).
#include <cuda_runtime.h>

#include "kernels/cuda/internal/grid_dependency.cuh"
#include "kernels/cuda/internal/op_record.h"
#include "kernels/cuda/internal/op_validation.h"
#include "kernels/cuda/internal/value_checks.cuh"

namespace statecache {
namespace cuda_internal {
namespace {

constexpr int kThreads = 256;
// 16-byte loads in flight per thread and pass of CheckValues; the launch
// gives a check one pass per thread where the grid stays under
// kMaxBlocks (the decode checks up to B = 512 bf16 / 256 fp32).
constexpr int kChunksPerThread = 8;
constexpr int kMaxBlocks = 1024;

// The grid: row r (0 = the slot checks, 1 + c = values.check[c]) takes
// blocks [first_block[r], first_block[r + 1]).
struct ValidateGrid {
  int first_block[kMaxValueChecks + 2];
};

__device__ __forceinline__ void MinError(int32_t* block, int field, int64_t i) {
  atomicMin(block + field, static_cast<int32_t>(i < kNoError - 1 ? i : kNoError - 1));
}
__device__ __forceinline__ uint32_t Bit(int32_t s) { return 1u << (s & 31); }

// One 16-byte chunk (chunk index j) of a value check.
__device__ __forceinline__ void CheckChunk(const ValueCheck& c, int32_t* scratch, int64_t j,
                                           const uint4& w4) {
  const int per = c.dtype == 0 ? 4 : 8;
  const uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
  for (int e = 0; e < per; ++e) {
    float x;
    if (c.dtype == 0) {
      x = __uint_as_float(w[e]);
    } else {
      const uint16_t b = static_cast<uint16_t>(w[e >> 1] >> (16 * (e & 1)));
      x = c.dtype == 1 ? Bf16BitsToFloat(b) : HalfBitsToFloat(b);
    }
    if (IsBadValue(x, c.mode)) {
      MinError(scratch, c.field, j * per + e);
      break;
    }
  }
}

// The elements of one value check (launchers.h ValueCheck): 16-byte loads
// when the data is 16-byte aligned (kChunksPerThread issued before any is
// checked, so a pass costs one memory latency), element loads for the tail.
__device__ void CheckValues(const ValueCheck& c, int32_t* scratch, int64_t first, int64_t stride) {
  int64_t tail = 0;
  if ((reinterpret_cast<uintptr_t>(c.data) & 15) == 0) {
    const int per = c.dtype == 0 ? 4 : 8;
    const int64_t chunks = c.count / per;
    const uint4* words = static_cast<const uint4*>(c.data);
    for (int64_t j0 = first; j0 < chunks; j0 += stride * kChunksPerThread) {
      uint4 w[kChunksPerThread];
#pragma unroll
      for (int u = 0; u < kChunksPerThread; ++u) {
        const int64_t j = j0 + u * stride;
        if (j < chunks) w[u] = __ldg(words + j);
      }
#pragma unroll
      for (int u = 0; u < kChunksPerThread; ++u) {
        const int64_t j = j0 + u * stride;
        if (j < chunks) CheckChunk(c, scratch, j, w[u]);
      }
    }
    tail = chunks * per;
  }
  for (int64_t i = tail + first; i < c.count; i += stride) {
    if (IsBadValue(LoadCheckedValue(c.dtype, c.data, i), c.mode)) MinError(scratch, c.field, i);
  }
}

// The slot value a failure names (ErrorBlockStatus's order of slot fields).
__device__ int32_t OffendingSlot(const OpValidationParams& p, const int32_t* f) {
  if (f[kErrSlotRange] != kNoError) return p.slots[f[kErrSlotRange]];
  if (f[kErrSlotDuplicate] != kNoError) return p.slots[f[kErrSlotDuplicate]];
  if (p.dst_slots == nullptr) return -1;
  if (f[kErrDstSlotRange] != kNoError) return p.dst_slots[f[kErrDstSlotRange]];
  if (f[kErrDstSlotDuplicate] != kNoError) return p.dst_slots[f[kErrDstSlotDuplicate]];
  if (f[kErrDstIsSource] != kNoError) return p.dst_slots[f[kErrDstIsSource]];
  return -1;
}

// 1D grid in rows (ValidateGrid): row 0 checks slots, row 1 + c checks
// p.values.check[c]. The last CTA to finish (a counter in the record) runs
// the epilogue: destination-is-source for copies, scratch -> verdict (+
// sticky on a failure), scratch and bitmap reset, counter reset.
// Launched as a programmatic dependent; it waits for the previous kernel
// before anything else and only then allows the op kernel to launch, which
// is what RecurrenceParams::defer_writes relies on (grid_dependency.cuh).
__global__ void __launch_bounds__(kThreads) ValidateOpKernel(const OpValidationParams p,
                                                             const ValidateGrid grid) {
  WaitForPrecedingGrids();  // inputs and the record are written by earlier kernels
  AllowDependentLaunch();   // only after the wait (defer_writes)
  int32_t* rec = p.record;
  int32_t* scratch = rec + kRecordScratchWord;
  uint32_t* src_bits = reinterpret_cast<uint32_t*>(rec + kRecordBitmapWord);
  uint32_t* dst_bits = src_bits + RecordBitmapWords(rec[kRecordCapacity]);
  const bool copy = p.dst_slots != nullptr;
  int row = 0;
  while (static_cast<int>(blockIdx.x) >= grid.first_block[row + 1]) ++row;
  const int row_blocks = grid.first_block[row + 1] - grid.first_block[row];
  const int64_t first =
      int64_t{static_cast<int>(blockIdx.x) - grid.first_block[row]} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{row_blocks} * blockDim.x;
  {
    if (row == 0) {
      if (first == 0 && p.fence != nullptr && *p.fence != 0) MinError(scratch, kErrFenced, 0);
      for (int64_t i = first; i < p.n; i += stride) {
        const int32_t s = p.slots[i];
        const int32_t d = copy ? p.dst_slots[i] : 0;
        if (s == -1 || d == -1) continue;  // padding
        if (s < 0 || s >= p.num_slots) {
          MinError(scratch, kErrSlotRange, i);
          continue;
        }
        if (!copy) {
          if (atomicOr(src_bits + (s >> 5), Bit(s)) & Bit(s)) {
            MinError(scratch, kErrSlotDuplicate, i);
          }
          continue;
        }
        if (d < 0 || d >= p.num_slots) {
          MinError(scratch, kErrDstSlotRange, i);
          continue;
        }
        atomicOr(src_bits + (s >> 5), Bit(s));
        if (atomicOr(dst_bits + (d >> 5), Bit(d)) & Bit(d)) {
          MinError(scratch, kErrDstSlotDuplicate, i);
        }
      }
    } else {
      CheckValues(p.values.check[row - 1], scratch, first, stride);
    }
  }

  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned total = gridDim.x;
    last = atomicAdd(reinterpret_cast<unsigned*>(rec + kRecordCtaCounter), 1u) == total - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (copy) {
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) {
      const int32_t s = p.slots[i];
      const int32_t d = p.dst_slots[i];
      if (s < 0 || s >= p.num_slots || d < 0 || d >= p.num_slots) continue;
      if (atomicOr(src_bits + (d >> 5), 0u) & Bit(d)) MinError(scratch, kErrDstIsSource, i);
    }
    __syncthreads();
  }
  __shared__ int32_t fields[kOpFields];
  if (threadIdx.x < kOpFields) fields[threadIdx.x] = atomicAdd(scratch + threadIdx.x, 0);
  __syncthreads();
  if (threadIdx.x == 0) {
    bool failed = false;
    for (int f = 0; f < kOpFields; ++f) failed |= fields[f] != kNoError;
    if (failed && rec[kRecordFailedCalls]++ == 0) {
      for (int f = 0; f < kOpFields; ++f) rec[kRecordStickyWord + f] = fields[f];
      rec[kRecordFirstOp] = p.op;
      rec[kRecordFirstLayer] = p.layer;
      rec[kRecordFirstSlot] = OffendingSlot(p, fields);
      rec[kRecordFirstPoolSlots] = static_cast<int32_t>(p.num_slots);
    }
    rec[kRecordCtaCounter] = 0;
  }
  if (threadIdx.x < kOpFields) {
    // The op kernels read the first kNumValidationFields words: a failure
    // only in a later field marks word 0 as well.
    int32_t v = fields[threadIdx.x];
    if (threadIdx.x == 0) {
      for (int f = kNumValidationFields; f < kOpFields; ++f) v = fields[f] != kNoError ? 0 : v;
    }
    rec[kRecordVerdictWord + threadIdx.x] = v;
    scratch[threadIdx.x] = kNoError;
  }
  for (int i = threadIdx.x; i < p.n; i += blockDim.x) {
    const int32_t s = p.slots[i];
    if (s >= 0 && s < p.num_slots) src_bits[s >> 5] = 0;
    if (copy) {
      const int32_t d = p.dst_slots[i];
      if (d >= 0 && d < p.num_slots) dst_bits[d >> 5] = 0;
    }
  }
}

__global__ void InitRecordKernel(int32_t* rec, int64_t capacity) {
  const int64_t words = kRecordBitmapWord + 2 * RecordBitmapWords(capacity);
  for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
    int32_t v = 0;
    if (w >= kRecordStickyWord && w < kRecordScratchWord + kOpFields) v = kNoError;
    if (w == kRecordMagic) v = kCudaRecordMagic;
    if (w == kRecordCapacity) v = static_cast<int32_t>(capacity);
    rec[w] = v;
  }
}

}  // namespace

int LaunchValidateOp(const OpValidationParams& p, void* stream) {
  // Blocks per row: row 0 one slot per thread (its atomics' results are
  // waited on one by one), a value row its 16-byte chunks (4 or 8 values)
  // over kChunksPerThread per thread; at least 1. When the sum exceeds
  // kMaxBlocks every row is scaled down (the rows loop).
  int64_t want[kMaxValueChecks + 1];
  int64_t total = 0;
  for (int r = 0; r <= p.values.n; ++r) {
    if (r == 0) {
      want[r] = (p.n + kThreads - 1) / kThreads;
    } else {
      const ValueCheck& c = p.values.check[r - 1];
      const int per = c.dtype == 0 ? 4 : 8;
      const int64_t per_block = int64_t{kThreads} * kChunksPerThread;
      want[r] = ((c.count + per - 1) / per + per_block - 1) / per_block;
    }
    if (want[r] < 1) want[r] = 1;
    total += want[r];
  }
  ValidateGrid grid;
  grid.first_block[0] = 0;
  for (int r = 0; r <= p.values.n; ++r) {
    int64_t b = want[r];
    if (total > kMaxBlocks) b = b * kMaxBlocks / total > 1 ? b * kMaxBlocks / total : 1;
    grid.first_block[r + 1] = grid.first_block[r] + static_cast<int>(b);
  }
  for (int r = p.values.n + 2; r < kMaxValueChecks + 2; ++r) {
    grid.first_block[r] = grid.first_block[p.values.n + 1];
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid.first_block[p.values.n + 1]));
  config.blockDim = dim3(kThreads);
  config.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, ValidateOpKernel, p, grid);
}

int LaunchInitRecord(int32_t* record, int64_t capacity, void* stream) {
  InitRecordKernel<<<1, 256, 0, static_cast<cudaStream_t>(stream)>>>(record, capacity);
  return cudaGetLastError();
}

}  // namespace cuda_internal
}  // namespace statecache
