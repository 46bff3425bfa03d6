// Snapshot, Restore, LookupPrefix: the prefix-cache operations
// (server/ops/state_ops.h).

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"
#include "server/core/log.h"
#include "server/ops/checks.h"
#include "server/ops/state_ops.h"
#include "server/ops/wire_key.h"
#include "server/pool/prefix_key.h"
#include "server/core/proto_convert.h"

namespace statecache {
namespace ops {
namespace {

// The kind of chain the server computes from tokens: FNV64 or SHA256.
absl::Status CheckTokensKind(v1::PrefixKeyKind kind, absl::string_view field) {
  if (kind == v1::PREFIX_KEY_KIND_FNV64 || kind == v1::PREFIX_KEY_KIND_SHA256) {
    return absl::OkStatus();
  }
  if (kind == v1::PREFIX_KEY_KIND_ENGINE) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": PREFIX_KEY_KIND_ENGINE keys cannot be computed from tokens; send the "
               "engine's block hash as a key"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown prefix key kind ", static_cast<int>(kind)));
}

std::vector<PrefixKey> ChainKeys(v1::PrefixKeyKind kind, absl::Span<const int32_t> tokens) {
  return kind == v1::PREFIX_KEY_KIND_SHA256 ? ChainSha256PrefixKeys(tokens)
                                            : ChainPrefixKeys(tokens);
}

absl::StatusOr<PrefixKey> KeyFromTokensOrKey(bool has_tokens, const v1::TokenIds& tokens,
                                             v1::PrefixKeyKind tokens_kind, bool has_key,
                                             const v1::PrefixKey& key) {
  if (has_tokens) {
    if (tokens.ids().empty()) return absl::InvalidArgumentError("tokens: empty token list");
    RETURN_IF_ERROR(CheckTokensKind(tokens_kind, "key_kind"));
    return tokens_kind == v1::PREFIX_KEY_KIND_SHA256 ? Sha256KeyOfTokens(tokens.ids())
                                                     : KeyOfTokens(tokens.ids());
  }
  if (has_key) return WireKey(key, "key");
  return absl::InvalidArgumentError("prefix: set tokens or key");
}

// "items[i]." in front of an item's message (which starts with its field).
absl::Status ItemStatus(int i, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("items[", i, "].", s.message()));
}

void SetError(const absl::Status& s, v1::Error* e) {
  e->set_code(static_cast<int>(s.code()));
  e->set_message(std::string(s.message()));
}

// Whole-batch checks: 1..limits.max_batch items.
absl::Status CheckBatchSize(const Context& ctx, int items) {
  if (items < 1) return absl::InvalidArgumentError("items: empty batch");
  if (items > ctx.limits.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("items: ", items, " items exceed the limit of ", ctx.limits.max_batch));
  }
  return absl::OkStatus();
}

// An item's model_id must be empty or the batch's.
absl::Status CheckItemModel(const Model& m, const std::string& item_model_id) {
  if (item_model_id.empty() || item_model_id == m.id) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("model_id: '", item_model_id,
                                                 "' differs from the batch's model_id"));
}

}  // namespace

absl::Status Snapshot(const Context& ctx, Model& m, const v1::SnapshotRequest& req,
                      v1::SnapshotResponse* resp) {
  ASSIGN_OR_RETURN(const PrefixKey key,
                   KeyFromTokensOrKey(req.prefix_case() == v1::SnapshotRequest::kTokens,
                                      req.tokens(), req.key_kind(),
                                      req.prefix_case() == v1::SnapshotRequest::kKey, req.key()));
  const int layers = m.layout.geometry().layers;
  if (req.aux_size() != 0 && req.aux_size() != layers) {
    return absl::InvalidArgumentError(absl::StrCat("aux: ", req.aux_size(),
                                                   " entries, want 0 or one per layer (", layers,
                                                   ")"));
  }
  int64_t aux_bytes = 0;
  for (const std::string& a : req.aux()) aux_bytes += static_cast<int64_t>(a.size());
  if (aux_bytes > ctx.limits.max_aux_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("aux: ", aux_bytes, " bytes exceed the limit of ",
                                                   ctx.limits.max_aux_bytes));
  }
  if (m.checkpoints == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("model_id: '", m.id, "' has no checkpoint memory"));
  }
  const SlotHandle handle = HandleFromProto(req.slot());
  RETURN_IF_ERROR(CheckNotAttached(ctx, m, req.slot(), "slot"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access, m.slots->Acquire({handle}, "slot"));
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(CheckpointStore::PutResult put,
                   m.checkpoints->Put(SaltKey(m.tenant, key), m.slots->view(), access.indices()[0],
                                      std::vector<std::string>(req.aux().begin(), req.aux().end())));
  if (ctx.observe) ctx.observe("copy_slots", SecondsSince(start), 1);
  KeyToProto(key, resp->mutable_key());
  resp->set_evicted(put.evicted);
  if (ctx.limits.log_cache_events) {
    LogEvent("snapshot", absl::StrCat("model=", m.id, " key=", key.DebugString(),
                                      " evicted=", put.evicted));
  }
  return absl::OkStatus();
}

