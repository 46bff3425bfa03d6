#include "server/core/model_registry.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "kernels/common/status_macros.h"
#include "server/core/log.h"
#include "server/core/proto_convert.h"
#include "server/pool/checkpoint_transcoder.h"
#include "server/pool/disk_tier.h"
#include "server/pool/redis_tier.h"
#include "server/pool/host_tier.h"

namespace statecache {

absl::Status ValidateModelId(absl::string_view id) {
  if (id.empty() || id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_id: '", id, "' must have 1..128 characters"));
  }
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("model_id: '", id, "' may only contain [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

ModelRegistry::ModelRegistry(Backend* backend, Options options)
    : backend_(backend), options_(options) {}

namespace {

// Entries of `unit` bytes that fit in `remaining` (capped by `cap` bytes when
// cap > 0), or the explicit `requested` count.
int64_t Count(int64_t requested, int64_t unit, int64_t remaining, int64_t cap) {
  if (requested > 0) return requested;
  int64_t bytes = remaining;
  if (cap > 0) bytes = std::min(bytes, cap);
  return std::max<int64_t>(bytes, 0) / unit;
}

// Key of models_: the id alone for tenant "", else "tenant/id" ('/' is not
// allowed in either name, so keys never collide).
std::string Key(absl::string_view tenant, absl::string_view id) {
  return tenant.empty() ? std::string(id) : absl::StrCat(tenant, "/", id);
}

// The layout of the cold checkpoint format `name` for a model of `slot`
// layout: the slot layout itself when the formats are equal.
absl::StatusOr<StateLayout> CheckpointLayout(const StateLayout& slot, const std::string& name) {
  if (name.empty()) return slot;
  absl::StatusOr<FormatSpec> spec = ParseFormatSpec(name);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint_format: ", spec.status().message()));
  }
  if (*spec == slot.format()) return slot;
  const bool sr = spec->format == StateFormat::kDampSr;
  if (sr && slot.format().format != StateFormat::kDampSr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint_format: ", FormatSpecName(*spec),
        " needs the value_order / value_scale maps of a damp-sr calibration, and the model's "
        "format ", FormatSpecName(slot.format()), " has none"));
  }
  absl::StatusOr<StateLayout> cold = StateLayout::Create(
      slot.geometry(), *spec, slot.all_key_perms(),
      sr ? slot.all_value_orders() : std::vector<int32_t>(),
      sr ? slot.all_value_scales() : std::vector<float>());
  if (!cold.ok()) {
    return absl::Status(cold.status().code(),
                        absl::StrCat("checkpoint_format: ", cold.status().message()));
  }
  return cold;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Model>> ModelRegistry::Register(const ModelSpec& spec) {
  RETURN_IF_ERROR(ValidateModelId(spec.id));
  if (spec.slots < 0 || spec.checkpoints < 0 || spec.max_state_bytes < 0 ||
      spec.max_checkpoint_bytes < 0) {
    return absl::InvalidArgumentError(
        "slots / checkpoints / max_state_bytes / max_checkpoint_bytes: must be >= 0");
  }
  absl::StatusOr<StateLayout> layout;
  if (spec.key_perm.empty() && spec.value_order.empty() && spec.value_scale.empty()) {
    layout = StateLayout::Identity(spec.geometry, spec.format);
  } else {
    layout = StateLayout::Create(spec.geometry, spec.format, spec.key_perm, spec.value_order,
                                 spec.value_scale);
  }
  if (!layout.ok()) {
    const absl::string_view msg = layout.status().message();
    const bool geometry_field = absl::StartsWith(msg, "layers") || absl::StartsWith(msg, "h_") ||
                                absl::StartsWith(msg, "d_") || absl::StartsWith(msg, "scale") ||
                                absl::StartsWith(msg, "arch");
    const bool layout_field = absl::StartsWith(msg, "key_perm") ||
                              absl::StartsWith(msg, "value_");
    return absl::Status(layout.status().code(),
                        absl::StrCat(geometry_field ? "geometry." : layout_field ? "layout." : "",
                                     msg));
  }
  const int64_t slot_bytes = layout->slot_bytes();
  ASSIGN_OR_RETURN(const StateLayout cold,
                   CheckpointLayout(*layout, spec.checkpoint_format.empty()
                                                 ? options_.tiers.checkpoint_format
                                                 : spec.checkpoint_format));

  absl::MutexLock lock(&mu_);
  if (models_.contains(Key(spec.tenant, spec.id))) {
    return absl::AlreadyExistsError(absl::StrCat("model_id: '", spec.id, "' is already registered"));
  }
  const int64_t state_left = options_.state_budget_bytes - state_reserved_;
  const int64_t ckpt_left = options_.checkpoint_budget_bytes - checkpoint_reserved_;
  const int64_t slots = Count(spec.slots, slot_bytes, state_left, spec.max_state_bytes);
  const int64_t checkpoints =
      Count(spec.checkpoints, slot_bytes, ckpt_left, spec.max_checkpoint_bytes);
  if (slots < 1 || slots * slot_bytes > state_left) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "slots: ", std::max<int64_t>(slots, 1), " slots of ", slot_bytes, " bytes need ",
        std::max<int64_t>(slots, 1) * slot_bytes, " bytes but the state memory budget has ",
        state_left, " of ", options_.state_budget_bytes, " bytes left (--state_memory_bytes)"));
  }
  if (checkpoints * slot_bytes > ckpt_left) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "checkpoints: ", checkpoints, " checkpoints of ", slot_bytes, " bytes need ",
        checkpoints * slot_bytes, " bytes but the checkpoint memory budget has ", ckpt_left,
        " of ", options_.checkpoint_budget_bytes, " bytes left (--checkpoint_memory_bytes)"));
  }
  auto model = std::make_shared<Model>(Model{spec.id, *std::move(layout)});
  ASSIGN_OR_RETURN(model->prepared, backend_->Prepare(model->layout));
  if (options_.slot_arena_allocator) {
    ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> arena,
                     options_.slot_arena_allocator(model->layout.slot_bytes() * slots));
    ASSIGN_OR_RETURN(model->slots,
                     SlotPool::Create(backend_, model->layout, slots, std::move(arena)));
  } else {
    ASSIGN_OR_RETURN(model->slots, SlotPool::Create(backend_, model->layout, slots));
  }
  if (checkpoints > 0) {
    CheckpointStore::Options co;
    co.capacity = checkpoints;
    co.default_lease = options_.default_lease;
    co.max_lease = options_.max_lease;
    co.clock = options_.clock;
    if (options_.tiers.host_checkpoint_bytes > 0) {
      HostTier::Options ho;
      ho.capacity_bytes = options_.tiers.host_checkpoint_bytes;
      ho.memory = backend_->pinned_memory();  // page-locked on CUDA; null: plain
      co.host = std::make_shared<HostTier>(ho);
    }
    if (!options_.tiers.disk_checkpoint_dir.empty()) {
      const std::string dir =
          absl::StrCat(options_.tiers.disk_checkpoint_dir, "/",
                       spec.tenant.empty() ? "_" : absl::BytesToHexString(spec.tenant), "/",
                       spec.id);
      ASSIGN_OR_RETURN(
          std::unique_ptr<DiskTier> disk,
          DiskTier::Create(dir, CheckpointTierTags(spec.tenant, spec.id, cold),
                           options_.tiers.disk_checkpoint_bytes,
                           [](absl::string_view event, absl::string_view details) {
                             LogEvent(event, details);
                           }));
      co.disk = std::move(disk);
    }
    const CheckpointTierOptions& tiers = options_.tiers;
    co.host_write_through = tiers.host_write_through;
    if (!tiers.redis_checkpoint_address.empty() || !tiers.redis_cluster_nodes.empty()) {
      RedisTierOptions ro;
      if (!tiers.redis_cluster_nodes.empty()) {
        RETURN_IF_ERROR(ParseRedisAddressList(tiers.redis_cluster_nodes, "redis_cluster_nodes",
                                              &ro.cluster_seeds));
      } else {
        RETURN_IF_ERROR(RedisTier::ParseAddress(options_.tiers.redis_checkpoint_address, &ro));
      }
      ro.ttl_s = options_.tiers.redis_checkpoint_ttl_s;
      ro.timeout_ms = options_.tiers.redis_checkpoint_timeout_ms;
      ro.min_transfer_mib_per_s = options_.tiers.redis_checkpoint_min_mib_per_s;
      ASSIGN_OR_RETURN(
          std::unique_ptr<RedisTier> redis,
          RedisTier::Create(CheckpointTierTags(spec.tenant, spec.id, cold), ro));
      co.remote = std::move(redis);
      co.remote_write_through = options_.tiers.redis_write_through;
      co.remote_writer.max_queued_bytes = options_.tiers.redis_write_queue_bytes;
    }
    const bool cold_tiers = co.host || co.disk || co.remote;
    if (cold_tiers && !(cold.format() == model->layout.format())) {
      absl::StatusOr<std::unique_ptr<CheckpointTranscoder>> transcoder =
          CheckpointTranscoder::Create(backend_, model->prepared.get(), cold);
      if (!transcoder.ok()) {
        return absl::Status(transcoder.status().code(),
                            absl::StrCat("checkpoint_format: ", FormatSpecName(cold.format()),
                                         ": ", transcoder.status().message()));
      }
      co.transcoder = *std::move(transcoder);
    }
    ASSIGN_OR_RETURN(model->checkpoints, CheckpointStore::Create(backend_, model->layout, co));
  }
  model->checkpoint_format = cold.format();
  model->checkpoint_slot_bytes = cold.slot_bytes();
  model->state_bytes = slots * slot_bytes;
  model->checkpoint_bytes = checkpoints * slot_bytes;
  model->registered_at = absl::Now();
  model->tenant = spec.tenant;
  state_reserved_ += model->state_bytes;
  checkpoint_reserved_ += model->checkpoint_bytes;
  models_[Key(spec.tenant, spec.id)] = model;
  return model;
}

