#include "kernels/layout/state_layout.h"

#include <cmath>
#include <cstring>
#include <algorithm>
#include <numeric>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

absl::Status CheckPermutation(const int32_t* p, int n, const char* field, int layer, int head) {
  std::vector<bool> seen(n, false);
  for (int i = 0; i < n; ++i) {
    if (p[i] < 0 || p[i] >= n || seen[p[i]]) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": layer ", layer, " head ", head, " is not a permutation of 0..", n - 1,
          " (entry ", i, " = ", p[i], ")"));
    }
    seen[p[i]] = true;
  }
  return absl::OkStatus();
}

class Fnv1a {
 public:
  void Add(const void* data, size_t n) {
    const auto* b = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 1099511628211ULL;
  }
  template <typename T>
  void AddValue(T v) { Add(&v, sizeof(v)); }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 1469598103934665603ULL;
};

}  // namespace

absl::StatusOr<StateLayout> StateLayout::Identity(const ModelGeometry& geometry,
                                                  const FormatSpec& format) {
  RETURN_IF_ERROR(geometry.Validate());
  const int64_t heads = geometry.HeadsPerSlot();
  std::vector<int32_t> key_perm(heads * geometry.d_k);
  for (int64_t h = 0; h < heads; ++h) {
    std::iota(key_perm.begin() + h * geometry.d_k, key_perm.begin() + (h + 1) * geometry.d_k, 0);
  }
  std::vector<int32_t> order;
  std::vector<float> scale;
  if (IsStepQuantFormat(format.format)) {
    RETURN_IF_ERROR(ValidateFormatSpec(format, geometry.d_k));
    return CreateStepQuant(
        geometry, format, std::move(key_perm),
        std::vector<int8_t>(heads * geometry.d_k,
                            static_cast<int8_t>(StepQuantNominalBits(format.format))),
        std::vector<float>(heads * geometry.d_k, 1.0f));
  }
  if (format.format == StateFormat::kDampSr) {
    order.resize(heads * geometry.d_v);
    for (int64_t h = 0; h < heads; ++h) {
      std::iota(order.begin() + h * geometry.d_v, order.begin() + (h + 1) * geometry.d_v, 0);
    }
    scale.assign(heads * geometry.d_v, 1.0f);
  }
  return Create(geometry, format, std::move(key_perm), std::move(order), std::move(scale));
}

absl::StatusOr<StateLayout> StateLayout::Layer(int layer) const {
  if (layer < 0 || layer >= geometry_.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer: ", layer, " is outside [0, ", geometry_.layers, ")"));
  }
  if (IsStepQuantFormat(format_.format)) {
    return absl::UnimplementedError(absl::StrCat(
        "format: one layer of a ", FormatSpecName(format_), " layout (per-head sizes)"));
  }
  ModelGeometry one = geometry_;
  one.layers = 1;
  const auto slice = [&](const auto& all, int64_t per_head) {
    using V = typename std::decay_t<decltype(all)>::value_type;
    if (all.empty()) return std::vector<V>();
    const int64_t n = int64_t{geometry_.h_v} * per_head;
    return std::vector<V>(all.begin() + layer * n, all.begin() + (layer + 1) * n);
  };
  return Create(one, format_, slice(key_perm_, geometry_.d_k), slice(value_order_, geometry_.d_v),
                slice(value_scale_, geometry_.d_v));
}

