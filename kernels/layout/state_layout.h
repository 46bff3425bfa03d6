// StateLayout: everything needed to interpret a model's packed states.
//
// Geometry + format + per-(layer, value head) calibrated maps:
//  - key_perm[d_k]: stored row r holds key channel key_perm[r] (the k_hi
//    protected channels first, DESIGN.md section 4). Applied to q, k, KDA's g
//    and the state. Identity when uncalibrated.
//  - damp-sr only: value_order[d_v] (stored column j' holds value channel
//    value_order[j']) and value_scale[d_v] (per original value channel c_j > 0;
//    the stored column is S[:, j] / c_j).
// The layout is immutable once built; Fingerprint() is the checksum carried in
// compatibility tags. Thread-safe for concurrent reads.
//
//   ASSIGN_OR_RETURN(StateLayout layout, StateLayout::Identity(geometry, spec));
#ifndef STATECACHE_KERNELS_LAYOUT_STATE_LAYOUT_H_
#define STATECACHE_KERNELS_LAYOUT_STATE_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/formats/format.h"
#include "kernels/formats/head_layout.h"
#include "kernels/layout/geometry.h"

namespace statecache {

class StateLayout {
 public:
  // Identity permutations (and unit value scales for damp-sr).
  static absl::StatusOr<StateLayout> Identity(const ModelGeometry& geometry,
                                              const FormatSpec& format);

  // Validates and takes calibrated maps. Sizes: key_perm [layers * h_v * d_k];
  // value_order / value_scale [layers * h_v * d_v] for damp-sr, empty for
  // other formats. kInvalidArgument (naming the field, layer and head) when a
  // permutation is not a permutation, a scale is not finite and positive, a
  // size is wrong, or geometry / format are invalid.
  static absl::StatusOr<StateLayout> Create(const ModelGeometry& geometry,
                                            const FormatSpec& format,
                                            std::vector<int32_t> key_perm,
                                            std::vector<int32_t> value_order,
                                            std::vector<float> value_scale);

  const ModelGeometry& geometry() const { return geometry_; }
  const FormatSpec& format() const { return format_; }
  const PackedHeadLayout& head_layout() const { return head_layout_; }
  // Bytes of one slot: layers * h_v heads.
  int64_t slot_bytes() const { return head_layout_.head_bytes * geometry_.HeadsPerSlot(); }

  // [d_k] for (layer, value head).
  const int32_t* key_perm(int layer, int head) const {
    return key_perm_.data() + HeadIndex(layer, head) * geometry_.d_k;
  }
  // [d_v] for damp-sr; nullptr otherwise.
  const int32_t* value_order(int layer, int head) const {
    return value_order_.empty() ? nullptr
                                : value_order_.data() + HeadIndex(layer, head) * geometry_.d_v;
  }
  const float* value_scale(int layer, int head) const {
    return value_scale_.empty() ? nullptr
                                : value_scale_.data() + HeadIndex(layer, head) * geometry_.d_v;
  }
  const std::vector<int32_t>& all_key_perms() const { return key_perm_; }
  const std::vector<int32_t>& all_value_orders() const { return value_order_; }
  const std::vector<float>& all_value_scales() const { return value_scale_; }

  // True when every key permutation is the identity (no gather needed).
  bool identity_key_perm() const { return identity_key_perm_; }

  // FNV-1a 64 over geometry, format and all maps: equal layouts, equal value.
  uint64_t Fingerprint() const { return fingerprint_; }

 private:
  StateLayout() = default;
  int64_t HeadIndex(int layer, int head) const { return int64_t{layer} * geometry_.h_v + head; }

  ModelGeometry geometry_;
  FormatSpec format_;
  PackedHeadLayout head_layout_;
  std::vector<int32_t> key_perm_;
  std::vector<int32_t> value_order_;
  std::vector<float> value_scale_;
  bool identity_key_perm_ = true;
  uint64_t fingerprint_ = 0;
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_LAYOUT_STATE_LAYOUT_H_
