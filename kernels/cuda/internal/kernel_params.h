// Plain parameter structs passed by value to the CUDA kernels (FlashInfer
// style: every pointer field carries its shape and memory space). Host code
// fills them in the binding (cuda_backend.cc); no CUDA types appear here.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_KERNEL_PARAMS_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_KERNEL_PARAMS_H_

#include <cstdint>

#include "kernels/formats/format.h"
#include "kernels/formats/head_layout.h"

namespace statecache {
namespace cuda_internal {

// Geometry + packed layout of one head, shared by every kernel.
struct HeadGeometry {
  StateFormat format = StateFormat::kFp32;
  PackedHeadLayout layout;  // byte layout of one packed head
  int h_qk = 0;
  int h_v = 0;
  int d_k = 0;
  int d_v = 0;
  bool kda = false;
  float scale = 0.0f;       // readout scale applied to q
};

// Per-layer constants (device memory, uploaded by Prepare).
struct LayerMaps {
  const int32_t* key_perm = nullptr;     // [h_v][d_k] or nullptr for identity
  const int32_t* value_order = nullptr;  // [h_v][d_v] damp-sr only
  const float* value_scale = nullptr;    // [h_v][d_v] damp-sr only
};

// Pool: num_slots slots of [layers][h_v][head_bytes] device bytes, slot s
// at base + s * slot_stride (PoolView::stride()).
struct PoolParams {
  uint8_t* base = nullptr;
  int64_t slot_stride = 0;
  int layers = 0;
  int64_t num_slots = 0;  // extent of the pool (0: unknown; no tensor-map copies)
};

// Decode (tokens == 1) and prefill: one CTA per (batch item, value head).
struct RecurrenceParams {
  HeadGeometry geo;
  LayerMaps maps;
  PoolParams pool;
  int layer = 0;
  int batch = 0;
  int tokens = 1;
  const int32_t* slots = nullptr;  // [batch], -1 = skip
  int dtype = 0;                   // DType of q, k, v
  const void* q = nullptr;         // [batch, tokens, h_qk, d_k]
  const void* k = nullptr;         // [batch, tokens, h_qk, d_k]
  const void* v = nullptr;         // [batch, tokens, h_v, d_v]
  const float* g = nullptr;        // [batch, tokens, h_v] (GDN) or [.., h_v, d_k] (KDA)
  const float* beta = nullptr;     // [batch, tokens, h_v]
  float* o = nullptr;              // [batch, tokens, h_v, d_v] or nullptr
  // Validation error block written earlier on the same stream, or nullptr:
  // when any entry is not kNoError the kernel exits before writing anything.
  const int32_t* abort_if_error = nullptr;  // [kNumValidationFields]
  // The kernel may read `slots` and the pool before the previous kernel of
  // its stream completed (grid_dependency.cuh): the caller guarantees that
  // kernel writes neither (true when it is this call's validation kernel).
  // The fixed-shape pipelined kernel then stages its first items' heads
  // before waiting for it.
  bool early_heads = false;
  // The previous kernel of the stream is this call's validation kernel
  // (op_validation.h: it waited for every earlier kernel before letting this
  // one launch, and writes only its record, whose verdict is
  // abort_if_error): the persistent decode kernels then read every input,
  // slot and head without waiting, and each thread waits for it and reads
  // the verdict only before its first global write (grid_dependency.cuh).
  // Needs abort_if_error; early_heads is then moot.
  bool defer_writes = false;
};

// Pack / unpack of natural-order FP32 states [n][layers][h_v][d_k][d_v].
struct PackParams {
  HeadGeometry geo;
  const int32_t* key_perm = nullptr;     // [layers][h_v][d_k] or nullptr (identity)
  const int32_t* value_order = nullptr;  // [layers][h_v][d_v] damp-sr only
  const float* value_scale = nullptr;    // [layers][h_v][d_v] damp-sr only
  PoolParams pool;
  const int32_t* slots = nullptr;        // [n], -1 = skip (unpack writes zeros)
  int n = 0;
  float* states = nullptr;               // [n][layers][h_v][d_k][d_v]
  // Validation block written earlier on the same stream, or nullptr: when
  // any entry is not kNoError the kernel exits before writing anything.
  const int32_t* abort_if_error = nullptr;  // [kNumValidationFields]
};

// Indices of the validation error words (one int32 each, the first bad index
// or kNoError).
enum ValidationField : int {
  kErrSlotRange = 0,
  kErrSlotDuplicate,
  kErrSlotNegative,   // -1 where not allowed (copies)
  kErrQ,
  kErrK,
  kErrV,
  kErrG,
  kErrBeta,
  kErrStates,
  kErrDstSlotRange,
  kErrDstSlotDuplicate,
  kNumValidationFields,
};
// Error words start as bytes 0x7f (a memset), i.e. kNoError; any index found is smaller.
inline constexpr int32_t kNoError = 0x7f7f7f7f;

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_KERNEL_PARAMS_H_
