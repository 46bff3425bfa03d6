// Storage formats of a recurrent state and how they decompose into rows.
//
// Every format stores a d_k x d_v head as d_k key rows. A row is stored in one
// RowCodec; a format is "K_hi rows of hi_codec, then d_k - K_hi rows of
// lo_codec" (uniform formats have K_hi = 0), optionally in a value-axis
// transformed domain (ValueTransform). DESIGN.md section 3 is the source.
//
// Every format is one row of STATECACHE_FORMAT_TABLE below; the enum, the
// names ParseFormatSpec accepts, the row codecs, the head sizes
// (head_layout.h), the CPU codec (head_codec.h, by row codec) and the CUDA
// kernels' format switches (kernels/cuda: ForEachFormat) all derive from it.
// Adding a format: a row here, its row codec if it needs a new one
// (head_layout.h sizes, head_codec.h, kernels/cuda/internal/tile_codec.cuh),
// and its tests (format_test.cc, head_codec_test.cc's error bound).
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

// The CUDA translation unit that compiles a format's kernels (kernels/cuda/
// BUILD states why each is compiled as it is):
//   kRecurrence        internal/recurrence_kernel.cu (ptxas register-usage
//                      level 10), pack_kernel.cu
//   kRecurrenceAffine  internal/recurrence_kernel_affine.cu (ptxas default
//                      level: affine rows run faster with it), pack_kernel.cu
//   kStepQuant         internal/stepquant_*kernel.cu (per-head layouts)
enum class CudaUnit : uint8_t { kRecurrence, kRecurrenceAffine, kStepQuant };

// The format table. Columns:
//   enumerator  StateFormat value: the code stored in layout files and
//               StateLayout fingerprints (never renumber)
//   code        its value
//   name        the wire name (FormatName / ParseFormatSpec)
//   mixed       takes k_hi: K_hi rows of `hi`, then rows of `lo` (damp,
//               damp-sr; default k_hi kDefaultKHi); else every row is `lo`
//   hi, lo      RowCodec of the hi rows (fp32 when not mixed: unused) and
//               of the other rows
//   transform   ValueTransform of the stored head
//   bits        nominal code bits per lo value (STEPQuant: the average
//               budget its calibrated bit map meets)
//   lane        columns per lane pair of the tile kernels (LaneWidth,
//               kernels/cuda/internal/tile_common.cuh)
//   staged      fixed-shape heads run the staged kernel (IsStagedFormat,
//               kernels/cuda/internal/stage_layout.h)
//   unit        CudaUnit that compiles its kernels
#define STATECACHE_FORMAT_TABLE(X)                                                              \
  /* enumerator     code  name             mixed  hi     lo          transform      bits lane staged unit */ \
  X(kFp32,          0,  "fp32",          false, kFp32, kFp32,      kNone,         32,  4,  true,  kRecurrence)       \
  X(kFp16,          1,  "fp16",          false, kFp32, kFp16,      kNone,         16,  8,  false, kRecurrence)       \
  X(kBf16,          2,  "bf16",          false, kFp32, kBf16,      kNone,         16,  8,  false, kRecurrence)       \
  X(kInt8,          3,  "int8",          false, kFp32, kAffineU8,  kNone,         8,   16, false, kRecurrenceAffine) \
  X(kInt8Hadamard,  4,  "int8-hadamard", false, kFp32, kAffineU8,  kHadamard32,   8,   16, false, kRecurrenceAffine) \
  X(kInt4,          5,  "int4",          false, kFp32, kAffineU4,  kNone,         4,   16, false, kRecurrenceAffine) \
  X(kInt4Hadamard,  6,  "int4-hadamard", false, kFp32, kAffineU4,  kHadamard32,   4,   16, false, kRecurrenceAffine) \
  X(kFp8E4m3,       7,  "fp8-e4m3",      false, kFp32, kFp8E4m3,   kNone,         8,   16, false, kRecurrence)       \
  X(kNvfp4,         8,  "nvfp4",         false, kFp32, kNvfp4,     kNone,         4,   16, false, kRecurrence)       \
  X(kDamp,          9,  "damp",          true,  kFp16, kAffineU8,  kHadamard32,   8,   16, false, kRecurrenceAffine) \
  X(kDampSr,        10, "damp-sr",       true,  kFp16, kSymI8,     kScaleReorder, 8,   16, false, kRecurrence)       \
  X(kStepQuant6,    11, "stepquant-6",   false, kFp32, kStepQuant, kNone,         6,   16, false, kStepQuant)        \
  X(kStepQuant4,    12, "stepquant-4",   false, kFp32, kStepQuant, kNone,         4,   16, false, kStepQuant)

