// Storage formats of a recurrent state and how they decompose into rows.
//
// Every format stores a d_k x d_v head as d_k key rows. A row is stored in one
// RowCodec; a format is "K_hi rows of hi_codec, then d_k - K_hi rows of
// lo_codec" (uniform formats have K_hi = 0), optionally in a value-axis
// transformed domain (ValueTransform). DESIGN.md section 3 is the source.
//
//   ASSIGN_OR_RETURN(FormatSpec spec, ParseFormatSpec("damp:16"));
//   PackedHeadLayout layout = MakeHeadLayout(spec, /*d_k=*/128, /*d_v=*/128);
#ifndef STATECACHE_KERNELS_FORMATS_FORMAT_H_
#define STATECACHE_KERNELS_FORMATS_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/common/host_device.h"

namespace statecache {

enum class StateFormat : uint8_t {
  kFp32 = 0,
  kFp16 = 1,
  kBf16 = 2,
  kInt8 = 3,
  kInt8Hadamard = 4,
  kInt4 = 5,
  kInt4Hadamard = 6,
  kFp8E4m3 = 7,
  kNvfp4 = 8,
  kDamp = 9,
  kDampSr = 10,
  // STEPQuant (issue 9, seed 002) formats 11 and 12 are the constants
  // kStepQuant6 / kStepQuant4 below, not enumerators: see there.
};
// Formats listed by AllStateFormats(): the uniform-head formats of DESIGN.md
// section 3 that every backend, table and sweep handles.
inline constexpr int kNumStateFormats = 11;

// STEPQuant (seed 002): per-unit code widths (whole heads for GDN, key rows
// for KDA) from a calibrated bit map at a nominal budget of 6 or 4 bits per
// value, FP16 pivot units, and dual-axis FP16 row x column scales per head
// (kernels/formats/stepquant_codec.h). Heads have per-(layer, head) sizes.
//
// They are constants of the enum type rather than enumerators on purpose:
// kernels/cuda dispatches with exhaustive `switch (format)` statements and is
// compiled with nvcc -Werror=all-warnings, so a new enumerator breaks that
// build (-Werror=switch) until the CUDA kernel handles it. When the fused
// STEPQuant kernel lands, its owner moves these into the enum (same values).
// Not listed by AllStateFormats(); see AllFormatsWithStepQuant().
inline constexpr StateFormat kStepQuant6 = static_cast<StateFormat>(11);
inline constexpr StateFormat kStepQuant4 = static_cast<StateFormat>(12);
// Every format code ParseFormatSpec / ValidateFormatSpec accept.
inline constexpr int kNumAllStateFormats = 13;

// How one key row of d_v values is stored.
enum class RowCodec : uint8_t {
  kFp32 = 0,      // float[d_v]
  kFp16 = 1,      // fp16[d_v], saturating at +-65504
  kBf16 = 2,      // bf16[d_v]
  kAffineU8 = 3,  // uint8[d_v] + fp16 (s, z) per 32 values
  kAffineU4 = 4,  // uint4[d_v] (low nibble first) + fp16 (s, z) per 32 values
  kSymI8 = 5,     // int8[d_v] + fp32 s per 32 values (damp-sr)
  kFp8E4m3 = 6,   // e4m3[d_v] + fp32 s per 32 values
  kNvfp4 = 7,     // e2m1[d_v] (low nibble first) + e4m3 scale per 16 values;
                  // one fp32 global scale per head
  kStepQuant = 8, // stepquant: per-row width from the layout's bit map, fp16
                  // row scale, one fp16 column-scale vector per head; coded by
                  // stepquant_codec.h, not row by row
};

// The value-axis map M of DESIGN.md section 7: the packed head stores S M.
enum class ValueTransform : uint8_t {
  kNone = 0,
  kHadamard32 = 1,     // block-diagonal normalized H32 (orthogonal, symmetric)
  kScaleReorder = 2,   // damp-sr: M = D^-1 P^T from the calibrated layout
};

inline constexpr int kDefaultKHi = 16;

// A format plus its parameters. k_hi is meaningful for damp / damp-sr only
// (for other formats it is 0).
struct FormatSpec {
  StateFormat format = StateFormat::kDamp;
  int k_hi = kDefaultKHi;

