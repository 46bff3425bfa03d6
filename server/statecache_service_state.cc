// StateCacheService, state operations: Update, UpdateStream, Prefill,
// Export, Import. Each is an adapter over server/ops/state_ops.h: find the
// caller's model, run the operation; Update and Prefill naming a registered
// buffer go to the data plane, whose tensor source runs the same sequence.
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"
#include "server/ops/checks.h"
#include "server/ops/state_ops.h"
#include "server/statecache_service.h"
#include "server/statecache_service_internal.h"

namespace statecache {

using service_internal::ShuttingDown;
using service_internal::StreamShutDown;

absl::Status StateCacheService::DoUpdate(Tenant& caller, const v1::UpdateRequest& req,
                                         v1::UpdateResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  if (dataplane_ != nullptr && DataPlane::UsesBuffers(req)) {
    return dataplane_->Update(caller.name(), *m, req, limits_, ops_.observe, resp);
  }
  ops::RequestBytes source;
  return ops::Update(ops_, source, *m, req, resp);
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
      metrics_->ObserveRpc("UpdateStream", static_cast<int>(status.code()), SecondsSince(start));
    }
    if (!stream->Write(resp)) break;  // client went away
    if (!open) return ToGrpcStatus(StreamShutDown());
    if (ctx->IsCancelled()) break;
  }
  return grpc::Status::OK;
}

absl::Status StateCacheService::DoPrefill(Tenant& caller, const v1::PrefillRequest& req,
                                          v1::PrefillResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  if (dataplane_ != nullptr && DataPlane::UsesBuffers(req)) {
    return dataplane_->Prefill(caller.name(), *m, req, limits_, ops_.observe, resp);
  }
  return ops::Prefill(ops_, *m, req, resp);
}

grpc::Status StateCacheService::Prefill(grpc::ServerContext* ctx, const v1::PrefillRequest* req,
                                        v1::PrefillResponse* resp) {
  return Run(ctx, "Prefill", [&](Tenant& caller) { return DoPrefill(caller, *req, resp); });
}

absl::Status StateCacheService::DoExport(Tenant& caller, const v1::ExportRequest& req,
                                         v1::ExportResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  return ops::Export(ops_, *m, req, resp);
}

grpc::Status StateCacheService::Export(grpc::ServerContext* ctx, const v1::ExportRequest* req,
                                       v1::ExportResponse* resp) {
  return Run(ctx, "Export", [&](Tenant& caller) { return DoExport(caller, *req, resp); });
}

absl::Status StateCacheService::DoUnpack(Tenant& caller, const v1::UnpackRequest& req,
                                         v1::UnpackResponse* resp) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  return ops::Unpack(ops_, *m, req, resp);
}

grpc::Status StateCacheService::Unpack(grpc::ServerContext* ctx, const v1::UnpackRequest* req,
                                       v1::UnpackResponse* resp) {
  return Run(ctx, "Unpack", [&](Tenant& caller) { return DoUnpack(caller, *req, resp); });
}

absl::Status StateCacheService::DoImport(Tenant& caller, const v1::ImportRequest& req) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(caller.name(), req.model_id()));
  return ops::Import(ops_, *m, req);
}

grpc::Status StateCacheService::Import(grpc::ServerContext* ctx, const v1::ImportRequest* req,
                                       v1::ImportResponse*) {
  return Run(ctx, "Import", [&](Tenant& caller) { return DoImport(caller, *req); });
}

}  // namespace statecache
