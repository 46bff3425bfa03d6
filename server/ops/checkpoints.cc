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
#include "server/pool/prefix_key.h"
#include "server/core/proto_convert.h"

namespace statecache {
namespace ops {
namespace {

absl::StatusOr<PrefixKey> KeyFromTokensOrKey(bool has_tokens, const v1::TokenIds& tokens,
                                             bool has_key, const v1::PrefixKey& key,
                                             absl::string_view tokens_field,
                                             absl::string_view key_field) {
  if (has_tokens) {
    if (tokens.ids().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(tokens_field, ": empty token list"));
    }
    return KeyOfTokens(tokens.ids());
  }
  if (has_key) {
    if (key.num_tokens() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(key_field, ".num_tokens: ", key.num_tokens(), " must be >= 1"));
    }
    return KeyFromProto(key);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("prefix: set ", tokens_field, " or ", key_field));
}

}  // namespace

absl::Status Snapshot(const Context& ctx, Model& m, const v1::SnapshotRequest& req,
                      v1::SnapshotResponse* resp) {
  ASSIGN_OR_RETURN(PrefixKey key,
                   KeyFromTokensOrKey(req.prefix_case() == v1::SnapshotRequest::kTokens,
                                      req.tokens(), req.prefix_case() == v1::SnapshotRequest::kKey,
                                      req.key(), "tokens", "key"));
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
                   m.checkpoints->Put(key, m.slots->view(), access.indices()[0],
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
  if (!req.has_key() || req.key().num_tokens() < 1) {
    return absl::InvalidArgumentError("key: missing or num_tokens < 1");
  }
  const PrefixKey key = KeyFromProto(req.key());
  if (m.checkpoints == nullptr) {
    return absl::NotFoundError(absl::StrCat("key: no checkpoint for prefix ", key.DebugString(),
                                            " (model has no checkpoint memory)"));
  }
  RETURN_IF_ERROR(CheckNotAttached(ctx, m, req.slot(), "slot"));
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access,
                   m.slots->Acquire({HandleFromProto(req.slot())}, "slot"));
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(CheckpointStore::RestoreResult restored,
                   m.checkpoints->Restore(key, req.lease_id(), m.slots->view(),
                                          access.indices()[0]));
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
  std::vector<PrefixKey> candidates;
  if (req.candidates_case() == v1::LookupPrefixRequest::kTokens) {
    if (req.tokens().ids_size() > max_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens: ", req.tokens().ids_size(), " tokens exceed the limit of ", max_tokens));
    }
    candidates = ChainPrefixKeys(req.tokens().ids());
  } else if (req.candidates_case() == v1::LookupPrefixRequest::kKeys) {
    if (req.keys().keys_size() > max_tokens) {
      return absl::InvalidArgumentError("keys: too many candidate keys");
    }
    for (int i = 0; i < req.keys().keys_size(); ++i) {
      if (req.keys().keys(i).num_tokens() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("keys.keys[", i, "].num_tokens: must be >= 1"));
      }
      candidates.push_back(KeyFromProto(req.keys().keys(i)));
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
  ASSIGN_OR_RETURN(CheckpointStore::LookupResult r,
                   m.checkpoints->Lookup(candidates, absl::Milliseconds(req.lease_ms())));
  resp->set_hit(r.hit);
  resp->set_candidate_tokens(r.candidate_tokens);
  if (r.hit) {
    KeyToProto(r.key, resp->mutable_key());
    resp->set_lease_id(r.lease_id);
    resp->set_lease_expiry_unix_ms(absl::ToUnixMillis(r.lease_expiry));
    resp->set_tier(static_cast<v1::CheckpointTier>(r.tier));
  }
  if (ctx.limits.log_cache_events) {
    LogEvent("lookup", absl::StrCat("model=", m.id, " hit=", r.hit ? "true" : "false",
                                    " tokens=", r.hit ? r.key.num_tokens : 0, "/",
                                    r.candidate_tokens));
  }
  return absl::OkStatus();
}

}  // namespace ops
}  // namespace statecache