enum class StateFormat : uint8_t {
#define STATECACHE_FORMAT_ENUMERATOR(e, code, ...) e = code,
  STATECACHE_FORMAT_TABLE(STATECACHE_FORMAT_ENUMERATOR)
#undef STATECACHE_FORMAT_ENUMERATOR
};

// One row of the table.
struct FormatTraits {
  StateFormat format;
  const char* name;
  bool mixed;
  RowCodec hi;
  RowCodec lo;
  ValueTransform transform;
  int bits;
  int lane;
  bool staged;
  CudaUnit unit;
};

// The row of `f` (a valid format: ValidateFormatSpec; an unknown code gets
// fp32's row).
SC_HD_CONSTEXPR FormatTraits TraitsOf(StateFormat f) {
  switch (f) {
#define STATECACHE_FORMAT_TRAITS(e, code, name, mixed, hi, lo, transform, bits, lane, staged,  \
                                 unit)                                                          \
  case StateFormat::e:                                                                          \
    return FormatTraits{StateFormat::e, name,      mixed,  RowCodec::hi, RowCodec::lo,          \
                        ValueTransform::transform, bits,   lane,         staged,                \
                        CudaUnit::unit};
    STATECACHE_FORMAT_TABLE(STATECACHE_FORMAT_TRAITS)
#undef STATECACHE_FORMAT_TRAITS
  }
  return TraitsOf(StateFormat::kFp32);
}

// One column of the table as a switch of its own (STATECACHE_FORMAT_COLUMN
// (Fn, Type, column, fallback) defines SC_HD_CONSTEXPR Type Fn(StateFormat)):
// the accessors that device code calls, small enough for the CUDA compiler
// to fold like a hand-written switch.
#define STATECACHE_FORMAT_COLUMN(Fn, Type, column, fallback)                                   \
  SC_HD_CONSTEXPR Type Fn(StateFormat f) {                                                     \
    switch (f) {                                                                               \
      STATECACHE_FORMAT_TABLE(STATECACHE_FORMAT_COLUMN_##column)                               \
    }                                                                                          \
    return fallback;                                                                           \
  }
#define STATECACHE_FORMAT_COLUMN_mixed(e, code, name, mixed, ...) \
  case StateFormat::e: return mixed;
#define STATECACHE_FORMAT_COLUMN_hi(e, code, name, mixed, hi, ...) \
  case StateFormat::e: return RowCodec::hi;
#define STATECACHE_FORMAT_COLUMN_lo(e, code, name, mixed, hi, lo, ...) \
  case StateFormat::e: return RowCodec::lo;
#define STATECACHE_FORMAT_COLUMN_transform(e, code, name, mixed, hi, lo, transform, ...) \
  case StateFormat::e: return ValueTransform::transform;
#define STATECACHE_FORMAT_COLUMN_staged(e, code, name, mixed, hi, lo, transform, bits, lane, \
                                        staged, ...)                                          \
  case StateFormat::e: return staged;

// Every format of the table, in code order.
inline constexpr StateFormat kAllFormats[] = {
#define STATECACHE_FORMAT_LIST(e, ...) StateFormat::e,
    STATECACHE_FORMAT_TABLE(STATECACHE_FORMAT_LIST)
#undef STATECACHE_FORMAT_LIST
};
// Every format code ParseFormatSpec / ValidateFormatSpec accept (codes are
// 0 .. kNumAllStateFormats - 1).
inline constexpr int kNumAllStateFormats = sizeof(kAllFormats) / sizeof(kAllFormats[0]);

