// Conversions between the C++ client's types and the v1 protos, shared by
// the files of StateCacheClient (statecache_client*.cc). Internal to
// //client/cpp:statecache_client.
#ifndef STATECACHE_CLIENT_CPP_STATECACHE_CLIENT_WIRE_H_
#define STATECACHE_CLIENT_CPP_STATECACHE_CLIENT_WIRE_H_

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/cpp/statecache_client.h"

namespace statecache {
namespace client_wire {

v1::DType ToProto(DType d);
// t <- dtype, shape and the bytes (copied).
void SetTensor(v1::Tensor* t, DType dtype, std::initializer_list<int64_t> shape,
               absl::string_view bytes);
// The bytes of `v` (a view; no copy).
absl::string_view FloatBytes(absl::Span<const float> v);
void AddHandles(absl::Span<const SlotHandle> slots,
                google::protobuf::RepeatedPtrField<v1::SlotHandle>* out);
void SetHandle(SlotHandle h, v1::SlotHandle* out);
// A snapshot request of `slot` with its aux blobs (the caller names the
// prefix: by tokens or by key).
v1::SnapshotRequest SnapshotRequestFor(absl::string_view model_id, SlotHandle slot,
                                       const std::vector<std::string>& aux);
// The floats of an FP32 tensor; kInternal naming `what` for another dtype.
absl::StatusOr<std::vector<float>> FloatsOf(const v1::Tensor& t, absl::string_view what);
void KeyToWire(const PrefixKey& k, v1::PrefixKey* out);
PrefixKey KeyFromWire(const v1::PrefixKey& k);
// A batch item's error as a status.
absl::Status ItemError(const v1::Error& e);
void LookupItemToProto(absl::string_view model_id, const LookupItem& in,
                       v1::LookupPrefixRequest* req);
PrefixLookup LookupFromProto(const v1::LookupPrefixResponse& r);

}  // namespace client_wire
}  // namespace statecache

#endif  // STATECACHE_CLIENT_CPP_STATECACHE_CLIENT_WIRE_H_
