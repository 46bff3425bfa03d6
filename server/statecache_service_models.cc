// StateCacheService, models: RegisterModel, Calibrate, ListModels,
// DescribeModel, DropModel (registration, quotas, persistence).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/layout/layout_file.h"
#include "server/core/log.h"
#include "server/ops/calibrate.h"
#include "server/core/proto_convert.h"
#include "server/statecache_service.h"
#include "server/statecache_service_internal.h"

namespace statecache {
namespace {

// Fits a registration into the tenant's max_models / max_state_bytes /
// max_checkpoint_bytes quotas: explicit counts beyond them fail naming the
// quota, "0 = remaining budget" counts are capped by what is left.
absl::Status CheckRegisterQuotaImpl(const ModelRegistry& registry, Tenant& caller,
                                    ModelSpec* spec) {
  const TenantQuota& q = caller.quota();
  if (q.max_models == 0 && q.max_state_bytes == 0 && q.max_checkpoint_bytes == 0) {
    return absl::OkStatus();
  }
  const std::vector<std::shared_ptr<Model>> mine = registry.List(caller.name());
  if (q.max_models > 0 && static_cast<int64_t>(mine.size()) >= q.max_models) {
    return absl::ResourceExhaustedError(absl::StrCat("quota max_models: tenant '", caller.name(),
                                                     "' has ", mine.size(), " of ", q.max_models,
                                                     " models registered"));
  }
  absl::StatusOr<StateLayout> layout = StateLayout::Identity(spec->geometry, spec->format);
  if (!layout.ok()) return absl::OkStatus();  // Register reports the field
  const int64_t slot_bytes = layout->slot_bytes();
  int64_t state_used = 0, ckpt_used = 0;
  for (const auto& m : mine) {
    state_used += m->state_bytes;
    ckpt_used += m->checkpoint_bytes;
  }
  struct Budget {
    int64_t quota, used, count;
    int64_t* cap;
    const char* name;
    const char* what;
  };
  for (const Budget& b : {Budget{q.max_state_bytes, state_used, spec->slots,
                                 &spec->max_state_bytes, "max_state_bytes", "slots"},
                          Budget{q.max_checkpoint_bytes, ckpt_used, spec->checkpoints,
                                 &spec->max_checkpoint_bytes, "max_checkpoint_bytes",
                                 "checkpoints"}}) {
    if (b.quota == 0) continue;
    const int64_t left = std::max<int64_t>(b.quota - b.used, 0);
    const int64_t want = b.count > 0 ? b.count * slot_bytes : slot_bytes;
    if (want > left) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "quota ", b.name, ": tenant '", caller.name(), "' has ", left, " of ", b.quota,
          " bytes left; ", std::max<int64_t>(b.count, 1), " ", b.what, " of ", slot_bytes,
          " bytes need ", want));
    }
    if (b.count == 0) *b.cap = *b.cap > 0 ? std::min(*b.cap, left) : left;
  }
  return absl::OkStatus();
}

// RegisterModelRequest.layout_file -> the maps of `spec` (geometry and format
// already parsed from the request, which the file must match).
absl::Status LayoutFromFile(const v1::RegisterModelRequest& req, ModelSpec* spec) {
  const v1::LayoutMaps& maps = req.layout();
  if (maps.key_perm_size() + maps.value_order_size() + maps.value_scale_size() > 0) {
    return absl::InvalidArgumentError(
        "layout_file: give either layout (the maps) or layout_file, not both");
  }
  absl::StatusOr<LayoutFile> file = ParseLayout(req.layout_file(), &spec->geometry, &spec->format);
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("layout_file: ", file.status().message()));
  }
  spec->key_perm = file->layout.all_key_perms();
  spec->value_order = file->layout.all_value_orders();
  spec->value_scale = file->layout.all_value_scales();
  return absl::OkStatus();
}

}  // namespace

absl::Status StateCacheService::CheckRegisterQuota(Tenant& caller, ModelSpec* spec) {
  return CheckRegisterQuotaImpl(*registry_, caller, spec);
}

void StateCacheService::FillModelInfo(const Model& m, v1::ModelInfo* info) {
  const ModelGeometry& g = m.layout.geometry();
  const PackedHeadLayout& head = m.layout.head_layout();
  info->set_model_id(m.id);
  *info->mutable_geometry() = GeometryToProto(g);
  info->set_format(FormatSpecName(m.layout.format()));
  TagsToProto(m.id, m.layout, info->mutable_tags());
  TierBytesToProto(TierBytes::OfHead(head), info->mutable_head_bytes());
  info->set_slot_bytes(m.layout.slot_bytes());
  info->set_fp32_slot_bytes(g.HeadsPerSlot() * g.d_k * g.d_v * 4);
  info->set_payload_bits_per_value(head.PayloadBitsPerValue());
  info->set_storage_bits_per_value(head.StorageBitsPerValue());
  info->set_identity_layout(m.layout.identity_key_perm());
  info->set_checkpoint_format(FormatSpecName(m.checkpoint_format));
  info->set_checkpoint_format_slot_bytes(m.checkpoint_slot_bytes);
  StatsToProto(m.slots->stats(), m.checkpoints ? m.checkpoints->stats() : CheckpointStats(),
               info->mutable_stats());
}

