#include "server/statecache_service.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kernels/backend/batch_validation.h"
#include "kernels/common/status_macros.h"
#include "kernels/formats/numeric.h"
#include "kernels/calibration/build_layout.h"
#include "kernels/calibration/calibrator.h"
#include "kernels/calibration/scores.h"
#include "kernels/io/safetensors.h"
#include "kernels/layout/layout_file.h"
#include "kernels/trajectory/trajectory_file.h"
#include "server/auth/tenants.h"
#include "server/host_update.h"
#include "server/core/log.h"
#include "server/pool/prefix_key.h"
#include "server/pool/staging.h"
#include "server/core/proto_convert.h"

namespace statecache {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numeric values.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

namespace {

constexpr int64_t kStageAlign = 256;

// Host data staged into one backend buffer (from the service's
// StagingCache; contents not zeroed), section by section.
class Staging {
 public:
  // Reserves a section of `bytes`; copies `host` into it when non-null.
  // Returns the section index.
  int Add(const void* host, int64_t bytes) {
    parts_.push_back({host, bytes, total_});
    total_ += (bytes + kStageAlign - 1) / kStageAlign * kStageAlign;
    return static_cast<int>(parts_.size()) - 1;
  }
  absl::Status Commit(Backend& backend, StagingCache& cache) {
    ASSIGN_OR_RETURN(StagingCache::Lease lease, cache.Get(std::max<int64_t>(total_, kStageAlign)));
    buffer_.emplace(std::move(lease));
    for (const Part& p : parts_) {
      if (p.host != nullptr && p.bytes > 0) {
        RETURN_IF_ERROR(backend.CopyIn(buffer_->data() + p.offset, p.host, p.bytes));
      }
    }
    return absl::OkStatus();
  }
  template <typename T>
  T* at(int part) const {
    return reinterpret_cast<T*>(buffer_->data() + parts_[part].offset);
  }

 private:
  struct Part {
    const void* host;
    int64_t bytes;
    int64_t offset;
  };
  std::vector<Part> parts_;
  int64_t total_ = 0;
  std::optional<StagingCache::Lease> buffer_;
};

// Copies FP32 values out of a message into an aligned vector (message bytes
// need not be 4-byte aligned).
std::vector<float> Floats(const TensorBytes& t) {
  std::vector<float> out(t.count);
  if (t.bytes > 0) std::memcpy(out.data(), t.data, t.bytes);
  return out;
}

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

absl::Status CheckLayer(const Model& m, int layer) {
  if (layer < 0 || layer >= m.layout.geometry().layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer: ", layer, " is outside 0..",
                                                   m.layout.geometry().layers - 1));
  }
  return absl::OkStatus();
}

absl::Status CheckBatch(int batch, int max_batch, absl::string_view field) {
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat(field, ": no slot handles given"));
  if (batch > max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", batch, " slots exceed the limit of ", max_batch, " per call"));
  }
  return absl::OkStatus();
}

// Opt-in sanitizing (sanitize_non_finite): when `t` holds NaN / Inf, copies
// it into `storage` with those values replaced by +0 and points `t` at the
// copy. Returns the number replaced.
int64_t SanitizeTensor(TensorBytes* t, std::string* storage) {
  auto bad = [&](int64_t i) {
    if (t->dtype == DType::kFp32) {
      float x;
      std::memcpy(&x, static_cast<const char*>(t->data) + 4 * i, 4);
      return !std::isfinite(x);
    }
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(t->data) + 2 * i, 2);
    const uint16_t exp = t->dtype == DType::kBf16 ? 0x7f80 : 0x7c00;
    return (h & exp) == exp;
  };
  int64_t n = 0;
  for (int64_t i = 0; i < t->count; ++i) n += bad(i);
  if (n == 0) return 0;
  storage->assign(static_cast<const char*>(t->data), t->bytes);
  const int64_t width = t->dtype == DType::kFp32 ? 4 : 2;
  for (int64_t i = 0; i < t->count; ++i) {
    if (bad(i)) std::memset(storage->data() + width * i, 0, width);
  }
  t->data = storage->data();
  return n;
}

int64_t SanitizeFloats(std::vector<float>* v) {
  int64_t n = 0;
  for (float& x : *v) {
    if (!std::isfinite(x)) {
      x = 0.f;
      ++n;
    }
  }
  return n;
}

float ElementAt(const TensorBytes& t, int64_t i) {
  if (t.dtype == DType::kFp32) {
    float x;
    std::memcpy(&x, static_cast<const char*>(t.data) + 4 * i, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(t.data) + 2 * i, 2);
  return t.dtype == DType::kBf16 ? Bf16BitsToFloat(h) : HalfBitsToFloat(h);
}

// The numeric contract that keeps the FP32 recurrence finite (fuzzing found
// that finite but huge keys overflow it into NaN): q and k rows are
// L2-normalized (norm <= 1 + 1e-2, rounding of bf16/fp16 included; zero rows
// allowed), so the delta-rule transition never expands the state, and
// |v| <= max_abs_value. kInvalidArgument naming the field and row.
absl::Status CheckMagnitudes(absl::string_view prefix, const TensorBytes& q, const TensorBytes& k,
                             const TensorBytes& v, int d_k, float max_abs_value) {
  for (const auto& [name, t] : {std::pair<const char*, const TensorBytes*>{"q", &q}, {"k", &k}}) {
    const int64_t rows = t->count / d_k;
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (int j = 0; j < d_k; ++j) {
        const double x = ElementAt(*t, r * d_k + j);
        sum += x * x;
      }
      if (sum > 1.0201) {  // (1 + 1e-2)^2
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, name, ": row ", r, " has L2 norm ", std::sqrt(sum),
            " > 1 (q and k must be L2-normalized per head)"));
      }
    }
  }
  for (int64_t i = 0; i < v.count; ++i) {
    const float x = ElementAt(v, i);
    if (std::fabs(x) > max_abs_value) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "v: element ", i, " = ", x,
                                                     " exceeds |v| <= ", max_abs_value));
    }
  }
  return absl::OkStatus();
}

// Per-request work bound: head updates (B x T x h_v; Prefill of states:
// B x layers x h_v).
absl::Status CheckWork(int64_t heads, int64_t max_heads, absl::string_view field) {
  if (heads > max_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", heads,
        " head updates (batch x tokens x heads) exceed the per-request limit of ", max_heads,
        " (--max_work_heads)"));
  }
  return absl::OkStatus();
}

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

