// Layout files: a calibrated StateLayout stored once per model (DESIGN.md
// section 4: "a versioned, checksummed artifact"), as safetensors.
//
//   __metadata__:
//     format       "statecache.layout"
//     version      "1"
//     arch, layers, h_qk, h_v, d_k, d_v, scale   the model geometry
//     state_format FormatSpecName, e.g. "damp:16" (k_hi included)
//     fingerprint  StateLayout::Fingerprint() as 16 hex digits
//     checksum     "fnv1a64:<16 hex digits>", see below
//     any other keys: provenance (selector, calibration set, tool), covered
//                  by the checksum
//   key_perm     I32 [layers, h_v, d_k]
//   value_order  I32 [layers, h_v, d_v]   damp-sr only
//   value_scale  F32 [layers, h_v, d_v]   damp-sr only
//   scores       F32 [layers, h_v, d_k]   optional: the selector's channel scores
//   row_bits     I32 [layers, h_v, d_k]   stepquant-* only: stored-row widths
//                                          (16 = fp16 pivot, else 2..8)
//   row_impact   F32 [layers, h_v, d_k]   stepquant-* only: row-impact w_i
//
// checksum = FNV-1a 64 over, in this order: every metadata entry except
// "checksum" as "key=value\n" in sorted key order, then for every tensor in
// sorted name order: "name\n", dtype name, "\n", the shape as decimal
// numbers each followed by ",", "\n", and the raw little-endian bytes.
//
// Errors on read:
//  - kNotFound: no such file.
//  - kDataLoss: the checksum does not match (a flipped bit anywhere in the
//    tensor bytes or metadata values ends here).
//  - kInvalidArgument: structurally malformed (not safetensors, missing or
//    unparsable field, wrong tensor shape or dtype, unknown version, a map
//    that is not a permutation), or - with expectations given - a geometry
//    or format that differs from the model's, naming the field.
//  - kFailedPrecondition: the checksum matches but the stored fingerprint
//    differs from the one this build computes (a layout written by an
//    incompatible build).
//
//   RETURN_IF_ERROR(WriteLayoutFile(layout, {{"selector", "ep"}}, {}, path));
//   ASSIGN_OR_RETURN(LayoutFile f, ReadLayoutFile(path, &geometry, &spec));
#ifndef STATECACHE_KERNELS_LAYOUT_LAYOUT_FILE_H_
#define STATECACHE_KERNELS_LAYOUT_LAYOUT_FILE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/formats/format.h"
#include "kernels/layout/geometry.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

inline constexpr char kLayoutFormatName[] = "statecache.layout";
inline constexpr int kLayoutFormatVersion = 1;

struct LayoutFile {
  StateLayout layout;
  // Provenance metadata (every key that is not one of the reserved ones).
  std::map<std::string, std::string> info;
  std::vector<float> scores;  // empty when the file has none
};

// The complete file image. `info` keys must not collide with the reserved
// keys (kInvalidArgument). `scores` is empty or [layers * h_v * d_k].
absl::StatusOr<std::string> SerializeLayout(const StateLayout& layout,
                                            const std::map<std::string, std::string>& info,
                                            const std::vector<float>& scores);
absl::Status WriteLayoutFile(const StateLayout& layout,
                             const std::map<std::string, std::string>& info,
                             const std::vector<float>& scores, const std::string& path);

// Parses a file image. When `want_geometry` / `want_format` are non-null the
// stored ones must equal them (kInvalidArgument naming the field otherwise).
absl::StatusOr<LayoutFile> ParseLayout(std::string bytes, const ModelGeometry* want_geometry,
                                       const FormatSpec* want_format);
absl::StatusOr<LayoutFile> ReadLayoutFile(const std::string& path,
                                          const ModelGeometry* want_geometry,
                                          const FormatSpec* want_format);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_LAYOUT_LAYOUT_FILE_H_
