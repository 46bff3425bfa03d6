// StateLayout: everything needed to interpret a model's packed states.
//
// Geometry + format + per-(layer, value head) calibrated maps:
//  - key_perm[d_k]: stored row r holds key channel key_perm[r] (the k_hi
//    protected channels first, DESIGN.md section 4). Applied to q, k, KDA's g
//    and the state. Identity when uncalibrated.
//  - damp-sr only: value_order[d_v] (stored column j' holds value channel
//    value_order[j']) and value_scale[d_v] (per original value channel c_j > 0;
//    the stored column is S[:, j] / c_j).
//  - stepquant-6 / -4 only (issue 9, seed 002): row_bits[d_k] - the width of
//    each stored row (16 = FP16 pivot, else a code width 2..8), non-increasing
//    within a head (pivots first; calibration orders key_perm that way) - and
//    row_impact[d_k], the row-impact factor w_i in (0, 1] of each stored row
//    (weights of the column fit, stepquant_codec.h). Heads then have
//    different sizes: step_head(layer, head) is each head's StepHeadLayout
//    and head_offsets() the byte offset of every (layer, head) inside a slot.
//    Heads are packed back to back; head_layout().head_bytes is the mean
//    head stride (a multiple of 16, at least the nominal head) so that
//    slot_bytes() = HeadsPerSlot() * head_bytes still sizes a slot and every
//    pool built from head_layout() keeps working. Uncalibrated (Identity /
//    Create) STEPQuant layouts use the nominal width for every row, w_i = 1.
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
#include "kernels/formats/stepquant_codec.h"
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

  // A STEPQuant layout from calibrated maps: key_perm as in Create, row_bits
  // and row_impact [layers * h_v * d_k] in stored row order. kInvalidArgument
  // (naming the field, layer, head and row) when the format is not
  // stepquant-*, a size is wrong, a width is not 16 or 2..8, widths increase
  // along the stored rows of a head, or an impact factor is not finite and
  // in (0, 1].
  static absl::StatusOr<StateLayout> CreateStepQuant(const ModelGeometry& geometry,
                                                     const FormatSpec& format,
                                                     std::vector<int32_t> key_perm,
                                                     std::vector<int8_t> row_bits,
                                                     std::vector<float> row_impact);

  // Layer `layer` alone: a one-layer layout with that layer's maps (an
  // engine that keeps each layer's states apart, e.g. vLLM's pages).
  // kInvalidArgument naming "layer" outside [0, layers); kUnimplemented for
  // the STEPQuant formats (their per-head sizes).
  absl::StatusOr<StateLayout> Layer(int layer) const;

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

  // STEPQuant: [d_k] widths / impact factors of (layer, value head); nullptr
  // for other formats.
  const int8_t* row_bits(int layer, int head) const {
    return row_bits_.empty() ? nullptr : row_bits_.data() + HeadIndex(layer, head) * geometry_.d_k;
  }
  const float* row_impact(int layer, int head) const {
    return row_impact_.empty() ? nullptr
                               : row_impact_.data() + HeadIndex(layer, head) * geometry_.d_k;
  }
  const std::vector<int8_t>& all_row_bits() const { return row_bits_; }
  const std::vector<float>& all_row_impacts() const { return row_impact_; }
  // STEPQuant: the layout of one head. Only for STEPQuant layouts.
  const StepHeadLayout& step_head(int layer, int head) const {
    return step_heads_[HeadIndex(layer, head)];
  }
  // STEPQuant: byte offset of every (layer, head) inside a slot,
  // [layers * h_v]; empty for the uniform formats (offset = index * head_bytes).
  const std::vector<int64_t>& head_offsets() const { return head_offsets_; }
  // Byte offset of (layer, head) inside a slot, any format.
  int64_t head_offset(int layer, int head) const {
    return head_offsets_.empty() ? HeadIndex(layer, head) * head_layout_.head_bytes
                                 : head_offsets_[HeadIndex(layer, head)];
  }
  // Bits per state value over a whole slot as the seeds count them (codes,
  // scales, pivots; no alignment padding); the head layout's for uniform
  // formats.
  double PayloadBitsPerValue() const { return payload_bits_; }

  // True when every key permutation is the identity (no gather needed).
  bool identity_key_perm() const { return identity_key_perm_; }

  // FNV-1a 64 over geometry, format and all maps: equal layouts, equal value.
  uint64_t Fingerprint() const { return fingerprint_; }

 private:
  StateLayout() = default;
  void ComputeFingerprint();
  int64_t HeadIndex(int layer, int head) const { return int64_t{layer} * geometry_.h_v + head; }

  ModelGeometry geometry_;
  FormatSpec format_;
  PackedHeadLayout head_layout_;
  std::vector<int32_t> key_perm_;
  std::vector<int32_t> value_order_;
  std::vector<float> value_scale_;
  std::vector<int8_t> row_bits_;
  std::vector<float> row_impact_;
  std::vector<StepHeadLayout> step_heads_;
  std::vector<int64_t> head_offsets_;
  double payload_bits_ = 0;
  bool identity_key_perm_ = true;
  uint64_t fingerprint_ = 0;
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_LAYOUT_STATE_LAYOUT_H_
