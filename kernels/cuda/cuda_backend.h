// CudaBackend: the GPU implementation of Backend (kernels/backend/backend.h).
//
// Memory is device memory (cudaMalloc, zero-filled). DecodeUpdate / Prefill
// run one fused kernel per call (decode_math.h states its exact arithmetic,
// recurrence_kernels.cuh its design); PackStates / UnpackStates, CopySlots and
// ZeroSlots are one kernel each. Every call is a binding: it checks shapes on
// the host, then runs a validation kernel over the device-resident slots and
// inputs (slot range, duplicates, NaN / Inf in q, k, v, g <= 0, beta in
// [0, 2], as batch_validation.h does on the CPU) and reads back one small
// error block; on any error it returns kInvalidArgument naming the field and
// index, and nothing is written. Calls are synchronous and thread-safe
// without a backend-wide lock: each call leases a call context (its own
// non-blocking stream, error block, pinned read-back and slot bitmap) from
// a free list, enqueues its work there and synchronizes that stream only,
// so calls of different threads on disjoint slots run concurrently on the
// device (the slot pool's exclusive-slot rule is the only ordering). A
// context is made on first need and kept: there are as many as calls ever
// ran at once. Each call is ordered after the work already enqueued on the
// backend stream (Backend::native_stream(): benchmark hooks,
// AttachedSession::OrderAfter's waits). stream_ops() (internal/cuda_stream_ops.h) takes no
// lock and never waits: its calls run on the caller's stream. NewDecodeQueue
// gives the asynchronous decode path (backend.h DecodeQueue): its own
// non-blocking stream, validation block and slot bitmap; validation +
// kernel + a pinned read-back of the block are enqueued without a host wait
// and a completion thread (waiting on a per-update event) reports each
// status. Head shapes need at most 256 threads per head (d_v / 32 *
// ceil(d_k / 64) <= 8, e.g. 128 x 128); Prepare returns kUnimplemented
// otherwise.
//
// This header is plain C++ (no CUDA types) so host code can include it.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Backend> gpu, CreateCudaBackend());
#ifndef STATECACHE_KERNELS_CUDA_CUDA_BACKEND_H_
#define STATECACHE_KERNELS_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend/backend.h"
#include "kernels/cuda/launch_options.h"

namespace statecache {

// A CudaBackend on device 0, or kUnavailable when no usable GPU (compute
// capability 9.0, the kernels are built for sm_90a) is present. Its kernels
// launch with `options` (launch_options.h; the defaults are the production
// paths).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const LaunchOptions& options = {});

// Benchmark hooks on a Backend made by CreateCudaBackend: enqueue the decode
// kernel without validation or synchronization on the backend stream
// (inputs must already be valid), and wait for the backend stream. Later
// synchronous calls are ordered after that work. kInvalidArgument when
// `backend` is not a CUDA backend. early_heads: the kernel may read
// `in.slots` and the pool before the previous kernel on the stream
// completes (it stages its first heads while that kernel finishes): only
// when that kernel writes neither, e.g. a decode of other slots
// (DecodeUpdate and the decode queue always run this way, after their
// validation kernels).
absl::Status CudaEnqueueDecodeUnchecked(Backend& backend, const PreparedModel& model,
                                        const PoolView& pool, int layer, const DecodeInputs& in,
                                        bool early_heads = false);
absl::Status CudaEnqueueCopySlotsUnchecked(Backend& backend, const PoolView& src,
                                           const int32_t* src_slots, const PoolView& dst,
                                           const int32_t* dst_slots, int n);
absl::Status CudaSynchronize(Backend& backend);
// Call contexts made so far: the most synchronous calls that ran at once
// (tests of the concurrency).
absl::StatusOr<int64_t> CudaCallContexts(Backend& backend);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_CUDA_BACKEND_H_