absl::StatusOr<PrefixKey> KeyFromTokensOrKey(bool has_tokens, const v1::TokenIds& tokens,
                                             bool has_key, const v1::PrefixKey& key,
                                             absl::string_view tokens_field,
                                             absl::string_view key_field) {
  if (has_tokens) {
    if (tokens.ids().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(tokens_field, ": empty token list"));
    }
    return KeyOfTokens(tokens.ids());
  }
  if (has_key) {
    if (key.num_tokens() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(key_field, ".num_tokens: ", key.num_tokens(), " must be >= 1"));
    }
    return KeyFromProto(key);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("prefix: set ", tokens_field, " or ", key_field));
}

DataPlane::ComputeLimits ComputeLimitsOf(const StateCacheService::Limits& l) {
  DataPlane::ComputeLimits c;
  c.max_batch = l.max_batch;
  c.max_work_heads = l.max_work_heads;
  c.max_prefill_tokens = l.max_prefill_tokens;
  const float max_abs_value = l.max_abs_value;
  c.host_value_check = [max_abs_value](absl::string_view prefix, const TensorBytes& q,
                                       const TensorBytes& k, const TensorBytes& v, int d_k) {
    return CheckMagnitudes(prefix, q, k, v, d_k, max_abs_value);
  };
  return c;
}

DataPlane::KernelObserver KernelObserverOf(Metrics* metrics) {
  if (metrics == nullptr) return nullptr;
  return [metrics](const char* kernel, double seconds, int batch) {
    metrics->ObserveKernel(kernel, seconds);
    if (std::strcmp(kernel, "decode_update") == 0) metrics->ObserveUpdateBatch(batch);
  };
}

absl::Status NoDataPlane() {
  return absl::FailedPreconditionError("session_id: this server has no data plane");
}

// What a call that arrives during the drain before a shutdown gets: it did
// not run, so retrying it elsewhere is safe.
absl::Status ShuttingDown(absl::string_view method) {
  return absl::UnavailableError(absl::StrCat(
      "server: shutting down; ", method, " did not run (nothing was written)"));
}

// How a stream ends when the drain stops it between messages.
absl::Status StreamShutDown() {
  return absl::UnavailableError(
      "server: shutting down; the stream's messages without a response did not run");
}

}  // namespace

absl::Status StateCacheService::CheckNotAttached(
    const Model& m, const google::protobuf::RepeatedPtrField<v1::SlotHandle>& slots,
    absl::string_view field) const {
  if (dataplane_ == nullptr) return absl::OkStatus();
  return dataplane_->CheckNotAttached(m, HandlesFromProto(slots), field);
}

absl::Status StateCacheService::CheckNotAttached(const Model& m, const v1::SlotHandle& slot,
                                                 absl::string_view field) const {
  if (dataplane_ == nullptr) return absl::OkStatus();
  return dataplane_->CheckNotAttached(m, {HandleFromProto(slot)}, field);
}

absl::Status StateCacheService::CheckRegisterQuota(Tenant& caller, ModelSpec* spec) {
  return CheckRegisterQuotaImpl(*registry_, caller, spec);
}

StateCacheService::StateCacheService(Backend* backend, ModelRegistry* registry,
                                     std::shared_ptr<Metrics> metrics, Limits limits)
    : StateCacheService(backend, registry, std::move(metrics), limits, ComputeOptions()) {}

StateCacheService::StateCacheService(Backend* backend, ModelRegistry* registry,
                                     std::shared_ptr<Metrics> metrics, Limits limits,
                                     ComputeOptions compute)
    : backend_(backend),
      registry_(registry),
      metrics_(std::move(metrics)),
      limits_(limits),
      started_(absl::Now()),
      staging_(std::make_unique<StagingCache>(backend, compute.staging_cache_bytes)),
      coalescer_(compute.coalesce_updates ? std::make_unique<UpdateCoalescer>(
                                                backend, staging_.get(), compute.coalescer)
                                          : nullptr),
      default_tenant_("", TenantQuota()) {}

absl::StatusOr<Tenant*> StateCacheService::Authenticate(const grpc::ServerContext* ctx) {
  if (tenants_ == nullptr) return &default_tenant_;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError(
        "authorization: missing (send metadata 'authorization: Bearer <token>')");
  }
  ASSIGN_OR_RETURN(std::string token,
                   ParseBearer(absl::string_view(it->second.data(), it->second.size())));
  return tenants_->Authenticate(token);
}

template <typename F>
grpc::Status StateCacheService::Run(const grpc::ServerContext* ctx, const char* method,
                                    F&& handler) {
  const absl::Time start = absl::Now();
  CallGate::Ticket ticket(&gate_);
  const absl::Status status = [&]() -> absl::Status {
    if (!ticket.admitted()) return ShuttingDown(method);
    ASSIGN_OR_RETURN(Tenant * caller, Authenticate(ctx));
    RETURN_IF_ERROR(caller->Admit(start));
    return handler(*caller);
  }();
  if (metrics_) metrics_->ObserveRpc(method, static_cast<int>(status.code()), Seconds(start));
  return ToGrpcStatus(status);
}

// ---------------------------------------------------------------------------
// Models

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
  StatsToProto(m.slots->stats(), m.checkpoints ? m.checkpoints->stats() : CheckpointStats(),
               info->mutable_stats());
}

namespace {

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
                        " identity_layout=", info.identity_layout() ? "true" : "false"));
  return absl::OkStatus();
}

grpc::Status StateCacheService::RegisterModel(grpc::ServerContext* ctx,
                                              const v1::RegisterModelRequest* req,
                                              v1::RegisterModelResponse* resp) {
  return Run(ctx, "RegisterModel",
             [&](Tenant& caller) { return DoRegisterModel(caller, *req, resp); });
}

// ---------------------------------------------------------------------------
// Calibrate: the calibration library (kernels/calibration) over streamed
// trajectory files, as `statecachectl calibrate` runs it.

