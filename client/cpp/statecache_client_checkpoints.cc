// StateCacheClient: prefix checkpoints (snapshot, lookup, restore, leases,
// batches). The rest of the class is in statecache_client.cc.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/statecache_client.h"
#include "client/cpp/statecache_client_wire.h"
#include "kernels/common/status_macros.h"

namespace statecache {

using client_wire::ItemError;
using client_wire::KeyFromWire;
using client_wire::KeyToWire;
using client_wire::LookupFromProto;
using client_wire::LookupItemToProto;
using client_wire::SetHandle;
using client_wire::SnapshotRequestFor;

absl::StatusOr<PrefixKey> StateCacheClient::Snapshot(absl::string_view model_id, SlotHandle slot,
                                                     absl::Span<const int32_t> tokens,
                                                     const std::vector<std::string>& aux,
                                                     PrefixKeyKind key_kind) {
  v1::SnapshotRequest req = SnapshotRequestFor(model_id, slot, aux);
  req.mutable_tokens()->mutable_ids()->Add(tokens.begin(), tokens.end());
  req.set_key_kind(static_cast<v1::PrefixKeyKind>(key_kind));
  v1::SnapshotResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->Snapshot(&ctx, req, &resp)));
  return KeyFromWire(resp.key());
}

absl::StatusOr<PrefixKey> StateCacheClient::SnapshotKey(absl::string_view model_id,
                                                        SlotHandle slot, PrefixKey key,
                                                        const std::vector<std::string>& aux) {
  v1::SnapshotRequest req = SnapshotRequestFor(model_id, slot, aux);
  KeyToWire(key, req.mutable_key());
  v1::SnapshotResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->Snapshot(&ctx, req, &resp)));
  return KeyFromWire(resp.key());
}

absl::StatusOr<PrefixLookup> StateCacheClient::LookupPrefix(absl::string_view model_id,
                                                            absl::Span<const int32_t> tokens,
                                                            absl::Duration lease,
                                                            PrefixKeyKind key_kind) {
  v1::LookupPrefixRequest req;
  req.set_model_id(std::string(model_id));
  req.mutable_tokens()->mutable_ids()->Add(tokens.begin(), tokens.end());
  req.set_key_kind(static_cast<v1::PrefixKeyKind>(key_kind));
  req.set_lease_ms(absl::ToInt64Milliseconds(lease));
  return CallLookup(req);
}

absl::StatusOr<PrefixLookup> StateCacheClient::LookupPrefixKeys(absl::string_view model_id,
                                                                absl::Span<const PrefixKey> keys,
                                                                absl::Duration lease) {
  v1::LookupPrefixRequest req;
  req.set_model_id(std::string(model_id));
  for (const PrefixKey& k : keys) KeyToWire(k, req.mutable_keys()->add_keys());
  req.set_lease_ms(absl::ToInt64Milliseconds(lease));
  return CallLookup(req);
}

absl::StatusOr<RestoredCheckpoint> StateCacheClient::Restore(absl::string_view model_id,
                                                        SlotHandle slot, PrefixKey key,
                                                        uint64_t lease_id) {
  v1::RestoreRequest req;
  req.set_model_id(std::string(model_id));
  SetHandle(slot, req.mutable_slot());
  KeyToWire(key, req.mutable_key());
  req.set_lease_id(lease_id);
  v1::RestoreResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->Restore(&ctx, req, &resp)));
  RestoredCheckpoint out;
  out.aux.assign(resp.aux().begin(), resp.aux().end());
  out.num_tokens = resp.num_tokens();
  return out;
}

absl::StatusOr<PrefixLookup> StateCacheClient::PeekPrefix(absl::string_view model_id,
                                                          const LookupItem& item) {
  v1::LookupPrefixRequest req;
  LookupItemToProto(model_id, item, &req);
  req.set_peek(true);
  return CallLookup(req);
}

absl::StatusOr<PrefixLookup> StateCacheClient::CallLookup(const v1::LookupPrefixRequest& req) {
  v1::LookupPrefixResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->LookupPrefix(&ctx, req, &resp)));
  return LookupFromProto(resp);
}

absl::Status StateCacheClient::ReleaseLease(absl::string_view model_id, uint64_t lease_id) {
  v1::ReleaseLeaseRequest req;
  req.set_model_id(std::string(model_id));
  req.set_lease_id(lease_id);
  v1::ReleaseLeaseResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return FromGrpcStatus(stub_->ReleaseLease(&ctx, req, &resp));
}

absl::StatusOr<std::vector<absl::StatusOr<PrefixKey>>> StateCacheClient::BatchSnapshot(
    absl::string_view model_id, absl::Span<const SnapshotItem> items) {
  v1::BatchSnapshotRequest req;
  req.set_model_id(std::string(model_id));
  for (const SnapshotItem& in : items) {
    v1::SnapshotRequest* item = req.add_items();
    SetHandle(in.slot, item->mutable_slot());
    if (!in.tokens.empty()) {
      item->mutable_tokens()->mutable_ids()->Add(in.tokens.begin(), in.tokens.end());
      item->set_key_kind(static_cast<v1::PrefixKeyKind>(in.key_kind));
    } else {
      KeyToWire(in.key, item->mutable_key());
    }
    for (const std::string& a : in.aux) item->add_aux(a);
  }
  v1::BatchSnapshotResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->BatchSnapshot(&ctx, req, &resp)));
  std::vector<absl::StatusOr<PrefixKey>> out;
  for (const v1::BatchSnapshotResult& r : resp.results()) {
    if (r.error().code() != 0) {
      out.push_back(ItemError(r.error()));
    } else {
      out.push_back(KeyFromWire(r.response().key()));
    }
  }
  return out;
}

absl::StatusOr<std::vector<absl::StatusOr<RestoredCheckpoint>>> StateCacheClient::BatchRestore(
    absl::string_view model_id, absl::Span<const RestoreItem> items) {
  v1::BatchRestoreRequest req;
  req.set_model_id(std::string(model_id));
  for (const RestoreItem& in : items) {
    v1::RestoreRequest* item = req.add_items();
    SetHandle(in.slot, item->mutable_slot());
    KeyToWire(in.key, item->mutable_key());
    item->set_lease_id(in.lease_id);
  }
  v1::BatchRestoreResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->BatchRestore(&ctx, req, &resp)));
  std::vector<absl::StatusOr<RestoredCheckpoint>> out;
  for (const v1::BatchRestoreResult& r : resp.results()) {
    if (r.error().code() != 0) {
      out.push_back(ItemError(r.error()));
      continue;
    }
    RestoredCheckpoint c;
    c.aux.assign(r.response().aux().begin(), r.response().aux().end());
    c.num_tokens = r.response().num_tokens();
    out.push_back(std::move(c));
  }
  return out;
}

absl::StatusOr<std::vector<absl::StatusOr<PrefixLookup>>> StateCacheClient::BatchLookupPrefix(
    absl::string_view model_id, absl::Span<const LookupItem> items) {
  v1::BatchLookupPrefixRequest req;
  req.set_model_id(std::string(model_id));
  for (const LookupItem& in : items) LookupItemToProto("", in, req.add_items());
  v1::BatchLookupPrefixResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->BatchLookupPrefix(&ctx, req, &resp)));
  std::vector<absl::StatusOr<PrefixLookup>> out;
  for (const v1::BatchLookupPrefixResult& r : resp.results()) {
    if (r.error().code() != 0) {
      out.push_back(ItemError(r.error()));
    } else {
      out.push_back(LookupFromProto(r.response()));
    }
  }
  return out;
}

}  // namespace statecache
