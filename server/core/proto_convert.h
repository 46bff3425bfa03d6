// Conversions between statecache.v1 messages and the C++ types of kernels/
// and server/pool/, plus checks of incoming Tensors.
//
// No gRPC here: everything returns absl::Status (kInvalidArgument naming the
// field for bad input). The service (statecache_service.cc) is the only place
// that turns these into grpc::Status.
//
//   ASSIGN_OR_RETURN(ModelGeometry g, GeometryFromProto(request.geometry()));
//   ASSIGN_OR_RETURN(TensorBytes q, CheckTensor(request.q(), "q", kInputDTypes, {b, h, d}));
#ifndef STATECACHE_SERVER_CORE_PROTO_CONVERT_H_
#define STATECACHE_SERVER_CORE_PROTO_CONVERT_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/backend/backend.h"
#include "kernels/layout/geometry.h"
#include "kernels/layout/state_layout.h"
#include "proto/statecache/v1/statecache.pb.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/prefix_key.h"
#include "server/pool/slot_handle.h"
#include "server/pool/slot_pool.h"
#include "server/pool/tier_bytes.h"

namespace statecache {

// Packed-format revision carried in CompatibilityTags.format_version.
// 2: quantized lo rows' codes and metadata in row blocks of 8, unit-major
// (head_layout.h); 1 stored them row-major. Exported states of another
// revision are refused on import.
inline constexpr uint32_t kPackedFormatVersion = 2;

// Geometry. kInvalidArgument naming "geometry.<field>" when invalid
// (ModelGeometry::Validate) or the arch is unspecified.
absl::StatusOr<ModelGeometry> GeometryFromProto(const v1::Geometry& g);
v1::Geometry GeometryToProto(const ModelGeometry& g);

// DType of a Tensor; kInvalidArgument naming `field` for unspecified/unknown.
absl::StatusOr<DType> DTypeFromProto(v1::DType d, absl::string_view field);
v1::DType DTypeToProto(DType d);

inline SlotHandle HandleFromProto(const v1::SlotHandle& h) {
  return SlotHandle{h.id(), h.generation()};
}
inline void HandleToProto(const SlotHandle& h, v1::SlotHandle* out) {
  out->set_id(h.id);
  out->set_generation(h.generation);
}
std::vector<SlotHandle> HandlesFromProto(
    const google::protobuf::RepeatedPtrField<v1::SlotHandle>& handles);

// Field for field, unvalidated (server/ops checks kind and digest first).
inline PrefixKey KeyFromProto(const v1::PrefixKey& k) {
  PrefixKey key{k.hash(), k.num_tokens()};
  key.kind = static_cast<PrefixKeyKind>(k.kind());
  key.digest = k.digest();
  return key;
}
inline void KeyToProto(const PrefixKey& k, v1::PrefixKey* out) {
  out->set_hash(k.hash);
  out->set_num_tokens(k.num_tokens);
  out->set_kind(static_cast<v1::PrefixKeyKind>(k.kind));
  out->set_digest(k.digest);
}

void TierBytesToProto(const TierBytes& t, v1::HeadBytes* out);
void StatsToProto(const SlotPoolStats& slots, const CheckpointStats& checkpoints,
                  v1::ModelStats* out);

// Tags of a layout registered as `model_id`.
void TagsToProto(absl::string_view model_id, const StateLayout& layout, v1::CompatibilityTags* out);
// OK when `got` equals the tags of (`model_id`, `layout`) in every field;
// kFailedPrecondition naming the first differing tag otherwise.
absl::Status CheckTagsMatch(const v1::CompatibilityTags& got, absl::string_view model_id,
                            const StateLayout& layout);

// A checked view of a Tensor's bytes (pointing into the message).
struct TensorBytes {
  DType dtype = DType::kFp32;
  const void* data = nullptr;
  int64_t count = 0;  // elements
  int64_t bytes = 0;
};

inline constexpr DType kInputDTypes[] = {DType::kFp32, DType::kBf16, DType::kFp16};
inline constexpr DType kFp32Only[] = {DType::kFp32};

// Checks that `t` has inline data, a dtype in `allowed`, exactly the shape
// `want` and prod(want) * sizeof(dtype) bytes. kInvalidArgument naming
// `field` (e.g. "q.shape", "g.dtype", "v.data") otherwise. Does not check
// values.
absl::StatusOr<TensorBytes> CheckTensor(const v1::Tensor& t, absl::string_view field,
                                        absl::Span<const DType> allowed,
                                        absl::Span<const int64_t> want);

// "[2, 4, 128]".
std::string ShapeString(absl::Span<const int64_t> shape);

}  // namespace statecache

#endif  // STATECACHE_SERVER_CORE_PROTO_CONVERT_H_
