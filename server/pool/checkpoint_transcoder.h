// CheckpointTranscoder: converts checkpoints between a model's slot format
// and the format its cold tiers (host, disk, remote) store them in.
//
// A model may keep its live slots and device checkpoints in one format
// (e.g. damp:16) and its cold checkpoints in a smaller one (int4-hadamard,
// stepquant-4, ...): RegisterModelRequest.checkpoint_format. Leaving device
// checkpoint memory, a checkpoint is decoded to FP32 states and encoded in
// the cold format (ToCold); promoted back, it is decoded from the cold
// format and encoded in the slot format (FromCold). Both steps are the
// backend's own PackStates / UnpackStates, so the key permutation and value
// maps of each layout apply exactly as they do for a slot, and the CPU
// reference and the CUDA kernels code it alike. A round trip costs the cold
// format's quantization error (plus the slot format's re-encoding); a
// checkpoint format equal to the slot format needs no transcoder at all (the
// store then moves the slot bytes unchanged).
//
// Backend memory: one FP32 slot [layers, h_v, d_k, d_v] and one cold-format
// slot of scratch, allocated by Create and held for the transcoder's life
// (not charged to the state or checkpoint budgets).
//
// Thread-safe: one conversion at a time (the scratch is shared); the
// CheckpointStore calls it under its own lock (demotion, promotion) and,
// for a snapshot's write-through, outside it.
//
//   ASSIGN_OR_RETURN(auto t, CheckpointTranscoder::Create(backend, slot_prepared, cold_layout));
//   ASSIGN_OR_RETURN(std::string cold, t->ToCold(view, slot));   // cold_layout.slot_bytes()
//   RETURN_IF_ERROR(t->FromCold(cold, view, slot));
#ifndef STATECACHE_SERVER_POOL_CHECKPOINT_TRANSCODER_H_
#define STATECACHE_SERVER_POOL_CHECKPOINT_TRANSCODER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/pool_view.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

class CheckpointTranscoder {
 public:
  // `slot_model`: the model's prepared slot layout (borrowed; it and
  // `backend` must outlive the transcoder). `cold`: the layout of the cold
  // format, same geometry. kInvalidArgument when the geometries differ;
  // kResourceExhausted when the scratch cannot be allocated.
  static absl::StatusOr<std::unique_ptr<CheckpointTranscoder>> Create(
      Backend* backend, const PreparedModel* slot_model, const StateLayout& cold);

  // Slot `slot` of `src` (a pool of the slot layout, backend memory) encoded
  // in the cold format: cold_slot_bytes() host bytes.
  absl::StatusOr<std::string> ToCold(const PoolView& src, int32_t slot);

  // `cold` (ToCold's bytes) decoded and encoded into slot `slot` of `dst` (a
  // pool of the slot layout), every byte of the slot overwritten.
  // kDataLoss when cold.size() != cold_slot_bytes() (nothing is written).
  absl::Status FromCold(absl::string_view cold, const PoolView& dst, int32_t slot);

  const StateLayout& cold_layout() const { return cold_->layout(); }
  int64_t cold_slot_bytes() const { return cold_view_.slot_bytes(); }

 private:
  CheckpointTranscoder(Backend* backend, const PreparedModel* slot_model,
                       std::unique_ptr<PreparedModel> cold, std::unique_ptr<BackendBuffer> fp32,
                       std::unique_ptr<BackendBuffer> cold_slot,
                       std::unique_ptr<BackendBuffer> index, PoolView cold_view);

  Backend* const backend_;
  const PreparedModel* const slot_model_;
  const std::unique_ptr<PreparedModel> cold_;
  const std::unique_ptr<BackendBuffer> fp32_;       // [layers, h_v, d_k, d_v] FP32
  const std::unique_ptr<BackendBuffer> cold_slot_;  // one cold-format slot
  const std::unique_ptr<BackendBuffer> index_;      // int32 slot index scratch
  const PoolView cold_view_;                        // one slot over cold_slot_
  absl::Mutex mu_;                                  // held by each conversion (scratch)
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_CHECKPOINT_TRANSCODER_H_
