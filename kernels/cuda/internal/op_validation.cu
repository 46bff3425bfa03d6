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
constexpr int kMaxBlocksPerRow = 512;

__device__ __forceinline__ void MinError(int32_t* block, int field, int64_t i) {
  atomicMin(block + field, static_cast<int32_t>(i < kNoError - 1 ? i : kNoError - 1));
}
__device__ __forceinline__ uint32_t Bit(int32_t s) { return 1u << (s & 31); }

// The elements of one value check (launchers.h ValueCheck): 16-byte loads
// when the data is 16-byte aligned, element loads for the tail.
__device__ void CheckValues(const ValueCheck& c, int32_t* scratch, int64_t first, int64_t stride) {
  int64_t tail = 0;
  if ((reinterpret_cast<uintptr_t>(c.data) & 15) == 0) {
    const int per = c.dtype == 0 ? 4 : 8;
    const int64_t chunks = c.count / per;
    const uint4* words = static_cast<const uint4*>(c.data);
    for (int64_t j = first; j < chunks; j += stride) {
      const uint4 w4 = __ldg(words + j);
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

// grid: (x blocks, rows). Check row 0 checks slots, row 1 + c checks
// p.values.check[c]; grid row y takes check rows y, y + gridDim.y, ... The last CTA to finish (a counter in the record) runs the
// epilogue: destination-is-source for copies, scratch -> verdict (+ sticky on
// a failure), scratch and bitmap reset, counter reset.
__global__ void __launch_bounds__(kThreads) ValidateOpKernel(const OpValidationParams p) {
  WaitForPrecedingGrids();  // inputs and the record are written by earlier kernels
  AllowDependentLaunch();   // the op kernel waits for this grid before reading the verdict
  int32_t* rec = p.record;
  int32_t* scratch = rec + kRecordScratchWord;
  uint32_t* src_bits = reinterpret_cast<uint32_t*>(rec + kRecordBitmapWord);
  uint32_t* dst_bits = src_bits + RecordBitmapWords(rec[kRecordCapacity]);
  const bool copy = p.dst_slots != nullptr;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int row = blockIdx.y; row <= p.values.n; row += gridDim.y) {
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
    const unsigned total = gridDim.x * gridDim.y;
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
  int64_t most = p.n;
  for (int i = 0; i < p.values.n; ++i) {
    most = p.values.check[i].count > most ? p.values.check[i].count : most;
  }
  // Value rows read 16 bytes (4 to 8 elements) per thread and step.
  const int64_t want = (most / 4 + kThreads - 1) / kThreads;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(want < 1 ? 1 : want < kMaxBlocksPerRow ? want
                                                                                     : kMaxBlocksPerRow),
                        static_cast<unsigned>(1 + p.values.n));
  config.blockDim = dim3(kThreads);
  config.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, ValidateOpKernel, p);
}

int LaunchInitRecord(int32_t* record, int64_t capacity, void* stream) {
  InitRecordKernel<<<1, 256, 0, static_cast<cudaStream_t>(stream)>>>(record, capacity);
  return cudaGetLastError();
}

}  // namespace cuda_internal
}  // namespace statecache
