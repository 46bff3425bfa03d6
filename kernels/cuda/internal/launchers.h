// Host launchers of the CUDA kernels (the middle layer of kernel / launcher /
// binding). They turn runtime sizes into grid shapes and template constants
// and trust their inputs: the binding (cuda_backend.cc) validates first.
// Every launcher is asynchronous on `stream` (a cudaStream_t passed as void*,
// nullptr = legacy default stream) and returns a cudaError_t value as int
// (0 = success). Pointers are device pointers unless stated otherwise.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_LAUNCHERS_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_LAUNCHERS_H_

#include <cstdint>

#include "kernels/cuda/internal/kernel_params.h"
#include "kernels/cuda/launch_options.h"

namespace statecache {
namespace cuda_internal {

// True when the kernels support this head shape (MakeDecodeTiling threads
// <= 256, d_v a multiple of 32).
bool TilingSupported(int d_k, int d_v);

// Fused decode / prefill: dequantize, p.tokens recurrence steps in FP32,
// readout, requantize in place. Which kernel runs (persistent pipelined /
// staged, or one CTA per (batch item, value head)) and how it is launched:
// recurrence_launch.cuh, with `o`'s switches.
int LaunchRecurrence(const RecurrenceParams& p, const LaunchOptions& o, void* stream);

// FP32 natural-order states -> packed slots (pack) and back (unpack).
int LaunchPack(const PackParams& p, void* stream);
int LaunchUnpack(const PackParams& p, void* stream);

// dst slot dst_slots[i] <- src slot src_slots[i]: the first slot_bytes of
// each (a multiple of 16; bases and strides 16-byte aligned); a pair with a
// negative entry is skipped. abort_if_error: a StreamOps verdict block
// (op_record.h, kOpFields words) or nullptr; when any entry is set nothing
// is copied.
int LaunchCopySlots(const PoolParams& src, const int32_t* src_slots, const PoolParams& dst,
                    const int32_t* dst_slots, int64_t slot_bytes, int n, void* stream,
                    const int32_t* abort_if_error = nullptr);
// Zeroes the first slot_bytes of slots[i] (skips -1).
int LaunchZeroSlots(const PoolParams& pool, const int32_t* slots, int64_t slot_bytes, int n,
                    void* stream);

// Slot checks: errors[range_field] = first i with slots[i] outside
// [0, num_slots) (and not -1 when allow_skip), errors[dup_field] = an index i
// whose slot appeared earlier. `bitmap` holds ceil(num_slots / 32) words and
// must be zero on entry. errors[] are minimized with atomicMin.
int LaunchValidateSlots(const int32_t* slots, int n, int64_t num_slots, bool allow_skip,
                        uint32_t* bitmap, int32_t* errors, int range_field, int dup_field,
                        void* stream);

// Value checks over count elements: mode 0 = finite (dtype = DType code),
// mode 1 = finite and <= 0 (g, fp32), mode 2 = finite and in [0, 2] (beta,
// fp32), mode 3 = finite and |x| <= kMaxStateMagnitude (states, fp32;
// kernels/formats/state_bound.h). errors[field] = first bad index.
int LaunchValidateValues(int dtype, const void* data, int64_t count, int mode, int32_t* errors,
                         int field, void* stream);

// Several value checks (as LaunchValidateValues) in one launch, one grid row
// per check. Up to kMaxValueChecks entries.
struct ValueCheck {
  int dtype = 0;
  const void* data = nullptr;
  int64_t count = 0;
  int mode = 0;
  int field = 0;
};
inline constexpr int kMaxValueChecks = 8;
struct ValueChecks {
  ValueCheck check[kMaxValueChecks];
  int n = 0;
};
int LaunchValidateValuesBatch(const ValueChecks& checks, int32_t* errors, void* stream);

// Reads `bytes` of `buf` (evicting L2) and writes one float to *sink.
int LaunchReadFlush(const uint8_t* buf, int64_t bytes, float* sink, void* stream);

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_LAUNCHERS_H_
