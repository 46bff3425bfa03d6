// StateCacheService, prefix cache: Snapshot, Restore, LookupPrefix,
// ReleaseLease and their batches
// (adapters over server/ops/state_ops.h).
#include <memory>

#include "kernels/common/status_macros.h"
#include "server/ops/state_ops.h"
#include "server/statecache_service.h"
#include "server/statecache_service_internal.h"

namespace statecache {

absl::Status StateCacheService::DoSnapshot(Tenant& caller, const v1::SnapshotRequest& req,
                                           v1::SnapshotResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  return ops::Snapshot(ops_, *m, req, resp);
}

grpc::Status StateCacheService::Snapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest* req,
                                         v1::SnapshotResponse* resp) {
  return Run(ctx, "Snapshot", [&](Tenant& caller) { return DoSnapshot(caller, *req, resp); });
}

absl::Status StateCacheService::DoRestore(Tenant& caller, const v1::RestoreRequest& req,
                                          v1::RestoreResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  return ops::Restore(ops_, *m, req, resp);
}

grpc::Status StateCacheService::Restore(grpc::ServerContext* ctx, const v1::RestoreRequest* req,
                                        v1::RestoreResponse* resp) {
  return Run(ctx, "Restore", [&](Tenant& caller) { return DoRestore(caller, *req, resp); });
}

absl::Status StateCacheService::DoLookupPrefix(Tenant& caller, const v1::LookupPrefixRequest& req,
                                               v1::LookupPrefixResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  return ops::LookupPrefix(ops_, *m, req, resp);
}

grpc::Status StateCacheService::LookupPrefix(grpc::ServerContext* ctx, const v1::LookupPrefixRequest* req,
                                             v1::LookupPrefixResponse* resp) {
  return Run(ctx, "LookupPrefix", [&](Tenant& caller) { return DoLookupPrefix(caller, *req, resp); });
}

absl::Status StateCacheService::DoReleaseLease(Tenant& caller, const v1::ReleaseLeaseRequest& req) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  return ops::ReleaseLease(ops_, *m, req);
}

grpc::Status StateCacheService::ReleaseLease(grpc::ServerContext* ctx,
                                             const v1::ReleaseLeaseRequest* req,
                                             v1::ReleaseLeaseResponse*) {
  return Run(ctx, "ReleaseLease", [&](Tenant& caller) { return DoReleaseLease(caller, *req); });
}

absl::Status StateCacheService::DoBatchSnapshot(Tenant& caller, const v1::BatchSnapshotRequest& req,
                                                v1::BatchSnapshotResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  return ops::BatchSnapshot(ops_, *m, req, resp);
}

grpc::Status StateCacheService::BatchSnapshot(grpc::ServerContext* ctx,
                                              const v1::BatchSnapshotRequest* req,
                                              v1::BatchSnapshotResponse* resp) {
  return Run(ctx, "BatchSnapshot",
             [&](Tenant& caller) { return DoBatchSnapshot(caller, *req, resp); });
}

absl::Status StateCacheService::DoBatchRestore(Tenant& caller, const v1::BatchRestoreRequest& req,
                                               v1::BatchRestoreResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  return ops::BatchRestore(ops_, *m, req, resp);
}

grpc::Status StateCacheService::BatchRestore(grpc::ServerContext* ctx,
                                             const v1::BatchRestoreRequest* req,
                                             v1::BatchRestoreResponse* resp) {
  return Run(ctx, "BatchRestore",
             [&](Tenant& caller) { return DoBatchRestore(caller, *req, resp); });
}

absl::Status StateCacheService::DoBatchLookupPrefix(Tenant& caller,
                                                    const v1::BatchLookupPrefixRequest& req,
                                                    v1::BatchLookupPrefixResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  return ops::BatchLookupPrefix(ops_, *m, req, resp);
}

grpc::Status StateCacheService::BatchLookupPrefix(grpc::ServerContext* ctx,
                                                  const v1::BatchLookupPrefixRequest* req,
                                                  v1::BatchLookupPrefixResponse* resp) {
  return Run(ctx, "BatchLookupPrefix",
             [&](Tenant& caller) { return DoBatchLookupPrefix(caller, *req, resp); });
}

}  // namespace statecache
