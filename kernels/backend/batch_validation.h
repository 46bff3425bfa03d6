// Host-side checks shared by backend bindings and the server edge.
//
// Each returns kInvalidArgument with a message naming the field (and the
// first offending index) or OK. They read host memory only.
#ifndef STATECACHE_KERNELS_BACKEND_BATCH_VALIDATION_H_
#define STATECACHE_KERNELS_BACKEND_BATCH_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/pool_view.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

// Reads element i of a q/k/v tensor of the given dtype as float.
float LoadAsFloat(DType dtype, const void* data, int64_t i);

// The pool's shape matches the layout (layers, heads, head_bytes) and `layer`
// is in range.
absl::Status ValidatePoolAndLayer(const StateLayout& layout, const PoolView& pool, int layer);

// Every slot is -1 or in [0, pool.num_slots), with no slot twice.
absl::Status ValidateSlots(const PoolView& pool, const int32_t* slots, int n);

// All `count` values are finite.
absl::Status ValidateFinite(absl::string_view field, DType dtype, const void* data, int64_t count);

// Every one of `count` FP32 state values is finite with |x| <=
// kMaxStateMagnitude (kernels/formats/state_bound.h: the entry contract that
// keeps the recurrence finite). The message names field[i] and the bound.
absl::Status ValidateStateValues(absl::string_view field, const float* data, int64_t count);

// g finite and <= 0 (log decay); beta finite and in [0, 2] (2 allows the
// negative-eigenvalue variant of the delta rule).
absl::Status ValidateGates(const float* g, int64_t g_count, const float* beta, int64_t beta_count);

// Shapes and values of a decode batch (host pointers).
absl::Status ValidateDecodeInputs(const StateLayout& layout, const PoolView& pool, int layer,
                                  const DecodeInputs& in);
// Same for prefill (tokens >= 1).
absl::Status ValidatePrefillInputs(const StateLayout& layout, const PoolView& pool, int layer,
                                   const PrefillInputs& in);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_BACKEND_BATCH_VALIDATION_H_
