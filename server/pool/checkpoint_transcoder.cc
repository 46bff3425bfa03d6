#include "server/pool/checkpoint_transcoder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "server/pool/staging.h"

namespace statecache {

absl::StatusOr<std::unique_ptr<CheckpointTranscoder>> CheckpointTranscoder::Create(
    Backend* backend, const PreparedModel* slot_model, const StateLayout& cold) {
  const ModelGeometry& g = slot_model->layout().geometry();
  const ModelGeometry& cg = cold.geometry();
  if (g.layers != cg.layers || g.h_v != cg.h_v || g.d_k != cg.d_k || g.d_v != cg.d_v) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint_format: geometry ",
                                                   cg.DebugString(), " differs from the slot's ",
                                                   g.DebugString()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<PreparedModel> prepared, backend->Prepare(cold));
  ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> fp32,
                   backend->Allocate(g.HeadsPerSlot() * g.d_k * g.d_v * int64_t{4}));
  PoolView view;
  view.num_slots = 1;
  view.layers = cg.layers;
  view.heads = cg.h_v;
  view.head_bytes = cold.head_layout().head_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> cold_slot, backend->Allocate(view.slot_bytes()));
  view.base = cold_slot->data();
  ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> index, backend->Allocate(16));
  return std::unique_ptr<CheckpointTranscoder>(new CheckpointTranscoder(
      backend, slot_model, std::move(prepared), std::move(fp32), std::move(cold_slot),
      std::move(index), view));
}

CheckpointTranscoder::CheckpointTranscoder(Backend* backend, const PreparedModel* slot_model,
                                           std::unique_ptr<PreparedModel> cold,
                                           std::unique_ptr<BackendBuffer> fp32,
                                           std::unique_ptr<BackendBuffer> cold_slot,
                                           std::unique_ptr<BackendBuffer> index,
                                           PoolView cold_view)
    : backend_(backend),
      slot_model_(slot_model),
      cold_(std::move(cold)),
      fp32_(std::move(fp32)),
      cold_slot_(std::move(cold_slot)),
      index_(std::move(index)),
      cold_view_(cold_view) {}

absl::StatusOr<std::string> CheckpointTranscoder::ToCold(const PoolView& src, int32_t slot) {
  absl::MutexLock lock(&mu_);
  const int32_t idx[2] = {slot, 0};  // [0]: the source slot, [1]: the scratch slot
  RETURN_IF_ERROR(backend_->CopyIn(index_->data(), idx, sizeof(idx)));
  const int32_t* staged = StagedData<int32_t>(*index_);
  float* fp32 = StagedData<float>(*fp32_);
  RETURN_IF_ERROR(backend_->UnpackStates(*slot_model_, src, staged, 1, fp32));
  RETURN_IF_ERROR(backend_->PackStates(*cold_, cold_view_, staged + 1, 1, fp32));
  std::string out(static_cast<size_t>(cold_view_.slot_bytes()), '\0');
  RETURN_IF_ERROR(backend_->CopyOut(&out[0], cold_view_.slot(0), cold_view_.slot_bytes()));
  return out;
}

absl::Status CheckpointTranscoder::FromCold(absl::string_view cold, const PoolView& dst,
                                            int32_t slot) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(cold.size()) != cold_view_.slot_bytes()) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", cold.size(),
                                            " bytes, the checkpoint format ",
                                            FormatSpecName(cold_->layout().format()), " needs ",
                                            cold_view_.slot_bytes()));
  }
  const int32_t idx[2] = {0, slot};  // [0]: the scratch slot, [1]: the destination slot
  RETURN_IF_ERROR(backend_->CopyIn(index_->data(), idx, sizeof(idx)));
  const int32_t* staged = StagedData<int32_t>(*index_);
  float* fp32 = StagedData<float>(*fp32_);
  RETURN_IF_ERROR(backend_->CopyIn(cold_view_.slot(0), cold.data(), cold_view_.slot_bytes()));
  RETURN_IF_ERROR(backend_->UnpackStates(*cold_, cold_view_, staged, 1, fp32));
  return backend_->PackStates(*slot_model_, dst, staged + 1, 1, fp32);
}

}  // namespace statecache
