// Slot copies (snapshot / restore), zeroing, input validation and an L2 flush
// for benchmarks.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/validation_block.cuh"
#include "kernels/cuda/internal/value_checks.cuh"

namespace statecache {
namespace cuda_internal {
namespace {

constexpr int kCopyThreads = 256;
constexpr int kCopyUnroll = 4;
constexpr int64_t kCopyChunk = int64_t{kCopyThreads} * kCopyUnroll * 16;  // bytes per CTA

// grid: (chunks of a slot, n). Four independent 16-byte loads in flight per
// thread, streaming stores.
__global__ void __launch_bounds__(kCopyThreads) CopySlotsKernel(PoolParams src_pool,
                                                              const int32_t* src_slots,
                                                              PoolParams dst_pool,
                                                              const int32_t* dst_slots,
                                                              int64_t slot_bytes,
                                                              const int32_t* abort_if_error) {
  if (ValidationBlockFailed(abort_if_error)) return;
  const int i = blockIdx.y;
  if (src_slots[i] < 0 || dst_slots[i] < 0) return;  // a pair with padding
  const uint4* src = reinterpret_cast<const uint4*>(src_pool.base +
                                                    src_slots[i] * src_pool.slot_stride);
  uint4* dst = reinterpret_cast<uint4*>(dst_pool.base + dst_slots[i] * dst_pool.slot_stride);
  const int64_t words = slot_bytes / 16;
  const int64_t base = int64_t{blockIdx.x} * (kCopyChunk / 16) + threadIdx.x;
  uint4 v[kCopyUnroll];
#pragma unroll
  for (int u = 0; u < kCopyUnroll; ++u) {
    const int64_t w = base + u * kCopyThreads;
    if (w < words) v[u] = __ldcs(src + w);
  }
#pragma unroll
  for (int u = 0; u < kCopyUnroll; ++u) {
    const int64_t w = base + u * kCopyThreads;
    if (w < words) __stcs(dst + w, v[u]);
  }
}

__global__ void __launch_bounds__(kCopyThreads) ZeroSlotsKernel(PoolParams pool,
                                                              const int32_t* slots,
                                                              int64_t slot_bytes) {
  const int32_t slot = slots[blockIdx.y];
  if (slot < 0) return;
  uint4* dst = reinterpret_cast<uint4*>(pool.base + slot * pool.slot_stride);
  const int64_t words = slot_bytes / 16;
  const int64_t base_w = int64_t{blockIdx.x} * (kCopyChunk / 16) + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kCopyUnroll; ++u) {
    const int64_t w = base_w + u * kCopyThreads;
    if (w < words) __stcs(dst + w, make_uint4(0, 0, 0, 0));
  }
}

__global__ void ValidateSlotsKernel(const int32_t* slots, int n, int64_t num_slots,
                                    bool allow_skip, uint32_t* bitmap, int32_t* errors,
                                    int range_field, int dup_field) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int32_t s = slots[i];
    if (s == -1 && allow_skip) continue;
    if (s < 0 || s >= num_slots) {
      atomicMin(errors + range_field, i);
      continue;
    }
    const uint32_t bit = 1u << (s & 31);
    const uint32_t old = atomicOr(bitmap + (s >> 5), bit);
    if (old & bit) atomicMin(errors + dup_field, i);
  }
}

__global__ void ValidateValuesKernel(int dtype, const void* data, int64_t count, int mode,
                                     int32_t* errors, int field) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (IsBadValue(LoadCheckedValue(dtype, data, i), mode)) {
      atomicMin(errors + field, static_cast<int32_t>(i < kNoError - 1 ? i : kNoError - 1));
    }
  }
}

__global__ void ValidateValuesBatchKernel(const ValueChecks checks, int32_t* errors) {
  const ValueCheck& c = checks.check[blockIdx.y];
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < c.count;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (IsBadValue(LoadCheckedValue(c.dtype, c.data, i), c.mode)) {
      atomicMin(errors + c.field, static_cast<int32_t>(i < kNoError - 1 ? i : kNoError - 1));
    }
  }
}

__global__ void ReadFlushKernel(const uint4* buf, int64_t words, float* sink) {
  uint32_t acc = 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcg(buf + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = 1.0f;  // keeps the loads alive
}

}  // namespace

int LaunchCopySlots(const PoolParams& src, const int32_t* src_slots, const PoolParams& dst,
                    const int32_t* dst_slots, int64_t slot_bytes, int n, void* stream,
                    const int32_t* abort_if_error) {
  if (n == 0 || slot_bytes == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((slot_bytes + kCopyChunk - 1) / kCopyChunk),
                  static_cast<unsigned>(n));
  CopySlotsKernel<<<grid, kCopyThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      src, src_slots, dst, dst_slots, slot_bytes, abort_if_error);
  return cudaGetLastError();
}

int LaunchZeroSlots(const PoolParams& pool, const int32_t* slots, int64_t slot_bytes, int n,
                    void* stream) {
  if (n == 0 || slot_bytes == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((slot_bytes + kCopyChunk - 1) / kCopyChunk),
                  static_cast<unsigned>(n));
  ZeroSlotsKernel<<<grid, kCopyThreads, 0, static_cast<cudaStream_t>(stream)>>>(pool, slots,
                                                                                slot_bytes);
  return cudaGetLastError();
}

int LaunchValidateSlots(const int32_t* slots, int n, int64_t num_slots, bool allow_skip,
                        uint32_t* bitmap, int32_t* errors, int range_field, int dup_field,
                        void* stream) {
  if (n == 0) return cudaSuccess;
  const int blocks = (n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024;
  ValidateSlotsKernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      slots, n, num_slots, allow_skip, bitmap, errors, range_field, dup_field);
  return cudaGetLastError();
}

int LaunchValidateValues(int dtype, const void* data, int64_t count, int mode, int32_t* errors,
                         int field, void* stream) {
  if (count == 0) return cudaSuccess;
  const int64_t want = (count + 255) / 256;
  const int blocks = static_cast<int>(want < 2048 ? want : 2048);
  ValidateValuesKernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(dtype, data, count,
                                                                             mode, errors, field);
  return cudaGetLastError();
}

int LaunchValidateValuesBatch(const ValueChecks& checks, int32_t* errors, void* stream) {
  int64_t most = 0;
  for (int i = 0; i < checks.n; ++i) most = checks.check[i].count > most ? checks.check[i].count : most;
  if (checks.n == 0 || most == 0) return cudaSuccess;
  const int64_t want = (most + 255) / 256;
  const dim3 grid(static_cast<unsigned>(want < 512 ? want : 512), static_cast<unsigned>(checks.n));
  ValidateValuesBatchKernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(checks, errors);
  return cudaGetLastError();
}

int LaunchReadFlush(const uint8_t* buf, int64_t bytes, float* sink, void* stream) {
  ReadFlushKernel<<<1024, 512, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const uint4*>(buf), bytes / 16, sink);
  return cudaGetLastError();
}

}  // namespace cuda_internal
}  // namespace statecache