namespace {

absl::Status Prefixed(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

absl::Status ExceedsCalibrationBytes(int64_t total, int64_t limit) {
  return absl::ResourceExhaustedError(
      absl::StrCat("trajectory_file: the stream carries more than max_calibration_bytes=", limit,
                   " bytes of trajectories (", total, " so far)"));
}

}  // namespace

absl::Status StateCacheService::DoCalibrate(Tenant& caller,
                                            const std::vector<v1::CalibrateRequest>& msgs,
                                            v1::CalibrateResponse* resp) {
  if (msgs.empty() || !msgs[0].has_settings()) {
    return absl::InvalidArgumentError("settings: the first message must carry the settings");
  }
  const v1::CalibrateSettings& set = msgs[0].settings();
  absl::StatusOr<ModelGeometry> parsed_geometry = GeometryFromProto(set.geometry());
  if (!parsed_geometry.ok()) return Prefixed(parsed_geometry.status(), "settings.");
  const ModelGeometry geometry = *parsed_geometry;
  absl::StatusOr<FormatSpec> spec = ParseFormatSpec(set.format());
  if (!spec.ok()) return Prefixed(spec.status(), "settings.format: ");
  if (!IsMixedFormat(spec->format)) {
    return absl::InvalidArgumentError(absl::StrCat("settings.format: ", FormatSpecName(*spec),
                                                   " has no calibrated layout (use damp:K or "
                                                   "damp-sr:K)"));
  }
  Selector selector = DefaultSelector(spec->format);
  if (!set.selector().empty()) {
    absl::StatusOr<Selector> parsed = ParseSelector(set.selector());
    if (!parsed.ok()) return Prefixed(parsed.status(), "settings.selector: ");
    selector = *parsed;
  }
  if (set.sample_every() < 0) {
    return absl::InvalidArgumentError("settings.sample_every: must be >= 0 (0 = 8)");
  }
  if (set.horizon() < 0) {
    return absl::InvalidArgumentError("settings.horizon: must be >= 0 (0 = 256)");
  }
  if (!set.model_id().empty()) {
    absl::Status id_ok = ValidateModelId(set.model_id());
    if (!id_ok.ok()) return Prefixed(id_ok, "settings.");
  }

  // Parse every trajectory (bounded bytes), checking it against the settings.
  int64_t total_bytes = 0;
  std::vector<Trajectory> trajectories;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const v1::CalibrateRequest& m = msgs[i];
    const std::string where = absl::StrCat("message ", i, ": ");
    if (i > 0 && m.has_settings()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "settings: only the first message may carry settings"));
    }
    if (m.trajectory_file().empty()) {
      if (!m.domain().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "domain: given without a trajectory_file"));
      }
      continue;
    }
    total_bytes += static_cast<int64_t>(m.trajectory_file().size());
    if (total_bytes > limits_.max_calibration_bytes) {
      return ExceedsCalibrationBytes(total_bytes, limits_.max_calibration_bytes);
    }
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(m.trajectory_file());
    if (!file.ok()) return Prefixed(file.status(), absl::StrCat(where, "trajectory_file: "));
    absl::StatusOr<Trajectory> t = TrajectoryFromSafetensors(*file);
    if (!t.ok()) return Prefixed(t.status(), absl::StrCat(where, "trajectory_file: "));
    if (!(t->geometry == geometry)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "trajectory_file: geometry ", t->geometry.DebugString(),
          " differs from settings.geometry ", geometry.DebugString()));
    }
    if (!m.domain().empty()) t->domain = m.domain();
    trajectories.push_back(std::move(*t));
  }
  if (trajectories.empty()) {
    return absl::InvalidArgumentError("trajectory_file: no trajectories in the stream");
  }

  CalibrationOptions opts;
  if (set.sample_every() > 0) opts.sample_every = set.sample_every();
  if (set.horizon() > 0) opts.horizon = set.horizon();
  opts.damp_sr = spec->format == StateFormat::kDampSr;
  opts.prefetch = 0;  // already in memory
  ASSIGN_OR_RETURN(CalibrationStats st, statecache::Calibrate(TrajectoriesFromVector(&trajectories), opts));
  LayoutRequest lreq;
  lreq.format = *spec;
  lreq.selector = selector;
  ASSIGN_OR_RETURN(BuiltLayout built, BuildLayout(st, lreq));
  const std::map<std::string, std::string> info = {
      {"selector", SelectorName(selector)},
      {"calibration", absl::StrCat(trajectories.size(), " streamed trajectories")},
      {"samples_per_head", absl::StrCat(st.samples)},
      {"sample_every", absl::StrCat(opts.sample_every)},
      {"horizon", absl::StrCat(opts.horizon)},
      {"tau", absl::StrCat(lreq.tau)},
      {"domains", absl::StrJoin(st.domains, ",")},
      {"tool", "statecached Calibrate"},
  };
  ASSIGN_OR_RETURN(std::string file_bytes, SerializeLayout(built.layout, info, built.scores));

  resp->set_layout_fingerprint(built.layout.Fingerprint());
  resp->set_selector(SelectorName(selector));
  resp->set_samples(st.samples);
  resp->set_tokens(st.tokens);
  std::map<std::string, v1::CalibrationDomain> domains;
  for (const Trajectory& t : trajectories) {
    v1::CalibrationDomain& d = domains[t.domain];
    d.set_domain(t.domain);
    d.set_trajectories(d.trajectories() + 1);
    d.set_samples(d.samples() + t.tokens / opts.sample_every);
  }
  for (auto& [name, d] : domains) *resp->add_domains() = std::move(d);
  absl::StatusOr<StabilityReport> stab =
      ComputeStability(st, lreq, std::min(16, geometry.d_k));
  if (stab.ok()) {
    v1::CalibrationStability* s = resp->mutable_stability();
    s->set_top(stab->top);
    s->set_common(stab->overall.common);
    s->set_overlap(stab->overall.overlap);
    s->set_spearman(stab->overall.spearman);
    s->set_random_common(stab->random_common);
  }
  if (!set.model_id().empty()) {
    v1::RegisterModelRequest reg;
    reg.set_model_id(set.model_id());
    *reg.mutable_geometry() = set.geometry();
    reg.set_format(set.format());
    reg.set_layout_file(file_bytes);
    reg.set_slots(set.slots());
    reg.set_checkpoints(set.checkpoints());
    v1::RegisterModelResponse registered;
    RETURN_IF_ERROR(DoRegisterModel(caller, reg, &registered));
    *resp->mutable_model() = std::move(*registered.mutable_model());
  }
  resp->set_layout_file(std::move(file_bytes));
  LogEvent("model_calibrated",
           absl::StrCat("format=", FormatSpecName(*spec), " selector=", SelectorName(selector),
                        " trajectories=", trajectories.size(), " samples=", st.samples,
                        " fingerprint=", absl::Hex(built.layout.Fingerprint(), absl::kZeroPad16),
                        " model=", set.model_id()));
  return absl::OkStatus();
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
        return ExceedsCalibrationBytes(total_bytes, limits_.max_calibration_bytes);
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

