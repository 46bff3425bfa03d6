// Fuzz target: request validation of every StateCacheService RPC.
//
// Input: byte 0 picks the RPC, byte 1 holds fix-ups that steer the fuzzer
// past the first checks (bit 0: use a registered model id, bit 1: model
// "kda" instead of "gdn", bit 2: replace the slot handles with live ones),
// the rest is the serialized request. Properties (ServiceFixture::Check):
// pool invariants hold, a failed request leaves all slot bytes identical,
// every slot decodes to finite states.
#include <cstdint>
#include <string>

#include "server/core/proto_convert.h"
#include "tests/fuzz/service_fixture.h"

namespace statecache {
namespace {

template <typename Req>
bool Parse(const uint8_t* data, size_t size, Req* req) {
  return req->ParseFromArray(data, static_cast<int>(size));
}

template <typename Req>
void FixModel(uint8_t flags, Req* req) {
  if (flags & 1) req->set_model_id((flags & 2) ? "kda" : "gdn");
}

template <typename Field>
void FixSlots(ServiceFixture& f, uint8_t flags, Field* slots) {
  if (!(flags & 4)) return;
  const auto& live = f.slots((flags & 2) ? 1 : 0);
  for (int i = 0; i < slots->size(); ++i) {
    HandleToProto(live[i % live.size()], slots->Mutable(i));
  }
}

void FixSlot(ServiceFixture& f, uint8_t flags, v1::SlotHandle* slot) {
  if (flags & 4) HandleToProto(f.slots((flags & 2) ? 1 : 0)[flags >> 7], slot);
}

}  // namespace
}  // namespace statecache

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace statecache;  // NOLINT
  if (size < 2) return 0;
  ServiceFixture& f = ServiceFixture::Get();
  StateCacheService& s = f.service();
  Tenant& caller = f.caller();
  const uint8_t op = data[0] % 11, flags = data[1];
  data += 2;
  size -= 2;
  const std::string before = f.ArenaBytes();
  absl::Status status;
  switch (op) {
    case 0: {
      v1::UpdateRequest req;
      if (!Parse(data, size, &req)) return 0;
      FixModel(flags, &req);
      FixSlots(f, flags, req.mutable_slots());
      v1::UpdateResponse resp;
      status = s.DoUpdate(caller, req, &resp);
      break;
    }
    case 1: {
      v1::PrefillRequest req;
      if (!Parse(data, size, &req)) return 0;
      FixModel(flags, &req);
      FixSlots(f, flags, req.mutable_slots());
      v1::PrefillResponse resp;
      status = s.DoPrefill(caller, req, &resp);
      break;
    }
    case 2: {
      v1::SnapshotRequest req;
      if (!Parse(data, size, &req)) return 0;
      FixModel(flags, &req);
      FixSlot(f, flags, req.mutable_slot());
      v1::SnapshotResponse resp;
      status = s.DoSnapshot(caller, req, &resp);
      break;
    }
    case 3: {
      v1::RestoreRequest req;
      if (!Parse(data, size, &req)) return 0;
      FixModel(flags, &req);
      FixSlot(f, flags, req.mutable_slot());
      v1::RestoreResponse resp;
      status = s.DoRestore(caller, req, &resp);
      break;
    }
    case 4: {
      v1::LookupPrefixRequest req;
      if (!Parse(data, size, &req)) return 0;
      FixModel(flags, &req);
      v1::LookupPrefixResponse resp;
      status = s.DoLookupPrefix(caller, req, &resp);
      break;
    }
    case 5: {
      v1::ExportRequest req;
      if (!Parse(data, size, &req)) return 0;
      FixModel(flags, &req);
      FixSlot(f, flags, req.mutable_slot());
      v1::ExportResponse resp;
      status = s.DoExport(caller, req, &resp);
      break;
    }
    case 6: {
      v1::ImportRequest req;
      if (!Parse(data, size, &req)) return 0;
      FixModel(flags, &req);
      FixSlot(f, flags, req.mutable_slot());
      status = s.DoImport(caller, req);
      break;
    }
    case 7: {
      v1::AllocateSlotsRequest req;
      if (!Parse(data, size, &req)) return 0;
      FixModel(flags, &req);
      v1::AllocateSlotsResponse resp;
      status = s.DoAllocateSlots(caller, req, &resp);
      if (status.ok()) {  // give them back; the fixture's slots stay live
        v1::ReleaseSlotsRequest rel;
        rel.set_model_id(req.model_id());
        *rel.mutable_slots() = resp.slots();
        if (!s.DoReleaseSlots(caller, rel).ok()) std::abort();
      }
      break;
    }
    case 8: {
      v1::ReleaseSlotsRequest req;
      if (!Parse(data, size, &req)) return 0;
      if (flags & 4) return 0;  // never release the fixture's slots
      FixModel(flags, &req);
      status = s.DoReleaseSlots(caller, req);
      if (status.ok()) std::abort();  // only fixture slots are live
      break;
    }
    case 9: {
      v1::RegisterModelRequest req;
      if (!Parse(data, size, &req)) return 0;
      if (req.model_id() == "gdn" || req.model_id() == "kda") return 0;
      v1::RegisterModelResponse resp;
      status = s.DoRegisterModel(caller, req, &resp);
      if (status.ok()) {
        v1::DropModelRequest drop;
        drop.set_model_id(req.model_id());
        drop.set_force(true);
        if (!s.DoDropModel(caller, drop).ok()) std::abort();
      }
      break;
    }
    default: {
      v1::GetStatsRequest req;
      if (!Parse(data, size, &req)) return 0;
      FixModel(flags, &req);
      v1::GetStatsResponse resp;
      status = s.DoGetStats(caller, req, &resp);
      break;
    }
  }
  // Snapshot / Restore / Import legitimately change slot bytes only when OK.
  f.Check(status, before);
  return 0;
}