absl::StatusOr<StateLayout> StateLayout::Create(const ModelGeometry& geometry,
                                                const FormatSpec& format,
                                                std::vector<int32_t> key_perm,
                                                std::vector<int32_t> value_order,
                                                std::vector<float> value_scale) {
  RETURN_IF_ERROR(geometry.Validate());
  RETURN_IF_ERROR(ValidateFormatSpec(format, geometry.d_k));
  const int64_t heads = geometry.HeadsPerSlot();
  if (IsStepQuantFormat(format.format) && value_order.empty() && value_scale.empty()) {
    // Uncalibrated widths: the nominal width everywhere, unit row impact.
    return CreateStepQuant(
        geometry, format, std::move(key_perm),
        std::vector<int8_t>(heads * geometry.d_k,
                            static_cast<int8_t>(StepQuantNominalBits(format.format))),
        std::vector<float>(heads * geometry.d_k, 1.0f));
  }
  if (static_cast<int64_t>(key_perm.size()) != heads * geometry.d_k) {
    return absl::InvalidArgumentError(absl::StrCat("key_perm: has ", key_perm.size(),
                                                   " entries, want layers*h_v*d_k = ",
                                                   heads * geometry.d_k));
  }
  const bool sr = format.format == StateFormat::kDampSr;
  const int64_t want_v = sr ? heads * geometry.d_v : 0;
  if (static_cast<int64_t>(value_order.size()) != want_v) {
    return absl::InvalidArgumentError(absl::StrCat(
        "value_order: has ", value_order.size(), " entries, want ", want_v,
        sr ? " (layers*h_v*d_v)" : " (only damp-sr has a value order)"));
  }
  if (static_cast<int64_t>(value_scale.size()) != want_v) {
    return absl::InvalidArgumentError(absl::StrCat(
        "value_scale: has ", value_scale.size(), " entries, want ", want_v,
        sr ? " (layers*h_v*d_v)" : " (only damp-sr has value scales)"));
  }
  StateLayout l;
  l.geometry_ = geometry;
  l.format_ = format;
  l.head_layout_ = MakeHeadLayout(format, geometry.d_k, geometry.d_v);
  for (int layer = 0; layer < geometry.layers; ++layer) {
    for (int head = 0; head < geometry.h_v; ++head) {
      const int64_t hi = int64_t{layer} * geometry.h_v + head;
      const int32_t* kp = key_perm.data() + hi * geometry.d_k;
      RETURN_IF_ERROR(CheckPermutation(kp, geometry.d_k, "key_perm", layer, head));
      for (int i = 0; i < geometry.d_k; ++i) l.identity_key_perm_ &= kp[i] == i;
      if (!sr) continue;
      RETURN_IF_ERROR(CheckPermutation(value_order.data() + hi * geometry.d_v, geometry.d_v,
                                       "value_order", layer, head));
      for (int j = 0; j < geometry.d_v; ++j) {
        const float c = value_scale[hi * geometry.d_v + j];
        if (!(c > 0.0f) || !std::isfinite(c)) {
          return absl::InvalidArgumentError(absl::StrCat("value_scale: layer ", layer, " head ",
                                                         head, " entry ", j, " = ", c,
                                                         " (must be finite and > 0)"));
        }
      }
    }
  }
  l.key_perm_ = std::move(key_perm);
  l.value_order_ = std::move(value_order);
  l.value_scale_ = std::move(value_scale);
  l.payload_bits_ = l.head_layout_.PayloadBitsPerValue();
  l.ComputeFingerprint();
  return l;
}