// ---------------------------------------------------------------------------
// Slots

absl::Status StateCacheService::DoAllocateSlots(Tenant& caller, const v1::AllocateSlotsRequest& req,
                                                v1::AllocateSlotsResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  if (req.count() < 1 || req.count() > limits_.max_allocate) {
    return absl::InvalidArgumentError(absl::StrCat("count: ", req.count(), " is outside 1..",
                                                   limits_.max_allocate));
  }
  absl::MutexLock quota_lock(&caller.allocation_mu());
  if (caller.quota().max_slots > 0) {
    int64_t used = 0;
    for (const auto& mine : registry_->List(caller.name())) used += mine->slots->stats().allocated;
    if (used + req.count() > caller.quota().max_slots) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "quota max_slots: tenant '", caller.name(), "' has ", used, " slots allocated; ",
          req.count(), " more would exceed its quota of ", caller.quota().max_slots));
    }
  }
  ASSIGN_OR_RETURN(std::vector<SlotHandle> handles, m->slots->Allocate(req.count()));
  for (const SlotHandle& h : handles) HandleToProto(h, resp->add_slots());
  LogEvent("slots_allocated", absl::StrCat("model=", m->id, " count=", handles.size(),
                                           " used=", m->slots->stats().allocated, "/",
                                           m->slots->capacity()));
  return absl::OkStatus();
}

grpc::Status StateCacheService::AllocateSlots(grpc::ServerContext* ctx,
                                              const v1::AllocateSlotsRequest* req,
                                              v1::AllocateSlotsResponse* resp) {
  return Run(ctx, "AllocateSlots",
             [&](Tenant& caller) { return DoAllocateSlots(caller, *req, resp); });
}

absl::Status StateCacheService::DoReleaseSlots(Tenant& caller, const v1::ReleaseSlotsRequest& req) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  RETURN_IF_ERROR(CheckNotAttached(*m, req.slots(), "slots"));
  RETURN_IF_ERROR(m->slots->Release(HandlesFromProto(req.slots())));
  LogEvent("slots_released", absl::StrCat("model=", m->id, " count=", req.slots_size(),
                                          " used=", m->slots->stats().allocated, "/",
                                          m->slots->capacity()));
  return absl::OkStatus();
}

grpc::Status StateCacheService::ReleaseSlots(grpc::ServerContext* ctx,
                                             const v1::ReleaseSlotsRequest* req,
                                             v1::ReleaseSlotsResponse*) {
  return Run(ctx, "ReleaseSlots", [&](Tenant& caller) { return DoReleaseSlots(caller, *req); });
}

// ---------------------------------------------------------------------------
// Compute

