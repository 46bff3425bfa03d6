#include "server/core/proto_convert.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/common/status_macros.h"

namespace statecache {

absl::StatusOr<ModelGeometry> GeometryFromProto(const v1::Geometry& g) {
  ModelGeometry out;
  switch (g.arch()) {
    case v1::ARCH_GDN: out.arch = Arch::kGdn; break;
    case v1::ARCH_KDA: out.arch = Arch::kKda; break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("geometry.arch: ", g.arch(), " is not ARCH_GDN or ARCH_KDA"));
  }
  out.layers = g.layers();
  out.h_qk = g.h_qk();
  out.h_v = g.h_v();
  out.d_k = g.d_k();
  out.d_v = g.d_v();
  out.scale = g.scale();
  absl::Status valid = out.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("geometry.", valid.message()));
  }
  return out;
}

v1::Geometry GeometryToProto(const ModelGeometry& g) {
  v1::Geometry out;
  out.set_arch(g.arch == Arch::kKda ? v1::ARCH_KDA : v1::ARCH_GDN);
  out.set_layers(g.layers);
  out.set_h_qk(g.h_qk);
  out.set_h_v(g.h_v);
  out.set_d_k(g.d_k);
  out.set_d_v(g.d_v);
  out.set_scale(g.scale);
  return out;
}

absl::StatusOr<DType> DTypeFromProto(v1::DType d, absl::string_view field) {
  switch (d) {
    case v1::DTYPE_FP32: return DType::kFp32;
    case v1::DTYPE_BF16: return DType::kBf16;
    case v1::DTYPE_FP16: return DType::kFp16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": dtype ", static_cast<int>(d), " is not FP32, BF16 or FP16"));
  }
}