absl::Status StateCacheService::DoRegisterModel(Tenant& caller, const v1::RegisterModelRequest& req,
                                                v1::RegisterModelResponse* resp) {
  ModelSpec spec;
  spec.id = req.model_id();
  RETURN_IF_ERROR(ValidateModelId(spec.id));
  ASSIGN_OR_RETURN(spec.geometry, GeometryFromProto(req.geometry()));
  if (req.format().empty()) {
    return absl::InvalidArgumentError("format: empty (e.g. \"damp:16\", \"fp32\")");
  }
  ASSIGN_OR_RETURN(spec.format, ParseFormatSpec(req.format()));
  if (!req.layout_file().empty()) {
    RETURN_IF_ERROR(LayoutFromFile(req, &spec));
  } else {
    spec.key_perm.assign(req.layout().key_perm().begin(), req.layout().key_perm().end());
    spec.value_order.assign(req.layout().value_order().begin(), req.layout().value_order().end());
    spec.value_scale.assign(req.layout().value_scale().begin(), req.layout().value_scale().end());
  }
  spec.slots = req.slots();
  spec.checkpoints = req.checkpoints();
  spec.max_state_bytes = req.max_state_bytes();
  spec.max_checkpoint_bytes = req.max_checkpoint_bytes();
  spec.checkpoint_format = req.checkpoint_format();
  spec.tenant = caller.name();
  absl::MutexLock quota_lock(&caller.allocation_mu());
  RETURN_IF_ERROR(CheckRegisterQuota(caller, &spec));
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model, registry_->Register(spec));
  if (model_store_ != nullptr) {
    // Acknowledged only once durable: persist what was resolved.
    v1::RegisterModelRequest persisted = req;
    persisted.set_slots(model->slots->capacity());
    persisted.set_checkpoints(model->checkpoints ? model->checkpoints->capacity() : 0);
    absl::Status saved = model_store_->Save(caller.name(), persisted);
    if (!saved.ok()) {
      registry_->Drop(caller.name(), model->id, /*force=*/true).IgnoreError();
      return saved;
    }
  }
  FillModelInfo(*model, resp->mutable_model());
  const v1::ModelInfo& info = resp->model();
  LogEvent("model_registered",
           absl::StrCat("model=", model->id, " format=", info.format(), " geometry=\"",
                        model->layout.geometry().DebugString(), "\" slot_bytes=",
                        info.slot_bytes(), " fp32_slot_bytes=", info.fp32_slot_bytes(),
                        " bits_per_value=", info.payload_bits_per_value(), " slots=",
                        model->slots->capacity(), " checkpoints=",
                        model->checkpoints ? model->checkpoints->capacity() : 0,
                        " identity_layout=", info.identity_layout() ? "true" : "false",
                        " checkpoint_format=", info.checkpoint_format()));
  return absl::OkStatus();
}

grpc::Status StateCacheService::RegisterModel(grpc::ServerContext* ctx,
                                              const v1::RegisterModelRequest* req,
                                              v1::RegisterModelResponse* resp) {
  return Run(ctx, "RegisterModel",
             [&](Tenant& caller) { return DoRegisterModel(caller, *req, resp); });
}

absl::Status StateCacheService::DoCalibrate(Tenant& caller,
                                            const std::vector<v1::CalibrateRequest>& msgs,
                                            v1::CalibrateResponse* resp) {
  ops::CalibrateInput in;
  in.messages = &msgs;
  in.max_calibration_bytes = limits_.max_calibration_bytes;
  in.register_model = [&](const v1::RegisterModelRequest& reg, v1::RegisterModelResponse* out) {
    return DoRegisterModel(caller, reg, out);
  };
  return ops::Calibrate(in, resp);
}

grpc::Status StateCacheService::Calibrate(grpc::ServerContext* ctx,
                                          grpc::ServerReader<v1::CalibrateRequest>* reader,
                                          v1::CalibrateResponse* resp) {
  return Run(ctx, "Calibrate", [&](Tenant& caller) -> absl::Status {
    std::vector<v1::CalibrateRequest> msgs;
    int64_t total_bytes = 0;
    v1::CalibrateRequest msg;
    while (reader->Read(&msg)) {
      total_bytes += static_cast<int64_t>(msg.trajectory_file().size());
      if (total_bytes > limits_.max_calibration_bytes) {
        return ops::ExceedsCalibrationBytes(total_bytes, limits_.max_calibration_bytes);
      }
      msgs.push_back(std::move(msg));
      msg.Clear();
    }
    return DoCalibrate(caller, msgs, resp);
  });
}

grpc::Status StateCacheService::ListModels(grpc::ServerContext* ctx, const v1::ListModelsRequest*,
                                           v1::ListModelsResponse* resp) {
  return Run(ctx, "ListModels", [&](Tenant& caller) {
    for (const auto& m : registry_->List(caller.name())) FillModelInfo(*m, resp->add_models());
    return absl::OkStatus();
  });
}

absl::Status StateCacheService::DoDescribeModel(Tenant& caller, const v1::DescribeModelRequest& req,
                                                v1::ModelInfo* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  FillModelInfo(*m, resp);
  return absl::OkStatus();
}

grpc::Status StateCacheService::DescribeModel(grpc::ServerContext* ctx,
                                              const v1::DescribeModelRequest* req,
                                              v1::ModelInfo* resp) {
  return Run(ctx, "DescribeModel",
             [&](Tenant& caller) { return DoDescribeModel(caller, *req, resp); });
}

absl::Status StateCacheService::DoDropModel(Tenant& caller, const v1::DropModelRequest& req) {
  RETURN_IF_ERROR(registry_->Drop(caller.name(), req.model_id(), req.force()));
  if (model_store_ != nullptr) RETURN_IF_ERROR(model_store_->Remove(caller.name(), req.model_id()));
  LogEvent("model_dropped",
           absl::StrCat("model=", req.model_id(), " force=", req.force() ? "true" : "false"));
  return absl::OkStatus();
}

grpc::Status StateCacheService::DropModel(grpc::ServerContext* ctx, const v1::DropModelRequest* req,
                                          v1::DropModelResponse*) {
  return Run(ctx, "DropModel", [&](Tenant& caller) { return DoDropModel(caller, *req); });
}

}  // namespace statecache