absl::Status StateCacheService::DoUpdate(Tenant& caller, const v1::UpdateRequest& req,
                                         v1::UpdateResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  if (dataplane_ != nullptr && DataPlane::UsesBuffers(req)) {
    return dataplane_->Update(caller.name(), *m, req, ComputeLimitsOf(limits_),
                              KernelObserverOf(metrics_.get()), resp);
  }
  const ModelGeometry& g = m->layout.geometry();
  RETURN_IF_ERROR(CheckLayer(*m, req.layer()));
  const int b = req.slots_size();
  RETURN_IF_ERROR(CheckBatch(b, limits_.max_batch, "slots"));
  RETURN_IF_ERROR(CheckWork(int64_t{b} * g.h_v, limits_.max_work_heads, "slots"));
  ASSIGN_OR_RETURN(TensorBytes q, CheckTensor(req.q(), "q", kInputDTypes, {b, g.h_qk, g.d_k}));
  ASSIGN_OR_RETURN(TensorBytes k, CheckTensor(req.k(), "k", {q.dtype}, {b, g.h_qk, g.d_k}));
  ASSIGN_OR_RETURN(TensorBytes v, CheckTensor(req.v(), "v", {q.dtype}, {b, g.h_v, g.d_v}));
  std::vector<int64_t> g_shape = {b, g.h_v};
  if (g.arch == Arch::kKda) g_shape.push_back(g.d_k);
  ASSIGN_OR_RETURN(TensorBytes gt, CheckTensor(req.g(), "g", kFp32Only, g_shape));
  ASSIGN_OR_RETURN(TensorBytes bt, CheckTensor(req.beta(), "beta", kFp32Only, {b, g.h_v}));
  std::vector<float> gates = Floats(gt), betas = Floats(bt);
  std::string q_clean, k_clean, v_clean;
  if (req.sanitize_non_finite()) {
    resp->set_sanitized_values(SanitizeTensor(&q, &q_clean) + SanitizeTensor(&k, &k_clean) +
                               SanitizeTensor(&v, &v_clean) + SanitizeFloats(&gates) +
                               SanitizeFloats(&betas));
  }
  RETURN_IF_ERROR(ValidateFinite("q", q.dtype, q.data, q.count));
  RETURN_IF_ERROR(ValidateFinite("k", k.dtype, k.data, k.count));
  RETURN_IF_ERROR(ValidateFinite("v", v.dtype, v.data, v.count));
  RETURN_IF_ERROR(CheckMagnitudes("", q, k, v, g.d_k, limits_.max_abs_value));
  RETURN_IF_ERROR(ValidateGates(gates.data(), gt.count, betas.data(), bt.count));

  RETURN_IF_ERROR(CheckNotAttached(*m, req.slots(), "slots"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m->slots->Acquire(HandlesFromProto(req.slots()), "slots"));
  // o is written straight into the response (no staging on a host-memory
  // backend); the inputs are read from the request's bytes.
  v1::Tensor* o = resp->mutable_o();
  o->set_dtype(v1::DTYPE_FP32);
  for (int64_t d : {int64_t{b}, int64_t{g.h_v}, int64_t{g.d_v}}) o->add_shape(d);
  std::string* data = o->mutable_data();
  data->resize(int64_t{b} * g.h_v * g.d_v * 4);
  HostUpdate u;
  u.batch = b;
  u.slots = access.indices().data();
  u.dtype = q.dtype;
  u.q = q.data;
  u.k = k.data;
  u.v = v.data;
  u.g = gates.data();
  u.beta = betas.data();
  u.o = reinterpret_cast<float*>(data->data());
  UpdateCoalescer::Launch launch;
  if (coalescer_ != nullptr) {
    RETURN_IF_ERROR(coalescer_->Run(*m->prepared, m->slots->view(), req.layer(), u, &launch));
  } else {
    RETURN_IF_ERROR(RunHostUpdate(*backend_, *staging_, *m->prepared, m->slots->view(),
                                  req.layer(), u, &launch.kernel_seconds));
    launch.batch = b;
    launch.calls = 1;
    launch.leader = true;
  }
  resp->set_kernel_micros(static_cast<int64_t>(launch.kernel_seconds * 1e6));
  if (metrics_ && launch.leader) {
    // Once per launch: its batch is every merged call's slots.
    metrics_->ObserveKernel("decode_update", launch.kernel_seconds);
    metrics_->ObserveUpdateBatch(launch.batch);
  }
  return absl::OkStatus();
}

grpc::Status StateCacheService::Update(grpc::ServerContext* ctx, const v1::UpdateRequest* req,
                                       v1::UpdateResponse* resp) {
  return Run(ctx, "Update", [&](Tenant& caller) {
    resp->set_sequence(req->sequence());
    return DoUpdate(caller, *req, resp);
  });
}

grpc::Status StateCacheService::UpdateStream(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::UpdateResponse, v1::UpdateRequest>* stream) {
  CallGate::Ticket ticket(&gate_, [ctx] { ctx->TryCancel(); });
  absl::StatusOr<Tenant*> caller =
      ticket.admitted() ? Authenticate(ctx) : ShuttingDown("UpdateStream");
  if (!caller.ok()) {
    if (metrics_) metrics_->ObserveRpc("UpdateStream", static_cast<int>(caller.status().code()), 0);
    return ToGrpcStatus(caller.status());
  }
  v1::UpdateRequest req;
  while (true) {
    bool got = false;
    const bool open = ticket.Idle([&] { return stream->Read(&req); }, &got);
    if (!got) {
      // End of the client's messages, or a drain that began between two.
      return open ? grpc::Status::OK : ToGrpcStatus(StreamShutDown());
    }
    const absl::Time start = absl::Now();
    v1::UpdateResponse resp;
    absl::Status status = open ? (*caller)->Admit(start) : ShuttingDown("UpdateStream");
    if (status.ok()) status = DoUpdate(**caller, req, &resp);
    if (!status.ok()) {
      resp.Clear();
      resp.mutable_error()->set_code(static_cast<int>(status.code()));
      resp.mutable_error()->set_message(std::string(status.message()));
    }
    resp.set_sequence(req.sequence());
    if (metrics_) {
      metrics_->ObserveRpc("UpdateStream", static_cast<int>(status.code()), Seconds(start));
    }
    if (!stream->Write(resp)) break;  // client went away
    if (!open) return ToGrpcStatus(StreamShutDown());
    if (ctx->IsCancelled()) break;
  }
  return grpc::Status::OK;
}

grpc::Status StateCacheService::SubmitUpdates(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::SubmitUpdatesResponse, v1::SubmitUpdatesRequest>* stream) {
  CallGate::Ticket ticket(&gate_, [ctx] { ctx->TryCancel(); });
  absl::StatusOr<Tenant*> caller =
      ticket.admitted() ? Authenticate(ctx) : ShuttingDown("SubmitUpdates");
  if (!caller.ok()) {
    if (metrics_) metrics_->ObserveRpc("SubmitUpdates", static_cast<int>(caller.status().code()), 0);
    return ToGrpcStatus(caller.status());
  }
  if (dataplane_ == nullptr) return ToGrpcStatus(NoDataPlane());
  // A drain ends the stream like a half-close (submissions read before it
  // complete and are answered; one read after it is dropped unanswered, not
  // run), then the stream ends UNAVAILABLE.
  bool drained = false;
  DataPlane::StreamIo io;
  io.read = [&](v1::SubmitUpdatesRequest* r) {
    if (ctx->IsCancelled()) return false;
    bool got = false;
    if (!ticket.Idle([&] { return stream->Read(r); }, &got)) {
      drained = true;
      return false;
    }
    return got;
  };
  io.write = [&](const v1::SubmitUpdatesResponse& r) { return stream->Write(r); };
  io.admit = [&] { return (*caller)->Admit(absl::Now()); };
  io.done = [&](absl::StatusCode code, double seconds) {
    if (metrics_) metrics_->ObserveRpc("SubmitUpdates", static_cast<int>(code), seconds);
  };
  io.cancelled = [ctx] { return ctx->IsCancelled(); };
  absl::Status status = dataplane_->SubmitUpdates((*caller)->name(), io,
                                                  ComputeLimitsOf(limits_),
                                                  KernelObserverOf(metrics_.get()));
  if (status.ok() && drained) status = StreamShutDown();
  return ToGrpcStatus(status);
}

absl::Status StateCacheService::DoPrefill(Tenant& caller, const v1::PrefillRequest& req,
                                          v1::PrefillResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  const ModelGeometry& g = m->layout.geometry();
  const int b = req.slots_size();
  RETURN_IF_ERROR(CheckBatch(b, limits_.max_batch, "slots"));
  if (dataplane_ != nullptr && DataPlane::UsesBuffers(req)) {
    return dataplane_->Prefill(caller.name(), *m, req, ComputeLimitsOf(limits_),
                               KernelObserverOf(metrics_.get()), resp);
  }
  RETURN_IF_ERROR(CheckNotAttached(*m, req.slots(), "slots"));

  if (req.input_case() == v1::PrefillRequest::kStates) {
    RETURN_IF_ERROR(CheckWork(int64_t{b} * g.layers * g.h_v, limits_.max_work_heads, "states"));
    ASSIGN_OR_RETURN(TensorBytes states,
                     CheckTensor(req.states(), "states", kFp32Only,
                                 {b, g.layers, g.h_v, g.d_k, g.d_v}));
    RETURN_IF_ERROR(ValidateStateValues("states", static_cast<const float*>(states.data),
                                        states.count));
    ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                     m->slots->Acquire(HandlesFromProto(req.slots()), "slots"));
    Staging st;
    const int s_idx = st.Add(access.indices().data(), b * sizeof(int32_t));
    const int s_states = st.Add(states.data, states.bytes);
    RETURN_IF_ERROR(st.Commit(*backend_, *staging_));
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(backend_->PackStates(*m->prepared, m->slots->view(), st.at<int32_t>(s_idx), b,
                                         st.at<float>(s_states)));
    const double kernel = Seconds(start);
    resp->set_kernel_micros(static_cast<int64_t>(kernel * 1e6));
    if (metrics_) metrics_->ObserveKernel("pack_states", kernel);
    return absl::OkStatus();
  }
  if (req.input_case() != v1::PrefillRequest::kTokens) {
    return absl::InvalidArgumentError("input: set tokens or states");
  }
  const v1::PrefillTokens& t = req.tokens();
  if (t.layer() < 0 || t.layer() >= g.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens.layer: ", t.layer(), " is outside 0..", g.layers - 1));
  }
  if (t.q().shape_size() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens.q.shape: ", ShapeString(std::vector<int64_t>(t.q().shape().begin(), t.q().shape().end())),
        ", want [B, T, h_qk, d_k]"));
  }
  const int64_t tokens = t.q().shape(1);
  if (tokens < 1 || tokens > limits_.max_prefill_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("tokens.q.shape[1]: T = ", tokens,
                                                   " is outside 1..", limits_.max_prefill_tokens));
  }
  RETURN_IF_ERROR(CheckWork(int64_t{b} * tokens * g.h_v, limits_.max_work_heads, "tokens"));
  ASSIGN_OR_RETURN(TensorBytes q,
                   CheckTensor(t.q(), "tokens.q", kInputDTypes, {b, tokens, g.h_qk, g.d_k}));
  ASSIGN_OR_RETURN(TensorBytes k,
                   CheckTensor(t.k(), "tokens.k", {q.dtype}, {b, tokens, g.h_qk, g.d_k}));
  ASSIGN_OR_RETURN(TensorBytes v,
                   CheckTensor(t.v(), "tokens.v", {q.dtype}, {b, tokens, g.h_v, g.d_v}));
  std::vector<int64_t> g_shape = {b, tokens, g.h_v};
  if (g.arch == Arch::kKda) g_shape.push_back(g.d_k);
  ASSIGN_OR_RETURN(TensorBytes gt, CheckTensor(t.g(), "tokens.g", kFp32Only, g_shape));
  ASSIGN_OR_RETURN(TensorBytes bt,
                   CheckTensor(t.beta(), "tokens.beta", kFp32Only, {b, tokens, g.h_v}));
  std::vector<float> gates = Floats(gt), betas = Floats(bt);
  std::string q_clean, k_clean, v_clean;
  if (t.sanitize_non_finite()) {
    resp->set_sanitized_values(SanitizeTensor(&q, &q_clean) + SanitizeTensor(&k, &k_clean) +
                               SanitizeTensor(&v, &v_clean) + SanitizeFloats(&gates) +
                               SanitizeFloats(&betas));
  }
  RETURN_IF_ERROR(ValidateFinite("tokens.q", q.dtype, q.data, q.count));
  RETURN_IF_ERROR(ValidateFinite("tokens.k", k.dtype, k.data, k.count));
  RETURN_IF_ERROR(ValidateFinite("tokens.v", v.dtype, v.data, v.count));
  RETURN_IF_ERROR(CheckMagnitudes("tokens.", q, k, v, g.d_k, limits_.max_abs_value));
  {
    absl::Status gate_status = ValidateGates(gates.data(), gt.count, betas.data(), bt.count);
    if (!gate_status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tokens.", gate_status.message()));
    }
  }

  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m->slots->Acquire(HandlesFromProto(req.slots()), "slots"));
  const int64_t o_count = t.want_output() ? int64_t{b} * tokens * g.h_v * g.d_v : 0;
  Staging st;
  const int s_idx = st.Add(access.indices().data(), b * sizeof(int32_t));
  const int s_q = st.Add(q.data, q.bytes), s_k = st.Add(k.data, k.bytes),
            s_v = st.Add(v.data, v.bytes);
  const int s_g = st.Add(gates.data(), gt.bytes), s_b = st.Add(betas.data(), bt.bytes);
  const int s_o = st.Add(nullptr, o_count * 4);
  RETURN_IF_ERROR(st.Commit(*backend_, *staging_));
  PrefillInputs in;
  in.batch = b;
  in.tokens = static_cast<int>(tokens);
  in.slots = st.at<int32_t>(s_idx);
  in.dtype = q.dtype;
  in.q = st.at<void>(s_q);
  in.k = st.at<void>(s_k);
  in.v = st.at<void>(s_v);
  in.g = st.at<float>(s_g);
  in.beta = st.at<float>(s_b);
  in.o = t.want_output() ? st.at<float>(s_o) : nullptr;
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(backend_->Prefill(*m->prepared, m->slots->view(), t.layer(), in));
  const double kernel = Seconds(start);
  if (t.want_output()) {
    v1::Tensor* o = resp->mutable_o();
    o->set_dtype(v1::DTYPE_FP32);
    for (int64_t d : {int64_t{b}, tokens, int64_t{g.h_v}, int64_t{g.d_v}}) o->add_shape(d);
    std::string* data = o->mutable_data();
    data->resize(o_count * 4);
    RETURN_IF_ERROR(backend_->CopyOut(data->data(), in.o, o_count * 4));
  }
  resp->set_kernel_micros(static_cast<int64_t>(kernel * 1e6));
  if (metrics_) metrics_->ObserveKernel("prefill", kernel);
  return absl::OkStatus();
}

