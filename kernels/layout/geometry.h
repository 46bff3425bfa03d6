// ModelGeometry: the shape of a model's recurrent states.
//
// One model has `layers` linear-attention layers; each layer has `h_v` value
// heads, each with a d_k x d_v FP32 state in the model's own math. Key heads
// (q, k) number `h_qk`; value head h reads key head KeyHeadOf(h) (GVA).
//
//   ModelGeometry g{Arch::kGdn, /*layers=*/30, /*h_qk=*/16, /*h_v=*/32,
//                   /*d_k=*/128, /*d_v=*/128};
//   RETURN_IF_ERROR(g.Validate());
#ifndef STATECACHE_KERNELS_LAYOUT_GEOMETRY_H_
#define STATECACHE_KERNELS_LAYOUT_GEOMETRY_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace statecache {

// Gated DeltaNet (scalar decay per head) or Kimi Delta Attention (per-key-
// channel decay).
enum class Arch : uint8_t { kGdn = 0, kKda = 1 };

// "gdn" / "kda".
const char* ArchName(Arch arch);
// Parses "gdn" or "kda" (case-sensitive); kInvalidArgument otherwise.
absl::StatusOr<Arch> ParseArch(absl::string_view name);

// Limits every component accepts; Validate() enforces them.
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kMaxLayers = 1024;
inline constexpr int kMaxHeads = 1024;
// Largest readout scale: with it, o = S^T (scale q) stays finite for every
// accepted state (kernels/formats/state_bound.h); 1/sqrt(d_k) is typical.
inline constexpr float kMaxReadoutScale = 65536.0f;

struct ModelGeometry {
  Arch arch = Arch::kGdn;
  int layers = 0;
  int h_qk = 0;   // key/query heads
  int h_v = 0;    // value heads (= recurrent states per layer)
  int d_k = 128;  // key dimension (state rows)
  int d_v = 128;  // value dimension (state columns)
  // Readout scale applied to q, in [0, kMaxReadoutScale]. 0 means the
  // default 1/sqrt(d_k).
  float scale = 0.0f;

  // kInvalidArgument naming the field when: layers/h_qk/h_v not positive or
  // above the limits, h_v not a multiple of h_qk, d_k not in [1, 256],
  // d_v not a positive multiple of 32 up to 256, scale not in
  // [0, kMaxReadoutScale].
  // KDA additionally requires h_qk == h_v.
  absl::Status Validate() const;

  float EffectiveScale() const {
    return scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(d_k));
  }
  // GVA: value head h reads key head h / (h_v / h_qk).
  int KeyHeadOf(int value_head) const { return value_head / (h_v / h_qk); }
  // Values of g per (token, value head): 1 for GDN, d_k for KDA.
  int GateWidth() const { return arch == Arch::kKda ? d_k : 1; }
  // Recurrent states per slot (all layers).
  int64_t HeadsPerSlot() const { return int64_t{layers} * h_v; }

  // "gdn L=4 Hqk=2 Hv=4 dk=128 dv=128".
  std::string DebugString() const;
  bool operator==(const ModelGeometry& o) const {
    return arch == o.arch && layers == o.layers && h_qk == o.h_qk &&
           h_v == o.h_v && d_k == o.d_k && d_v == o.d_v && scale == o.scale;
  }
  bool operator!=(const ModelGeometry& o) const { return !(*this == o); }
};

// Parses the command-line form "arch:layers:h_qk:h_v:d_k:d_v" (e.g.
// "gdn:30:16:32:128:128") and validates it; kInvalidArgument naming `field`
// (the flag) otherwise.
absl::StatusOr<ModelGeometry> ParseGeometry(absl::string_view text, absl::string_view field);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_LAYOUT_GEOMETRY_H_
