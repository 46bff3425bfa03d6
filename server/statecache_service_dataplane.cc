// StateCacheService, data plane (issue 10; server/dataplane/data_plane.h):
// the SubmitUpdates stream and the session / buffer / attach RPCs, each
// FAILED_PRECONDITION without a data plane.
#include "absl/time/clock.h"
#include "server/ops/state_ops.h"
#include "server/statecache_service.h"
#include "server/statecache_service_internal.h"

namespace statecache {

using service_internal::ShuttingDown;
using service_internal::StreamShutDown;
using service_internal::NoDataPlane;

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
  absl::Status status =
      dataplane_->SubmitUpdates((*caller)->name(), io, limits_, ops_.observe);
  if (status.ok() && drained) status = StreamShutDown();
  return ToGrpcStatus(status);
}

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
