// Fp32StateStore: the in-process FP32 reference of RecurrentStateStore.
//
// States are plain FP32 [layers, h_v, d_k, d_v] in natural order; the
// recurrence is the serial, per-head transcription of flash-linear-attention's
// naive_recurrent_gated_delta_rule (DESIGN.md section 2), written here
// independently of kernels/cpu so each can check the other. Decode and
// Prefill compute the same thing for FP32 states (there is nothing to
// quantize between tokens). Heads of a layer run on an optional ThreadPool.
//
//   Fp32StateStore store(config.Geometry());
//   RETURN_IF_ERROR(store.Decode(0, inputs, o.data()));
#ifndef STATECACHE_CLIENT_MODEL_FP32_STATE_STORE_H_
#define STATECACHE_CLIENT_MODEL_FP32_STATE_STORE_H_

#include <vector>

#include "client/model/recurrent_state_store.h"
#include "kernels/cpu/thread_pool.h"

namespace statecache {

// One token of one value head, in place on state s[d_k][d_v]:
//   s = diag(exp(g)) s;  u = beta (v - s^T k);  s += k u^T;  o = s^T (scale q).
// g points at 1 value (GDN) or d_k values (KDA).
void Fp32RecurrentStep(Arch arch, int d_k, int d_v, float scale, const float* q, const float* k,
                       const float* v, const float* g, float beta, float* s, float* o);

class Fp32StateStore : public RecurrentStateStore {
 public:
  // `pool` (optional, not owned) runs the heads of a layer in parallel.
  explicit Fp32StateStore(const ModelGeometry& geometry, ThreadPool* pool = nullptr);

  const ModelGeometry& geometry() const override { return geometry_; }
  std::string Describe() const override { return "fp32 (in process)"; }
  absl::Status Decode(int layer, const RecurrentInputs& in, float* o) override;
  absl::Status Prefill(int layer, const RecurrentInputs& in, float* o) override;
  absl::Status Reset() override;
  absl::StatusOr<std::vector<float>> ReadStates() override;
  absl::Status WriteStates(const std::vector<float>& states) override;

 private:
  absl::Status Run(int layer, const RecurrentInputs& in, float* o);

  ModelGeometry geometry_;
  ThreadPool* pool_;
  std::vector<float> states_;  // [layers, h_v, d_k, d_v]
};

}  // namespace statecache

#endif  // STATECACHE_CLIENT_MODEL_FP32_STATE_STORE_H_
