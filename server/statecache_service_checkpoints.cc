// StateCacheService, prefix cache: Snapshot, Restore, LookupPrefix
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

}  // namespace statecache