grpc::Status StateCacheService::Prefill(grpc::ServerContext* ctx, const v1::PrefillRequest* req,
                                        v1::PrefillResponse* resp) {
  return Run(ctx, "Prefill", [&](Tenant& caller) { return DoPrefill(caller, *req, resp); });
}

// ---------------------------------------------------------------------------
// Prefix cache

absl::Status StateCacheService::DoSnapshot(Tenant& caller, const v1::SnapshotRequest& req,
                                           v1::SnapshotResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  ASSIGN_OR_RETURN(PrefixKey key,
                   KeyFromTokensOrKey(req.prefix_case() == v1::SnapshotRequest::kTokens,
                                      req.tokens(), req.prefix_case() == v1::SnapshotRequest::kKey,
                                      req.key(), "tokens", "key"));
  const int layers = m->layout.geometry().layers;
  if (req.aux_size() != 0 && req.aux_size() != layers) {
    return absl::InvalidArgumentError(absl::StrCat("aux: ", req.aux_size(),
                                                   " entries, want 0 or one per layer (", layers,
                                                   ")"));
  }
  int64_t aux_bytes = 0;
  for (const std::string& a : req.aux()) aux_bytes += static_cast<int64_t>(a.size());
  if (aux_bytes > limits_.max_aux_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("aux: ", aux_bytes, " bytes exceed the limit of ",
                                                   limits_.max_aux_bytes));
  }
  if (m->checkpoints == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("model_id: '", m->id, "' has no checkpoint memory"));
  }
  const SlotHandle handle = HandleFromProto(req.slot());
  RETURN_IF_ERROR(CheckNotAttached(*m, req.slot(), "slot"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access, m->slots->Acquire({handle}, "slot"));
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(CheckpointStore::PutResult put,
                   m->checkpoints->Put(key, m->slots->view(), access.indices()[0],
                                       std::vector<std::string>(req.aux().begin(), req.aux().end())));
  if (metrics_) metrics_->ObserveKernel("copy_slots", Seconds(start));
  KeyToProto(key, resp->mutable_key());
  resp->set_evicted(put.evicted);
  if (limits_.log_cache_events) {
    LogEvent("snapshot", absl::StrCat("model=", m->id, " key=", key.DebugString(),
                                      " evicted=", put.evicted));
  }
  return absl::OkStatus();
}

