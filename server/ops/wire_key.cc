#include "server/ops/wire_key.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/core/proto_convert.h"

namespace statecache {
namespace ops {

absl::StatusOr<PrefixKey> WireKey(const v1::PrefixKey& key, absl::string_view field) {
  if (key.num_tokens() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".num_tokens: ", key.num_tokens(), " must be >= 1"));
  }
  switch (key.kind()) {
    case v1::PREFIX_KEY_KIND_FNV64:
      if (!key.digest().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".digest: must be empty for PREFIX_KEY_KIND_FNV64 (",
                         key.digest().size(), " bytes given)"));
      }
      break;
    case v1::PREFIX_KEY_KIND_SHA256:
      if (key.digest().size() != kSha256DigestBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".digest: ", key.digest().size(),
                         " bytes, PREFIX_KEY_KIND_SHA256 needs ", kSha256DigestBytes));
      }
      break;
    case v1::PREFIX_KEY_KIND_ENGINE:
      if (key.digest().empty() || key.digest().size() > kMaxEngineDigestBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".digest: ", key.digest().size(),
                         " bytes, PREFIX_KEY_KIND_ENGINE needs 1..", kMaxEngineDigestBytes));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".kind: unknown prefix key kind ", static_cast<int>(key.kind())));
  }
  if (key.kind() != v1::PREFIX_KEY_KIND_FNV64 && key.hash() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".hash: must be 0 for ", v1::PrefixKeyKind_Name(key.kind())));
  }
  return KeyFromProto(key);
}

absl::Status WireKeyStatus(const absl::Status& stored, const PrefixKey& wire_key,
                           uint64_t lease_id) {
  if (stored.code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat("key: no checkpoint for prefix ",
                                            wire_key.DebugString(),
                                            lease_id != 0 ? " (lease unknown or expired)" : ""));
  }
  if (stored.code() == absl::StatusCode::kInvalidArgument &&
      absl::StartsWith(stored.message(), "lease_id:")) {
    return absl::InvalidArgumentError(absl::StrCat("lease_id: the lease is for another key than ",
                                                   wire_key.DebugString()));
  }
  return stored;
}

}  // namespace ops
}  // namespace statecache
