// Private to the files of StateCacheService (statecache_service*.cc): the
// admission wrapper every unary RPC runs through, and the statuses of the
// edge.
#ifndef STATECACHE_SERVER_STATECACHE_SERVICE_INTERNAL_H_
#define STATECACHE_SERVER_STATECACHE_SERVICE_INTERNAL_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"
#include "server/ops/checks.h"
#include "server/ops/state_ops.h"
#include "server/statecache_service.h"

namespace statecache {
namespace service_internal {

// What a call that arrives during the drain before a shutdown gets: it did
// not run, so retrying it elsewhere is safe.
absl::Status ShuttingDown(absl::string_view method);
// How a stream ends when the drain stops it between messages.
absl::Status StreamShutDown();
// Data-plane RPCs on a server started without one.
absl::Status NoDataPlane();
// Kernel timings into `metrics` (decode_update also feeds the batch
// histogram); empty when metrics is null.
ops::KernelObserver KernelObserverOf(Metrics* metrics);

}  // namespace service_internal

// Admission, authentication and rate quota, then handler(Tenant&); records
// the RPC metric under `method` and converts the status at the edge.
template <typename F>
grpc::Status StateCacheService::Run(const grpc::ServerContext* ctx, const char* method,
                                    F&& handler) {
  const absl::Time start = absl::Now();
  CallGate::Ticket ticket(&gate_);
  const absl::Status status = [&]() -> absl::Status {
    if (!ticket.admitted()) return service_internal::ShuttingDown(method);
    ASSIGN_OR_RETURN(Tenant * caller, Authenticate(ctx));
    RETURN_IF_ERROR(caller->Admit(start));
    return handler(*caller);
  }();
  if (metrics_) metrics_->ObserveRpc(method, static_cast<int>(status.code()), SecondsSince(start));
  return ToGrpcStatus(status);
}

}  // namespace statecache

#endif  // STATECACHE_SERVER_STATECACHE_SERVICE_INTERNAL_H_
