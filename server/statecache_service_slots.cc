// StateCacheService, slots: AllocateSlots (with the tenant's max_slots
// quota) and ReleaseSlots.
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "server/core/log.h"
#include "server/core/proto_convert.h"
#include "server/statecache_service.h"
#include "server/statecache_service_internal.h"

namespace statecache {

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
  RETURN_IF_ERROR(ops::CheckNotAttached(ops_, *m, req.slots(), "slots"));
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

}  // namespace statecache
