// BackendStateStore: a RecurrentStateStore on one slot of a Backend pool.
//
// The states of the sequence live packed in `layout`'s format (fp32 ... damp)
// in a one-slot pool allocated from the backend (CPU reference or CUDA). Every
// call stages the FP32 inputs into backend memory (Allocate + CopyIn, as the
// Backend contract requires) and runs the backend's fused DecodeUpdate (one
// call per token: dequantize, update, read out, requantize) or Prefill (one
// chunk, quantized once at the end).
//
//   ASSIGN_OR_RETURN(auto backend, CreateBackend("cpu"));
//   ASSIGN_OR_RETURN(auto spec, ParseFormatSpec("damp:16"));
//   ASSIGN_OR_RETURN(auto layout, StateLayout::Identity(config.Geometry(), spec));
//   ASSIGN_OR_RETURN(auto store, BackendStateStore::Create(backend.get(), layout));
//
// The backend is not owned and must outlive the store. Not thread-safe (one
// sequence); separate stores on one backend may be used concurrently.
#ifndef STATECACHE_CLIENT_MODEL_BACKEND_STATE_STORE_H_
#define STATECACHE_CLIENT_MODEL_BACKEND_STATE_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "client/model/recurrent_state_store.h"
#include "kernels/backend/backend.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

class BackendStateStore : public RecurrentStateStore {
 public:
  // Prepares the layout and allocates (zeroed) one slot. Errors from the
  // backend are passed through (kResourceExhausted when memory is short).
  static absl::StatusOr<std::unique_ptr<BackendStateStore>> Create(Backend* backend,
                                                                   const StateLayout& layout);

  const ModelGeometry& geometry() const override { return layout_.geometry(); }
  std::string Describe() const override;
  absl::Status Decode(int layer, const RecurrentInputs& in, float* o) override;
  absl::Status Prefill(int layer, const RecurrentInputs& in, float* o) override;
  absl::Status Reset() override;
  absl::StatusOr<std::vector<float>> ReadStates() override;
  absl::Status WriteStates(const std::vector<float>& states) override;

  // The packed slot bytes (for checkpoint / inspection).
  absl::StatusOr<std::string> ReadSlotBytes();
  const StateLayout& layout() const { return layout_; }

 private:
  BackendStateStore(Backend* backend, StateLayout layout)
      : backend_(backend), layout_(std::move(layout)) {}
  // Ensures staging_ holds at least `bytes`.
  absl::Status EnsureStaging(int64_t bytes);
  // Copies the inputs of `in` into staging; returns the backend pointers.
  struct Staged {
    const float* q;
    const float* k;
    const float* v;
    const float* g;
    const float* beta;
    float* o;
  };
  absl::StatusOr<Staged> Stage(const RecurrentInputs& in, bool with_o);

  Backend* backend_;
  StateLayout layout_;
  std::unique_ptr<PreparedModel> prepared_;
  std::unique_ptr<BackendBuffer> slot_buffer_;
  std::unique_ptr<BackendBuffer> slot_index_;  // int32 {0}
  std::unique_ptr<BackendBuffer> staging_;
  PoolView pool_;
};

}  // namespace statecache

#endif  // STATECACHE_CLIENT_MODEL_BACKEND_STATE_STORE_H_