absl::StatusOr<StateLayout> StateLayout::CreateStepQuant(const ModelGeometry& geometry,
                                                         const FormatSpec& format,
                                                         std::vector<int32_t> key_perm,
                                                         std::vector<int8_t> row_bits,
                                                         std::vector<float> row_impact) {
  RETURN_IF_ERROR(geometry.Validate());
  RETURN_IF_ERROR(ValidateFormatSpec(format, geometry.d_k));
  if (!IsStepQuantFormat(format.format)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format: ", FormatSpecName(format), " has no row bit map (stepquant-6 / stepquant-4 only)"));
  }
  const int64_t heads = geometry.HeadsPerSlot();
  const int d_k = geometry.d_k;
  for (const auto& [name, size] : {std::pair<const char*, size_t>{"key_perm", key_perm.size()},
                                   {"row_bits", row_bits.size()},
                                   {"row_impact", row_impact.size()}}) {
    if (static_cast<int64_t>(size) != heads * d_k) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": has ", size,
                                                     " entries, want layers*h_v*d_k = ", heads * d_k));
    }
  }
  StateLayout l;
  l.geometry_ = geometry;
  l.format_ = format;
  const PackedHeadLayout nominal = MakeHeadLayout(format, d_k, geometry.d_v);
  l.step_heads_.reserve(heads);
  l.head_offsets_.reserve(heads);
  int64_t total = 0;
  double payload_bytes = 0;
  for (int layer = 0; layer < geometry.layers; ++layer) {
    for (int head = 0; head < geometry.h_v; ++head) {
      const int64_t hi = int64_t{layer} * geometry.h_v + head;
      const int32_t* kp = key_perm.data() + hi * d_k;
      RETURN_IF_ERROR(CheckPermutation(kp, d_k, "key_perm", layer, head));
      for (int i = 0; i < d_k; ++i) l.identity_key_perm_ &= kp[i] == i;
      const int8_t* bits = row_bits.data() + hi * d_k;
      const float* impact = row_impact.data() + hi * d_k;
      for (int r = 0; r < d_k; ++r) {
        if (!IsValidStepBits(bits[r])) {
          return absl::InvalidArgumentError(absl::StrCat("row_bits: layer ", layer, " head ", head,
                                                         " row ", r, " = ", int{bits[r]},
                                                         " (want 16 for a pivot or 2..8)"));
        }
        if (r > 0 && bits[r] > bits[r - 1]) {
          return absl::InvalidArgumentError(absl::StrCat(
              "row_bits: layer ", layer, " head ", head, " row ", r, " = ", int{bits[r]},
              " is wider than row ", r - 1, " = ", int{bits[r - 1]},
              " (stored rows must be in non-increasing width)"));
        }
        if (!(impact[r] > 0.0f) || !(impact[r] <= 1.0f)) {
          return absl::InvalidArgumentError(absl::StrCat("row_impact: layer ", layer, " head ",
                                                         head, " row ", r, " = ", impact[r],
                                                         " (must be in (0, 1])"));
        }
      }
      const StepHeadLayout sh = MakeStepHeadLayout(bits, d_k, geometry.d_v);
      l.head_offsets_.push_back(total);
      total += sh.head_bytes;
      payload_bytes += sh.PayloadBitsPerValue() * d_k * geometry.d_v / 8.0;
      l.step_heads_.push_back(sh);
    }
  }
  l.head_layout_ = nominal;
  const int64_t mean = AlignUp((total + heads - 1) / heads, kHeadAlignment);
  l.head_layout_.head_bytes = std::max(nominal.head_bytes, mean);
  l.payload_bits_ = payload_bytes * 8.0 / (static_cast<double>(heads) * d_k * geometry.d_v);
  l.key_perm_ = std::move(key_perm);
  l.row_bits_ = std::move(row_bits);
  l.row_impact_ = std::move(row_impact);
  l.ComputeFingerprint();
  return l;
}

void StateLayout::ComputeFingerprint() {
  const ModelGeometry& geometry = geometry_;
  const FormatSpec& format = format_;
  StateLayout& l = *this;
  Fnv1a h;
  h.AddValue(static_cast<int>(geometry.arch));
  for (int v : {geometry.layers, geometry.h_qk, geometry.h_v, geometry.d_k, geometry.d_v,
                static_cast<int>(format.format), format.k_hi}) {
    h.AddValue(v);
  }
  h.AddValue(geometry.EffectiveScale());
  h.Add(l.key_perm_.data(), l.key_perm_.size() * sizeof(int32_t));
  h.Add(l.value_order_.data(), l.value_order_.size() * sizeof(int32_t));
  h.Add(l.value_scale_.data(), l.value_scale_.size() * sizeof(float));
  // STEPQuant maps (empty for every other format: their fingerprints are
  // unchanged).
  h.Add(l.row_bits_.data(), l.row_bits_.size());
  h.Add(l.row_impact_.data(), l.row_impact_.size() * sizeof(float));
  l.fingerprint_ = h.value();
}

}  // namespace statecache
