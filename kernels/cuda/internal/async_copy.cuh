// Asynchronous copies into shared memory and their mbarriers (sm_90), shared
// by the decode kernels (recurrence_kernels.cuh, stepquant_kernel.cu,
// stepquant_tile_kernel.cu). Thin wrappers over the PTX instructions:
//
//   if (threadIdx.x == 0) { MbarrierInit(&bar, 1); FenceMbarrierInit(); }
//   __syncthreads();
//   thread 0: MbarrierExpectTx(&bar, bytes); BulkCopy(dst, src, bytes, &bar);
//   all:      MbarrierWait(&bar, phase_parity);   // then read dst
//
// Contracts: dst, src and byte counts of BulkCopy are multiples of 16; the
// shared-memory destination of TensorCopy2D is 128-byte aligned (1024 for
// the 128-byte swizzle); CopyAsync4 / 16 complete at CpAsyncWaitAll in the
// issuing thread only (a barrier must follow before other threads read).
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_ASYNC_COPY_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_ASYNC_COPY_CUH_

#include <cuda.h>  // CUtensorMap
#include <cstdint>

namespace statecache {
namespace cuda_internal {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarrierInit(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(arrivals)
               : "memory");
}
__device__ __forceinline__ void FenceMbarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival that also expects `bytes` of transactions (the copies that
// complete on `bar`).
__device__ __forceinline__ void MbarrierExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}
// Expects `bytes` more transactions on `bar` without arriving (copies issued
// before the arrival that completes the phase: the decode kernel's early
// heads).
__device__ __forceinline__ void MbarrierExpectTxOnly(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}
// One arrival without transactions (a stage staged with no copies).
__device__ __forceinline__ void MbarrierArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddr(bar)) : "memory");
}
// Blocks until the phase with the given parity completed (acquire).
__device__ __forceinline__ void MbarrierWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}

// Bulk global -> shared copy completing on `bar`.
__device__ __forceinline__ void BulkCopy(void* dst, const void* src, int bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}

// 2D tensor-map copy of the box at (x, y) completing on `bar` (tmap: a
// __grid_constant__ kernel parameter).
__device__ __forceinline__ void TensorCopy2D(void* dst, const CUtensorMap* tmap, int x, int y,
                                             uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(x), "r"(y), "r"(SmemAddr(bar))
      : "memory");
}

// 3D tensor-map copy of the box at (x, y, z) completing on `bar`.
__device__ __forceinline__ void TensorCopy3D(void* dst, const CUtensorMap* tmap, int x, int y,
                                             int z, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(x), "r"(y), "r"(z), "r"(SmemAddr(bar))
      : "memory");
}

// 3D tensor-map copy of shared memory at `src` to the box at (x, y, z) of
// global memory (the inverse of TensorCopy3D, same box and swizzle), in the
// issuing thread's bulk async-group. Before the copy, every thread that wrote
// src must have run FenceProxyAsyncShared and be ordered before the issuer
// (e.g. by an mbarrier); src may be overwritten after BulkWaitGroupRead0.
__device__ __forceinline__ void TensorStore3D(const CUtensorMap* tmap, int x, int y, int z,
                                              const void* src) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
          reinterpret_cast<uint64_t>(tmap)),
      "r"(x), "r"(y), "r"(z), "r"(SmemAddr(src))
      : "memory");
}
// Closes the issuing thread's bulk async-group of the stores issued so far.
__device__ __forceinline__ void BulkCommitGroup() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Waits until every committed bulk store of this thread has read its source.
__device__ __forceinline__ void BulkWaitGroupRead0() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// Orders this thread's earlier generic-proxy shared-memory accesses before
// later async-proxy (bulk copy) accesses of the same memory.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// 4-byte asynchronous global -> shared copy (completes at CpAsyncWaitAll).
__device__ __forceinline__ void CopyAsync4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(SmemAddr(dst)), "l"(src)
               : "memory");
}
// 16-byte asynchronous global -> shared copy (both 16-byte aligned; completes
// at CpAsyncWaitAll like CopyAsync4).
__device__ __forceinline__ void CopyAsync16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(SmemAddr(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Thread 0 of a CTA that walks items first, first + stride, ... through
// `stages` double-buffered stages: initializes one mbarrier per stage (one
// arrival: the issuer's) and issues the first items, issue(stage, item).
// Every thread must __syncthreads() afterwards.
template <typename Issue>
__device__ __forceinline__ void StartStages(uint64_t* bars, int stages, int first, int stride,
                                            int items, Issue issue) {
  for (int s = 0; s < stages; ++s) MbarrierInit(&bars[s], 1);
  FenceMbarrierInit();
  for (int s = 0; s < stages; ++s) {
    const int item = first + s * stride;
    if (item < items) issue(s, item);
  }
}

// Named barriers (id 1..15; 0 is __syncthreads) over `threads` threads, a
// multiple of 32: NamedSync blocks, NamedArrive only signals.
__device__ __forceinline__ void NamedSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_ASYNC_COPY_CUH_