grpc::Status StateCacheService::Snapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest* req,
                                         v1::SnapshotResponse* resp) {
  return Run(ctx, "Snapshot", [&](Tenant& caller) { return DoSnapshot(caller, *req, resp); });
}

absl::Status StateCacheService::DoRestore(Tenant& caller, const v1::RestoreRequest& req,
                                          v1::RestoreResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  if (!req.has_key() || req.key().num_tokens() < 1) {
    return absl::InvalidArgumentError("key: missing or num_tokens < 1");
  }
  const PrefixKey key = KeyFromProto(req.key());
  if (m->checkpoints == nullptr) {
    return absl::NotFoundError(absl::StrCat("key: no checkpoint for prefix ", key.DebugString(),
                                            " (model has no checkpoint memory)"));
  }
  RETURN_IF_ERROR(CheckNotAttached(*m, req.slot(), "slot"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m->slots->Acquire({HandleFromProto(req.slot())}, "slot"));
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(CheckpointStore::RestoreResult restored,
                   m->checkpoints->Restore(key, req.lease_id(), m->slots->view(),
                                           access.indices()[0]));
  if (metrics_) metrics_->ObserveKernel("copy_slots", Seconds(start));
  for (std::string& a : restored.aux) resp->add_aux(std::move(a));
  resp->set_num_tokens(restored.num_tokens);
  if (limits_.log_cache_events) {
    LogEvent("restore", absl::StrCat("model=", m->id, " key=", key.DebugString()));
  }
  return absl::OkStatus();
}

grpc::Status StateCacheService::Restore(grpc::ServerContext* ctx, const v1::RestoreRequest* req,
                                        v1::RestoreResponse* resp) {
  return Run(ctx, "Restore", [&](Tenant& caller) { return DoRestore(caller, *req, resp); });
}

absl::Status StateCacheService::DoLookupPrefix(Tenant& caller, const v1::LookupPrefixRequest& req,
                                               v1::LookupPrefixResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  std::vector<PrefixKey> candidates;
  if (req.candidates_case() == v1::LookupPrefixRequest::kTokens) {
    if (req.tokens().ids_size() > limits_.max_lookup_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("tokens: ", req.tokens().ids_size(),
                                                     " tokens exceed the limit of ",
                                                     limits_.max_lookup_tokens));
    }
    candidates = ChainPrefixKeys(req.tokens().ids());
  } else if (req.candidates_case() == v1::LookupPrefixRequest::kKeys) {
    if (req.keys().keys_size() > limits_.max_lookup_tokens) {
      return absl::InvalidArgumentError("keys: too many candidate keys");
    }
    for (int i = 0; i < req.keys().keys_size(); ++i) {
      if (req.keys().keys(i).num_tokens() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("keys.keys[", i, "].num_tokens: must be >= 1"));
      }
      candidates.push_back(KeyFromProto(req.keys().keys(i)));
    }
  } else {
    return absl::InvalidArgumentError("candidates: set tokens or keys");
  }
  if (req.lease_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("lease_ms: ", req.lease_ms(), " is negative"));
  }
  if (m->checkpoints == nullptr) {
    int64_t longest = 0;
    for (const PrefixKey& k : candidates) longest = std::max(longest, k.num_tokens);
    resp->set_hit(false);
    resp->set_candidate_tokens(longest);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(CheckpointStore::LookupResult r,
                   m->checkpoints->Lookup(candidates, absl::Milliseconds(req.lease_ms())));
  resp->set_hit(r.hit);
  resp->set_candidate_tokens(r.candidate_tokens);
  if (r.hit) {
    KeyToProto(r.key, resp->mutable_key());
    resp->set_lease_id(r.lease_id);
    resp->set_lease_expiry_unix_ms(absl::ToUnixMillis(r.lease_expiry));
  }
  if (limits_.log_cache_events) {
    LogEvent("lookup", absl::StrCat("model=", m->id, " hit=", r.hit ? "true" : "false",
                                    " tokens=", r.hit ? r.key.num_tokens : 0, "/",
                                    r.candidate_tokens));
  }
  return absl::OkStatus();
}

grpc::Status StateCacheService::LookupPrefix(grpc::ServerContext* ctx,
                                             const v1::LookupPrefixRequest* req,
                                             v1::LookupPrefixResponse* resp) {
  return Run(ctx, "LookupPrefix",
             [&](Tenant& caller) { return DoLookupPrefix(caller, *req, resp); });
}

// ---------------------------------------------------------------------------
// Transfer

