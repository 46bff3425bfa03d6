// A prefix key from the wire, checked (the operations of server/ops that
// take keys: Snapshot, Restore, LookupPrefix, Unpack of a checkpoint).
#ifndef STATECACHE_SERVER_OPS_WIRE_KEY_H_
#define STATECACHE_SERVER_OPS_WIRE_KEY_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/statecache/v1/statecache.pb.h"
#include "server/pool/prefix_key.h"

namespace statecache {
namespace ops {

// `key` as a PrefixKey: num_tokens >= 1, a known kind, the digest and hash
// its kind allows; kInvalidArgument naming "<field>.num_tokens",
// "<field>.digest", "<field>.hash" or "<field>.kind" otherwise.
absl::StatusOr<PrefixKey> WireKey(const v1::PrefixKey& key, absl::string_view field);

// A CheckpointStore status about the salted form of `wire_key` (Restore,
// Read), reworded to name the caller's wire key: kNotFound "key: no
// checkpoint for prefix <wire key>[ (lease unknown or expired)]", a lease
// mismatch "lease_id: the lease is for another key than <wire key>"; other
// statuses unchanged.
absl::Status WireKeyStatus(const absl::Status& stored, const PrefixKey& wire_key,
                           uint64_t lease_id);

}  // namespace ops
}  // namespace statecache

#endif  // STATECACHE_SERVER_OPS_WIRE_KEY_H_