  bool operator==(const FormatSpec& o) const {
    return format == o.format && k_hi == o.k_hi;
  }
  bool operator!=(const FormatSpec& o) const { return !(*this == o); }
};

// Canonical names: "fp32", "fp16", "bf16", "int8", "int8-hadamard", "int4",
// "int4-hadamard", "fp8-e4m3", "nvfp4", "damp", "damp-sr", "stepquant-6",
// "stepquant-4".
const char* FormatName(StateFormat format);
// "damp:16" for mixed formats, the plain name otherwise.
std::string FormatSpecName(const FormatSpec& spec);
// The kNumStateFormats uniform-head formats in enum order (no STEPQuant).
std::vector<StateFormat> AllStateFormats();
// AllStateFormats() followed by kStepQuant6, kStepQuant4.
std::vector<StateFormat> AllFormatsWithStepQuant();

// Parses "<name>" or "<name>:<k_hi>" (the suffix only for damp/damp-sr).
// Unknown names and malformed suffixes give kInvalidArgument naming the text.
absl::StatusOr<FormatSpec> ParseFormatSpec(absl::string_view text);

// Checks k_hi against d_k: kInvalidArgument if k_hi < 0, k_hi > d_k, or
// k_hi != 0 for a uniform format, with a message naming the `format` field
// and its spec ("format: 'damp:999': k_hi 999 is outside 0..128 ...").
absl::Status ValidateFormatSpec(const FormatSpec& spec, int d_k);

SC_HD_CONSTEXPR bool IsStepQuantFormat(StateFormat f) {
  return f == kStepQuant6 || f == kStepQuant4;
}

// Nominal average code width of a STEPQuant format (6 or 4); 0 otherwise.
SC_HD_CONSTEXPR int StepQuantNominalBits(StateFormat f) {
  return f == kStepQuant6 ? 6 : (f == kStepQuant4 ? 4 : 0);
}

SC_HD_CONSTEXPR bool IsMixedFormat(StateFormat f) {
  return f == StateFormat::kDamp || f == StateFormat::kDampSr;
}

// Codec of the first k_hi rows (mixed formats) - fp16 for damp and damp-sr.
SC_HD_CONSTEXPR RowCodec HiRowCodec(StateFormat f) {
  return IsMixedFormat(f) ? RowCodec::kFp16 : RowCodec::kFp32;
}

// Codec of the remaining rows (all rows for uniform formats).
SC_HD_CONSTEXPR RowCodec LoRowCodec(StateFormat f) {
  switch (f) {
    case StateFormat::kFp32: return RowCodec::kFp32;
    case StateFormat::kFp16: return RowCodec::kFp16;
    case StateFormat::kBf16: return RowCodec::kBf16;
    case StateFormat::kInt8:
    case StateFormat::kInt8Hadamard:
    case StateFormat::kDamp: return RowCodec::kAffineU8;
    case StateFormat::kInt4:
    case StateFormat::kInt4Hadamard: return RowCodec::kAffineU4;
    case StateFormat::kFp8E4m3: return RowCodec::kFp8E4m3;
    case StateFormat::kNvfp4: return RowCodec::kNvfp4;
    case StateFormat::kDampSr: return RowCodec::kSymI8;
  }
  if (IsStepQuantFormat(f)) return RowCodec::kStepQuant;
  return RowCodec::kFp32;
}

SC_HD_CONSTEXPR ValueTransform ValueTransformOf(StateFormat f) {
  switch (f) {
    case StateFormat::kInt8Hadamard:
    case StateFormat::kInt4Hadamard:
    case StateFormat::kDamp: return ValueTransform::kHadamard32;
    case StateFormat::kDampSr: return ValueTransform::kScaleReorder;
    default: return ValueTransform::kNone;
  }
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_FORMAT_H_