absl::Status StateCacheService::DoExport(Tenant& caller, const v1::ExportRequest& req,
                                         v1::ExportResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  RETURN_IF_ERROR(CheckNotAttached(*m, req.slot(), "slot"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m->slots->Acquire({HandleFromProto(req.slot())}, "slot"));
  TagsToProto(m->id, m->layout, resp->mutable_tags());
  const int64_t bytes = m->slots->slot_bytes();
  std::string* packed = resp->mutable_packed();
  packed->resize(bytes);
  return backend_->CopyOut(packed->data(), m->slots->view().slot(access.indices()[0]), bytes);
}

grpc::Status StateCacheService::Export(grpc::ServerContext* ctx, const v1::ExportRequest* req,
                                       v1::ExportResponse* resp) {
  return Run(ctx, "Export", [&](Tenant& caller) { return DoExport(caller, *req, resp); });
}

absl::Status StateCacheService::DoImport(Tenant& caller, const v1::ImportRequest& req) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  if (!req.has_tags()) return absl::InvalidArgumentError("tags: missing");
  RETURN_IF_ERROR(CheckTagsMatch(req.tags(), m->id, m->layout));
  const int64_t bytes = m->slots->slot_bytes();
  if (static_cast<int64_t>(req.packed().size()) != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed: ", req.packed().size(), " bytes, want ", bytes));
  }
  // Decode the bytes in a scratch slot first: states that do not decode to
  // accepted values (finite, |x| <= kMaxStateMagnitude: whatever the format's
  // values or scales) are rejected before the target slot is touched.
  const ModelGeometry& g = m->layout.geometry();
  PoolView scratch = m->slots->view();
  scratch.num_slots = 1;
  const int64_t values = g.HeadsPerSlot() * g.d_k * g.d_v;
  Staging st;
  const int32_t zero = 0;
  const int s_idx = st.Add(&zero, sizeof(zero));
  const int s_slot = st.Add(req.packed().data(), bytes);
  const int s_states = st.Add(nullptr, values * 4);
  RETURN_IF_ERROR(st.Commit(*backend_, *staging_));
  scratch.base = st.at<uint8_t>(s_slot);
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(backend_->UnpackStates(*m->prepared, scratch, st.at<int32_t>(s_idx), 1,
                                         st.at<float>(s_states)));
  if (metrics_) metrics_->ObserveKernel("unpack_states", Seconds(start));
  std::vector<float> states(values);
  RETURN_IF_ERROR(backend_->CopyOut(states.data(), st.at<float>(s_states), values * 4));
  {
    absl::Status accepted = ValidateStateValues("packed (decoded state)", states.data(), values);
    if (!accepted.ok()) return accepted;
  }
  RETURN_IF_ERROR(CheckNotAttached(*m, req.slot(), "slot"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m->slots->Acquire({HandleFromProto(req.slot())}, "slot"));
  Staging dst;
  const int d_idx = dst.Add(access.indices().data(), sizeof(int32_t));
  RETURN_IF_ERROR(dst.Commit(*backend_, *staging_));
  return backend_->CopySlots(scratch, st.at<int32_t>(s_idx), m->slots->view(),
                             dst.at<int32_t>(d_idx), 1);
}

grpc::Status StateCacheService::Import(grpc::ServerContext* ctx, const v1::ImportRequest* req,
                                       v1::ImportResponse*) {
  return Run(ctx, "Import", [&](Tenant& caller) { return DoImport(caller, *req); });
}

// ---------------------------------------------------------------------------
// Observability

absl::Status StateCacheService::DoGetStats(Tenant& caller, const v1::GetStatsRequest& req,
                                           v1::GetStatsResponse* resp) {
  resp->set_backend(backend_->name());
  resp->set_backend_description(backend_->Describe());
  resp->set_state_memory_budget_bytes(registry_->state_budget_bytes());
  resp->set_state_memory_reserved_bytes(registry_->state_reserved_bytes());
  resp->set_checkpoint_memory_budget_bytes(registry_->checkpoint_budget_bytes());
  resp->set_checkpoint_memory_reserved_bytes(registry_->checkpoint_reserved_bytes());
  if (tenants_ != nullptr) {
    // Authenticated: report only the caller's own reservations and quotas,
    // nothing about other tenants.
    int64_t state = 0, checkpoint = 0;
    for (const auto& m : registry_->List(caller.name())) {
      state += m->state_bytes;
      checkpoint += m->checkpoint_bytes;
    }
    const TenantQuota& q = caller.quota();
    resp->set_state_memory_budget_bytes(q.max_state_bytes > 0 ? q.max_state_bytes
                                                              : registry_->state_budget_bytes());
    resp->set_state_memory_reserved_bytes(state);
    resp->set_checkpoint_memory_budget_bytes(
        q.max_checkpoint_bytes > 0 ? q.max_checkpoint_bytes : registry_->checkpoint_budget_bytes());
    resp->set_checkpoint_memory_reserved_bytes(checkpoint);
  }
  resp->set_uptime_seconds(Seconds(started_));
  resp->set_version("statecache v1");
  std::vector<std::shared_ptr<Model>> models;
  if (req.model_id().empty()) {
    models = registry_->List(caller.name());
  } else {
    ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
    models.push_back(std::move(m));
  }
  for (const auto& m : models) {
    v1::ModelStatsEntry* e = resp->add_models();
    e->set_model_id(m->id);
    e->set_format(FormatSpecName(m->layout.format()));
    StatsToProto(m->slots->stats(), m->checkpoints ? m->checkpoints->stats() : CheckpointStats(),
                 e->mutable_stats());
  }
  return absl::OkStatus();
}

grpc::Status StateCacheService::GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest* req,
                                         v1::GetStatsResponse* resp) {
  return Run(ctx, "GetStats", [&](Tenant& caller) { return DoGetStats(caller, *req, resp); });
}

// ---------------------------------------------------------------------------
// Data plane (issue 10)

#define STATECACHE_DATAPLANE_RPC(Name, Request, Response, ...)                          \
  grpc::Status StateCacheService::Name(grpc::ServerContext* ctx, const v1::Request* req, \
                                       v1::Response* resp) {                             \
    return Run(ctx, #Name, [&](Tenant& caller) -> absl::Status {                         \
      if (dataplane_ == nullptr) return NoDataPlane();                                   \
      return dataplane_->Name(caller.name(), *req __VA_ARGS__);                          \
    });                                                                                  \
  }

STATECACHE_DATAPLANE_RPC(OpenSession, OpenSessionRequest, OpenSessionResponse, , resp)
STATECACHE_DATAPLANE_RPC(RegisterBuffer, RegisterBufferRequest, RegisterBufferResponse, , resp)
STATECACHE_DATAPLANE_RPC(AttachSlots, AttachSlotsRequest, AttachSlotsResponse, , resp)
STATECACHE_DATAPLANE_RPC(CloseSession, CloseSessionRequest, CloseSessionResponse)
STATECACHE_DATAPLANE_RPC(ReleaseBuffer, ReleaseBufferRequest, ReleaseBufferResponse)
STATECACHE_DATAPLANE_RPC(DetachSlots, DetachSlotsRequest, DetachSlotsResponse)
#undef STATECACHE_DATAPLANE_RPC

}  // namespace statecache
