// RecurrentStateStore: where the model worker's recurrent states live.
//
// The worker computes the activated recurrent inputs of a layer (q, k after
// L2 norm, v, log-decay g, beta after sigmoid) and hands them to a store,
// which runs the recurrence of DESIGN.md section 2 on its own copy of the
// state and returns the readout o. Implementations:
//   - Fp32StateStore (fp32_state_store.h): plain FP32 states in process, a
//     straightforward serial recurrence; the accuracy reference.
//   - BackendStateStore (backend_state_store.h): one slot of a Backend pool
//     (CPU reference or CUDA), states packed in any StateFormat/StateLayout.
//   - a remote store (the statecached gRPC client) implements the same calls.
//
// One store holds the states of ONE sequence (all layers). Calls for one
// store must not run concurrently; different stores are independent.
//
//   Fp32StateStore store(geometry);
//   RETURN_IF_ERROR(store.Decode(layer, inputs, o.data()));   // T decode steps
//   RETURN_IF_ERROR(store.Prefill(layer, inputs, o.data()));  // one chunk
#ifndef STATECACHE_CLIENT_MODEL_RECURRENT_STATE_STORE_H_
#define STATECACHE_CLIENT_MODEL_RECURRENT_STATE_STORE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/layout/geometry.h"

namespace statecache {

// `tokens` tokens of one layer, FP32, row-major, natural key/value order.
struct RecurrentInputs {
  int tokens = 0;
  const float* q = nullptr;     // [tokens, h_qk, d_k], L2-normalized, NOT scaled
  const float* k = nullptr;     // [tokens, h_qk, d_k], L2-normalized
  const float* v = nullptr;     // [tokens, h_v, d_v]
  const float* g = nullptr;     // GDN [tokens, h_v]; KDA [tokens, h_v, d_k] (log decay <= 0)
  const float* beta = nullptr;  // [tokens, h_v], in (0, 1)
};

class RecurrentStateStore {
 public:
  virtual ~RecurrentStateStore() = default;

  virtual const ModelGeometry& geometry() const = 0;
  // One line for logs: "fp32 (in process)", "cpu backend, damp k_hi=16".
  virtual std::string Describe() const = 0;

  // in.tokens decode steps on `layer`, one after another; each step reads the
  // stored state, updates it in FP32, writes o[t] = S_t^T (scale q_t) from the
  // FP32 state, and stores S_t back (requantized in packed formats).
  // o: [tokens, h_v, d_v]. kInvalidArgument for a bad layer / empty input.
  virtual absl::Status Decode(int layer, const RecurrentInputs& in, float* o) = 0;

  // One prefill chunk on `layer`: the recurrence runs in FP32 from the stored
  // state over all in.tokens and the result is stored once, at the end.
  // o: [tokens, h_v, d_v], or nullptr when the readout is not needed.
  virtual absl::Status Prefill(int layer, const RecurrentInputs& in, float* o) = 0;

  // All layers back to the zero state.
  virtual absl::Status Reset() = 0;

  // The stored states as FP32 (dequantized), [layers, h_v, d_k, d_v], natural
  // key and value order.
  virtual absl::StatusOr<std::vector<float>> ReadStates() = 0;
  // Overwrites all states from FP32 [layers, h_v, d_k, d_v] (stored once, i.e.
  // quantized once in packed formats). kInvalidArgument on a size mismatch.
  virtual absl::Status WriteStates(const std::vector<float>& states) = 0;
};

// Shared argument checks: kInvalidArgument naming the field when the layer is
// out of range, tokens < 1, or a pointer is null.
absl::Status ValidateRecurrentInputs(const ModelGeometry& geometry, int layer,
                                     const RecurrentInputs& in);

// Elements of a full state set: layers * h_v * d_k * d_v.
inline int64_t StateElements(const ModelGeometry& g) {
  return int64_t{g.layers} * g.h_v * g.d_k * g.d_v;
}

}  // namespace statecache

#endif  // STATECACHE_CLIENT_MODEL_RECURRENT_STATE_STORE_H_