v1::DType DTypeToProto(DType d) {
  switch (d) {
    case DType::kFp32: return v1::DTYPE_FP32;
    case DType::kBf16: return v1::DTYPE_BF16;
    case DType::kFp16: return v1::DTYPE_FP16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

std::vector<SlotHandle> HandlesFromProto(
    const google::protobuf::RepeatedPtrField<v1::SlotHandle>& handles) {
  std::vector<SlotHandle> out;
  out.reserve(handles.size());
  for (const v1::SlotHandle& h : handles) out.push_back(HandleFromProto(h));
  return out;
}

void TierBytesToProto(const TierBytes& t, v1::HeadBytes* out) {
  out->set_hi_rows(t.hi_rows);
  out->set_lo_codes(t.lo_codes);
  out->set_metadata(t.metadata);
  out->set_padding(t.padding);
  out->set_total(t.total());
}

void StatsToProto(const SlotPoolStats& s, const CheckpointStats& c, v1::ModelStats* out) {
  out->set_slot_capacity(s.capacity);
  out->set_slots_allocated(s.allocated);
  out->set_state_capacity_bytes(s.capacity_bytes);
  TierBytesToProto(s.used_bytes, out->mutable_state_used_bytes());
  out->set_fp32_equivalent_bytes(s.fp32_equivalent_bytes);
  out->set_checkpoint_capacity(c.capacity);
  out->set_checkpoints(c.checkpoints);
  out->set_checkpoint_capacity_bytes(c.capacity_bytes);
  TierBytesToProto(c.used_bytes, out->mutable_checkpoint_used_bytes());
  out->set_checkpoint_aux_bytes(c.aux_bytes);
  out->set_checkpoints_leased(c.leased);
  out->set_leases_active(c.leases_active);
  out->set_lookups_hit(c.lookups_hit);
  out->set_lookups_miss(c.lookups_miss);
  out->set_lookup_tokens_hit(c.lookup_tokens_hit);
  out->set_lookup_tokens_miss(c.lookup_tokens_miss);
  out->set_evictions(c.evictions);
  out->set_leases_expired(c.leases_expired);
  out->set_snapshots(c.snapshots);
  out->set_restores(c.restores);
  out->set_bytes_snapshotted(c.bytes_snapshotted);
  out->set_bytes_restored(c.bytes_restored);
  out->set_checkpoint_transcodes_to_cold(c.transcodes_to_cold);
  out->set_checkpoint_transcodes_from_cold(c.transcodes_from_cold);
  static_assert(v1::CHECKPOINT_TIER_DEVICE == static_cast<int>(StoreTier::kDevice) &&
                    v1::CHECKPOINT_TIER_HOST == static_cast<int>(StoreTier::kHost) &&
                    v1::CHECKPOINT_TIER_DISK == static_cast<int>(StoreTier::kDisk) &&
                    v1::CHECKPOINT_TIER_REMOTE == static_cast<int>(StoreTier::kRemote),
                "the wire enum and StoreTier share values");
  for (int i = 0; i < kNumStoreTiers; ++i) {
    const CheckpointTierStats& t = c.tiers[i];
    if (!t.enabled) continue;
    v1::CheckpointTierStats* p = out->add_checkpoint_tiers();
    p->set_tier(static_cast<v1::CheckpointTier>(i));
    p->set_checkpoints(t.entries);
    p->set_bytes(t.bytes);
    p->set_capacity_bytes(t.capacity_bytes);
    p->set_hits(t.hits);
    p->set_misses(t.misses);
    p->set_demotions(t.demotions);
    p->set_promotions(t.promotions);
    p->set_dropped_corrupt(t.dropped_corrupt);
    p->set_requests(t.requests);
    p->set_request_micros(t.request_micros);
    p->set_errors(t.errors);
    p->set_write_through_written(t.write_through_written);
    p->set_write_through_dropped(t.write_through_dropped);
    p->set_write_through_queued_bytes(t.write_through_queued_bytes);
  }
}

void TagsToProto(absl::string_view model_id, const StateLayout& layout,
                 v1::CompatibilityTags* out) {
  out->set_model_id(std::string(model_id));
  out->set_format(FormatSpecName(layout.format()));
  out->set_layout_fingerprint(layout.Fingerprint());
  *out->mutable_geometry() = GeometryToProto(layout.geometry());
  out->set_slot_bytes(layout.slot_bytes());
  out->set_format_version(kPackedFormatVersion);
}

absl::Status CheckTagsMatch(const v1::CompatibilityTags& got, absl::string_view model_id,
                            const StateLayout& layout) {
  v1::CompatibilityTags want;
  TagsToProto(model_id, layout, &want);
  auto mismatch = [](absl::string_view tag, const auto& g, const auto& w) {
    return absl::FailedPreconditionError(absl::StrCat("tags.", tag, ": state has ", g,
                                                      ", this model has ", w,
                                                      " (incompatible state)"));
  };
  if (got.model_id() != want.model_id()) {
    return mismatch("model_id", got.model_id(), want.model_id());
  }
  if (got.format() != want.format()) return mismatch("format", got.format(), want.format());
  if (got.layout_fingerprint() != want.layout_fingerprint()) {
    return mismatch("layout_fingerprint", got.layout_fingerprint(), want.layout_fingerprint());
  }
  if (got.geometry().SerializeAsString() != want.geometry().SerializeAsString()) {
    return mismatch("geometry", got.geometry().ShortDebugString(),
                    want.geometry().ShortDebugString());
  }
  if (got.slot_bytes() != want.slot_bytes()) {
    return mismatch("slot_bytes", got.slot_bytes(), want.slot_bytes());
  }
  if (got.format_version() != want.format_version()) {
    return mismatch("format_version", got.format_version(), want.format_version());
  }
  return absl::OkStatus();
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<TensorBytes> CheckTensor(const v1::Tensor& t, absl::string_view field,
                                        absl::Span<const DType> allowed,
                                        absl::Span<const int64_t> want) {
  if (t.payload_case() != v1::Tensor::kData) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".data: missing"));
  }
  ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(t.dtype(), absl::StrCat(field, ".dtype")));
  bool ok = false;
  for (DType a : allowed) ok |= a == dtype;
  if (!ok) {
    std::string names;
    for (DType a : allowed) absl::StrAppend(&names, names.empty() ? "" : " or ", DTypeName(a));
    return absl::InvalidArgumentError(absl::StrCat(field, ".dtype: ", DTypeName(dtype),
                                                   " is not allowed (want ", names, ")"));
  }
  const std::vector<int64_t> got(t.shape().begin(), t.shape().end());
  if (!std::equal(got.begin(), got.end(), want.begin(), want.end())) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape: ", ShapeString(got),
                                                   ", want ", ShapeString(want)));
  }
  int64_t count = 1;
  for (int64_t d : want) count *= d;
  const int64_t bytes = count * DTypeSize(dtype);
  if (static_cast<int64_t>(t.data().size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".data: ", t.data().size(),
                                                   " bytes, want ", bytes, " (", ShapeString(want),
                                                   " x ", DTypeName(dtype), ")"));
  }
  return TensorBytes{dtype, t.data().data(), count, bytes};
}

}  // namespace statecache