// Codec of the remaining rows (all rows for uniform formats).
STATECACHE_FORMAT_COLUMN(LoRowCodec, RowCodec, lo, RowCodec::kFp32)

SC_HD_CONSTEXPR bool IsStepQuantFormat(StateFormat f) {
  return LoRowCodec(f) == RowCodec::kStepQuant;
}

// Formats listed by AllStateFormats(): the uniform-head formats of DESIGN.md
// section 3 that every backend, table and sweep handles (not STEPQuant,
// whose heads have per-(layer, head) sizes from a calibrated bit map).
constexpr int CountUniformHeadFormats() {
  int n = 0;
  for (StateFormat f : kAllFormats) n += IsStepQuantFormat(f) ? 0 : 1;
  return n;
}
inline constexpr int kNumStateFormats = CountUniformHeadFormats();

// STEPQuant (seed 002): per-unit code widths (whole heads for GDN, key rows
// for KDA) from a calibrated bit map at a nominal budget of 6 or 4 bits per
// value, FP16 pivot units, and dual-axis FP16 row x column scales per head
// (kernels/formats/stepquant_codec.h). Heads have per-(layer, head) sizes.
// Nominal average code width of a STEPQuant format (6 or 4); 0 otherwise.
SC_HD_CONSTEXPR int StepQuantNominalBits(StateFormat f) {
  return IsStepQuantFormat(f) ? TraitsOf(f).bits : 0;
}
// Candidate code widths (ascending) the calibration allocates for a STEPQuant
// format: stepquant-6 {4, 6, 8} (three precisions, seed 002 appendix D),
// stepquant-4 {3, 4, 6, 8} (four); empty for every other format.
std::vector<int> StepQuantCandidateBits(StateFormat format);

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

// The table's name: "fp32", "fp16", "bf16", "int8", "int8-hadamard", "int4",
// "int4-hadamard", "fp8-e4m3", "nvfp4", "damp", "damp-sr", "stepquant-6",
// "stepquant-4"; "unknown" for a code outside the table.
const char* FormatName(StateFormat format);
// "damp:16" for mixed formats, the plain name otherwise.
std::string FormatSpecName(const FormatSpec& spec);
// The kNumStateFormats uniform-head formats in code order (no STEPQuant).
std::vector<StateFormat> AllStateFormats();
// AllStateFormats() followed by the STEPQuant formats: every format.
std::vector<StateFormat> AllFormatsWithStepQuant();

// Parses "<name>" or "<name>:<k_hi>" (the suffix only for damp/damp-sr).
// Unknown names and malformed suffixes give kInvalidArgument naming the text.
absl::StatusOr<FormatSpec> ParseFormatSpec(absl::string_view text);

// Checks k_hi against d_k: kInvalidArgument if k_hi < 0, k_hi > d_k, or
// k_hi != 0 for a uniform format, with a message naming the `format` field
// and its spec ("format: 'damp:999': k_hi 999 is outside 0..128 ...").
absl::Status ValidateFormatSpec(const FormatSpec& spec, int d_k);

STATECACHE_FORMAT_COLUMN(IsMixedFormat, bool, mixed, false)

// Codec of the first k_hi rows (mixed formats) - fp16 for damp and damp-sr.
STATECACHE_FORMAT_COLUMN(HiRowCodec, RowCodec, hi, RowCodec::kFp32)

STATECACHE_FORMAT_COLUMN(ValueTransformOf, ValueTransform, transform, ValueTransform::kNone)

// Fixed-shape heads run the staged kernel (kernels/cuda/internal/stage_layout.h).
STATECACHE_FORMAT_COLUMN(IsStagedFormat, bool, staged, false)

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_FORMAT_H_
