// StateCacheService: construction, authentication, the edge's statuses and
// GetStats. The RPC groups live in service_models.cc, service_slots.cc,
// statecache_service_{models,slots,state,checkpoints,dataplane}.cc.
#include "server/statecache_service.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"
#include "server/auth/tenants.h"
#include "server/core/proto_convert.h"
#include "server/ops/checks.h"
#include "server/statecache_service_internal.h"

namespace statecache {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numeric values.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

namespace service_internal {

absl::Status ShuttingDown(absl::string_view method) {
  return absl::UnavailableError(absl::StrCat(
      "server: shutting down; ", method, " did not run (nothing was written)"));
}

absl::Status StreamShutDown() {
  return absl::UnavailableError(
      "server: shutting down; the stream's messages without a response did not run");
}

absl::Status NoDataPlane() {
  return absl::FailedPreconditionError("session_id: this server has no data plane");
}

ops::KernelObserver KernelObserverOf(Metrics* metrics) {
  if (metrics == nullptr) return nullptr;
  return [metrics](const char* kernel, double seconds, int batch) {
    metrics->ObserveKernel(kernel, seconds);
    if (std::strcmp(kernel, "decode_update") == 0) metrics->ObserveUpdateBatch(batch);
  };
}

}  // namespace service_internal

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
      update_phases_(compute.update_phases),
      default_tenant_("", TenantQuota()) {
  ops_.backend = backend_;
  ops_.staging = staging_.get();
  ops_.coalescer = coalescer_.get();
  ops_.limits = limits_;
  ops_.observe = service_internal::KernelObserverOf(metrics_.get());
  ops_.phases = update_phases_.get();
}

void StateCacheService::set_dataplane(DataPlane* dataplane) {
  dataplane_ = dataplane;
  ops_.not_attached = nullptr;
  if (dataplane != nullptr) {
    ops_.not_attached = [dataplane](const Model& m, absl::Span<const SlotHandle> handles,
                                    absl::string_view field) {
      return dataplane->CheckNotAttached(m, handles, field);
    };
  }
}

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
  resp->set_uptime_seconds(SecondsSince(started_));
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

}  // namespace statecache