absl::StatusOr<std::shared_ptr<Model>> ModelRegistry::Find(absl::string_view tenant,
                                                           absl::string_view id) const {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(Key(tenant, id));
  if (it == models_.end()) {
    return absl::NotFoundError(absl::StrCat("model_id: unknown model '", id, "'"));
  }
  return it->second;
}

absl::Status ModelRegistry::Drop(absl::string_view tenant, absl::string_view id, bool force) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(Key(tenant, id));
  if (it == models_.end()) {
    return absl::NotFoundError(absl::StrCat("model_id: unknown model '", id, "'"));
  }
  const Model& m = *it->second;
  if (!force) {
    const int64_t live = m.slots->stats().allocated;
    const int64_t leases = m.checkpoints ? m.checkpoints->stats().leases_active : 0;
    if (live > 0 || leases > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model_id: '", id, "' has ", live, " allocated slots and ", leases,
          " active leases; release them or set force"));
    }
  }
  state_reserved_ -= m.state_bytes;
  checkpoint_reserved_ -= m.checkpoint_bytes;
  models_.erase(it);
  return absl::OkStatus();
}

std::vector<std::shared_ptr<Model>> ModelRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Model>> out;
  for (const auto& [id, m] : models_) out.push_back(m);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a->tenant, a->id) < std::tie(b->tenant, b->id);
  });
  return out;
}

std::vector<std::shared_ptr<Model>> ModelRegistry::List(absl::string_view tenant) const {
  std::vector<std::shared_ptr<Model>> out;
  for (auto& m : List()) {
    if (m->tenant == tenant) out.push_back(std::move(m));
  }
  return out;
}

int64_t ModelRegistry::state_reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return state_reserved_;
}

int64_t ModelRegistry::checkpoint_reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return checkpoint_reserved_;
}

}  // namespace statecache

namespace statecache {

std::string CheckpointTierTags(absl::string_view tenant, absl::string_view id,
                               const StateLayout& layout) {
  const ModelGeometry& g = layout.geometry();
  return absl::StrFormat(
      "tenant=%s model=%s format=%s fingerprint=%016x geometry=%s:%dx%dx%dx%dx%dx%a "
      "slot_bytes=%d packed_revision=%d keys=%s",
      absl::BytesToHexString(tenant), id, FormatSpecName(layout.format()), layout.Fingerprint(),
      ArchName(g.arch), g.layers, g.h_qk, g.h_v, g.d_k, g.d_v, g.scale, layout.slot_bytes(),
      kPackedFormatVersion, kSaltedKeyScheme);
}

}  // namespace statecache