absl::Status Restore(const Context& ctx, Model& m, const v1::RestoreRequest& req,
                     v1::RestoreResponse* resp) {
  if (!req.has_key()) return absl::InvalidArgumentError("key: missing");
  ASSIGN_OR_RETURN(const PrefixKey key, WireKey(req.key(), "key"));
  if (m.checkpoints == nullptr) {
    return absl::NotFoundError(absl::StrCat("key: no checkpoint for prefix ", key.DebugString(),
                                            " (model has no checkpoint memory)"));
  }
  RETURN_IF_ERROR(CheckNotAttached(ctx, m, req.slot(), "slot"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m.slots->Acquire({HandleFromProto(req.slot())}, "slot"));
  const absl::Time start = absl::Now();
  absl::StatusOr<CheckpointStore::RestoreResult> stored =
      m.checkpoints->Restore(SaltKey(m.tenant, key), req.lease_id(), m.slots->view(),
                             access.indices()[0]);
  RETURN_IF_ERROR(WireKeyStatus(stored.status(), key, req.lease_id()));
  CheckpointStore::RestoreResult& restored = *stored;
  if (ctx.observe) ctx.observe("copy_slots", SecondsSince(start), 1);
  for (std::string& a : restored.aux) resp->add_aux(std::move(a));
  resp->set_num_tokens(restored.num_tokens);
  if (ctx.limits.log_cache_events) {
    LogEvent("restore", absl::StrCat("model=", m.id, " key=", key.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status LookupPrefix(const Context& ctx, Model& m, const v1::LookupPrefixRequest& req,
                          v1::LookupPrefixResponse* resp) {
  const int64_t max_tokens = ctx.limits.max_lookup_tokens;
  std::vector<PrefixKey> candidates;  // wire keys
  if (req.candidates_case() == v1::LookupPrefixRequest::kTokens) {
    if (req.tokens().ids_size() > max_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens: ", req.tokens().ids_size(), " tokens exceed the limit of ", max_tokens));
    }
    RETURN_IF_ERROR(CheckTokensKind(req.key_kind(), "key_kind"));
    candidates = ChainKeys(req.key_kind(), req.tokens().ids());
  } else if (req.candidates_case() == v1::LookupPrefixRequest::kKeys) {
    if (req.keys().keys_size() > max_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "keys: ", req.keys().keys_size(), " candidate keys exceed the limit of ", max_tokens));
    }
    for (int i = 0; i < req.keys().keys_size(); ++i) {
      ASSIGN_OR_RETURN(PrefixKey k, WireKey(req.keys().keys(i), absl::StrCat("keys.keys[", i, "]")));
      candidates.push_back(std::move(k));
    }
  } else {
    return absl::InvalidArgumentError("candidates: set tokens or keys");
  }
  if (req.lease_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("lease_ms: ", req.lease_ms(), " is negative"));
  }
  if (m.checkpoints == nullptr) {
    int64_t longest = 0;
    for (const PrefixKey& k : candidates) longest = std::max(longest, k.num_tokens);
    resp->set_hit(false);
    resp->set_candidate_tokens(longest);
    return absl::OkStatus();
  }
  const std::vector<PrefixKey> salted = SaltKeys(m.tenant, candidates);
  CheckpointStore::LookupResult r;
  if (req.peek()) {
    r = m.checkpoints->Peek(salted);
  } else {
    ASSIGN_OR_RETURN(r, m.checkpoints->Lookup(salted, absl::Milliseconds(req.lease_ms())));
  }
  resp->set_hit(r.hit);
  resp->set_candidate_tokens(r.candidate_tokens);
  if (r.hit) {
    // The response names the wire key the caller sent, not its salted form.
    for (size_t i = 0; i < salted.size(); ++i) {
      if (salted[i] == r.key) {
        KeyToProto(candidates[i], resp->mutable_key());
        break;
      }
    }
    resp->set_tier(static_cast<v1::CheckpointTier>(r.tier));
    if (r.tier != StoreTier::kDevice && !(m.checkpoint_format == m.layout.format())) {
      resp->set_checkpoint_format(FormatSpecName(m.checkpoint_format));
    }
    if (r.lease_id != 0) {
      resp->set_lease_id(r.lease_id);
      resp->set_lease_expiry_unix_ms(absl::ToUnixMillis(r.lease_expiry));
    }
  }
  if (ctx.limits.log_cache_events) {
    LogEvent("lookup", absl::StrCat("model=", m.id, req.peek() ? " peek=true" : "",
                                    " hit=", r.hit ? "true" : "false",
                                    " tokens=", r.hit ? r.key.num_tokens : 0, "/",
                                    r.candidate_tokens));
  }
  return absl::OkStatus();
}

absl::Status ReleaseLease(const Context& ctx, Model& m, const v1::ReleaseLeaseRequest& req) {
  if (req.lease_id() == 0) return absl::InvalidArgumentError("lease_id: must be non-zero");
  if (m.checkpoints == nullptr) {
    return absl::NotFoundError(absl::StrCat("lease_id: unknown or expired lease ", req.lease_id()));
  }
  RETURN_IF_ERROR(m.checkpoints->ReleaseLease(req.lease_id()));
  if (ctx.limits.log_cache_events) {
    LogEvent("release_lease", absl::StrCat("model=", m.id, " lease=", req.lease_id()));
  }
  return absl::OkStatus();
}

absl::Status BatchSnapshot(const Context& ctx, Model& m, const v1::BatchSnapshotRequest& req,
                           v1::BatchSnapshotResponse* resp) {
  RETURN_IF_ERROR(CheckBatchSize(ctx, req.items_size()));
  for (int i = 0; i < req.items_size(); ++i) {
    v1::BatchSnapshotResult* out = resp->add_results();
    absl::Status s = CheckItemModel(m, req.items(i).model_id());
    if (s.ok()) s = Snapshot(ctx, m, req.items(i), out->mutable_response());
    if (!s.ok()) {
      out->clear_response();
      SetError(ItemStatus(i, s), out->mutable_error());
    }
  }
  return absl::OkStatus();
}

absl::Status BatchRestore(const Context& ctx, Model& m, const v1::BatchRestoreRequest& req,
                          v1::BatchRestoreResponse* resp) {
  RETURN_IF_ERROR(CheckBatchSize(ctx, req.items_size()));
  for (int i = 0; i < req.items_size(); ++i) {
    v1::BatchRestoreResult* out = resp->add_results();
    absl::Status s = CheckItemModel(m, req.items(i).model_id());
    if (s.ok()) s = Restore(ctx, m, req.items(i), out->mutable_response());
    if (!s.ok()) {
      out->clear_response();
      SetError(ItemStatus(i, s), out->mutable_error());
    }
  }
  return absl::OkStatus();
}

absl::Status BatchLookupPrefix(const Context& ctx, Model& m,
                               const v1::BatchLookupPrefixRequest& req,
                               v1::BatchLookupPrefixResponse* resp) {
  RETURN_IF_ERROR(CheckBatchSize(ctx, req.items_size()));
  int64_t total = 0;
  for (const v1::LookupPrefixRequest& item : req.items()) {
    total += item.candidates_case() == v1::LookupPrefixRequest::kTokens ? item.tokens().ids_size()
                                                                        : item.keys().keys_size();
  }
  if (total > ctx.limits.max_lookup_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("items: ", total,
                                                   " candidates in all exceed the limit of ",
                                                   ctx.limits.max_lookup_tokens));
  }
  for (int i = 0; i < req.items_size(); ++i) {
    v1::BatchLookupPrefixResult* out = resp->add_results();
    absl::Status s = CheckItemModel(m, req.items(i).model_id());
    if (s.ok()) s = LookupPrefix(ctx, m, req.items(i), out->mutable_response());
    if (!s.ok()) {
      out->clear_response();
      SetError(ItemStatus(i, s), out->mutable_error());
    }
  }
  return absl::OkStatus();
}

}  // namespace ops
}  // namespace statecache
