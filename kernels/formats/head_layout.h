// PackedHeadLayout: byte layout of one packed d_k x d_v recurrent state.
//
// A head is laid out as (each section starts 16-byte aligned, and the head
// size is a multiple of kHeadAlignment so consecutive heads stay aligned):
//
//   hi rows   k_hi x d_v             hi codec (fp16 for damp / damp-sr)
//   lo codes  (d_k - k_hi) x (code bytes per row)
//   lo meta   (d_k - k_hi) x (meta bytes per row)
//   global    fp32 global scale (nvfp4 only)
//
// Sections in row blocks: block b holds rows 8b .. 8b + n - 1 of the section
// (n = 8, fewer in the last block) unit-major, [unit][n][unit bytes], so
// unit u of row r sits at
//   section offset + 8b * row bytes + (u * n + r % 8) * unit bytes
// (UnitOffset). The units: for quantized lo rows each group of 32 values
// (an nvfp4 block of 16), its codes in lo codes (e.g. 32 bytes for int8) and
// its metadata - s, z or a scale - in lo meta (e.g. 4 bytes); for hi rows
// each 32 columns (64 bytes of fp16, runs of 8 columns in the order 0, 2, 1,
// 3: HiStoredRun). A GPU warp owns one 32-column stripe of 16 rows: its
// codes are whole 128-byte lines of the section and its metadata whole
// 32-byte sectors, which it stores as such, instead of pieces of 16
// row-major rows shared with three other warps (H200, B = 256, DAMP decode
// GDN 103.3 -> 98.2 us, KDA 105.8 -> 101.2 from the lo sections,
// docs/BENCHMARKS.md). FP lo rows (fp32 / fp16 / bf16 formats) are plain
// rows. (Packed-format revision 2, server/proto_convert.h.)
//
// Rows are in stored order: row r holds key channel key_perm[r] of the
// model's layout, so the k_hi protected rows come first. For DAMP at
// d_k = d_v = 128, k_hi = 16 this is 4096 + 14336 + 1792 = 20224 bytes
// (seed 000, appendix A.5). Everything here is constexpr / __host__ __device__.
//
// STEPQuant formats (stepquant-6 / -4) have per-(layer, head) layouts made
// from the calibrated bit map (StepHeadLayout in stepquant_codec.h). For them
// MakeHeadLayout returns the NOMINAL head - every row at the nominal width,
// no pivots: codes [d_k][d_v * bits / 8], row scales fp16 [d_k] (lo meta),
// column scales fp16 [d_v] at global_offset (head_meta_bytes) - which is also
// exactly the head of an uncalibrated (StateLayout::Identity) layout.
#ifndef STATECACHE_KERNELS_FORMATS_HEAD_LAYOUT_H_
#define STATECACHE_KERNELS_FORMATS_HEAD_LAYOUT_H_

#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/formats/format.h"

namespace statecache {

// Every section and every head starts on this boundary (16-byte vector loads).
inline constexpr int64_t kHeadAlignment = 16;
// Values per quantization group (integer and fp8 codecs).
inline constexpr int kGroupSize = 32;
// Values per NVFP4 block.
inline constexpr int kNvfp4BlockSize = 16;

SC_HD_CONSTEXPR int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// Bytes of codes for one row of d_v values.
SC_HD_CONSTEXPR int64_t RowCodeBytes(RowCodec c, int d_v) {
  switch (c) {
    case RowCodec::kFp32: return 4LL * d_v;
    case RowCodec::kFp16:
    case RowCodec::kBf16: return 2LL * d_v;
    case RowCodec::kAffineU8:
    case RowCodec::kSymI8:
    case RowCodec::kFp8E4m3: return d_v;
    case RowCodec::kAffineU4:
    case RowCodec::kNvfp4: return d_v / 2;
    case RowCodec::kStepQuant: return 0;  // per-row width: StepHeadLayout
  }
  return 0;
}

// Bytes of one metadata unit (a group's or nvfp4 block's parameters); 0 for
// codecs without units (FP, and STEPQuant's per-row scales).
SC_HD_CONSTEXPR int RowMetaUnitBytes(RowCodec c) {
  switch (c) {
    case RowCodec::kAffineU8:
    case RowCodec::kAffineU4: return 4;  // fp16 s, z
    case RowCodec::kSymI8:
    case RowCodec::kFp8E4m3: return 4;   // fp32 s
    case RowCodec::kNvfp4: return 1;     // e4m3 s_b
    default: return 0;
  }
}

// Values of a row that one metadata unit covers.
SC_HD_CONSTEXPR int RowMetaUnitValues(RowCodec c) {
  return c == RowCodec::kNvfp4 ? kNvfp4BlockSize : kGroupSize;
}

// Bytes of per-group metadata for one row of d_v values.
SC_HD_CONSTEXPR int64_t RowMetaBytes(RowCodec c, int d_v) {
  return int64_t{d_v / RowMetaUnitValues(c)} * RowMetaUnitBytes(c);
}

struct PackedHeadLayout {
  int d_k = 0;
  int d_v = 0;
  int k_hi = 0;
  RowCodec hi = RowCodec::kFp32;
  RowCodec lo = RowCodec::kFp32;
  ValueTransform transform = ValueTransform::kNone;

  int64_t hi_offset = 0;        // [k_hi][d_v] hi codec
  int64_t lo_codes_offset = 0;  // [d_k - k_hi][lo_code_row_bytes]
  int64_t lo_meta_offset = 0;   // [d_k - k_hi][lo_meta_row_bytes]
  int64_t global_offset = 0;    // fp32 (nvfp4 only)
  int64_t head_bytes = 0;       // multiple of kHeadAlignment

  int64_t hi_row_bytes = 0;
  int64_t lo_code_row_bytes = 0;
  int64_t lo_meta_row_bytes = 0;
  int64_t lo_code_unit_bytes = 0;  // codes of one unit (group / block), 0: plain rows
  int64_t lo_meta_unit_bytes = 0;  // metadata of one unit, 0: plain rows
  bool has_global_scale = false;
  // STEPQuant only (0 otherwise): nominal code width, and the per-head
  // metadata bytes (fp16 column scales [d_v]) at global_offset.
  int step_bits = 0;
  int64_t head_meta_bytes = 0;

  SC_HD int lo_rows() const { return d_k - k_hi; }

  // Bits per state value counting codes and per-group metadata, as the seeds
  // report them (seed 000 table 3): excludes alignment padding and nvfp4's
  // one fp32 per head.
  double PayloadBitsPerValue() const {
    const double bytes = static_cast<double>(k_hi) * hi_row_bytes +
                         static_cast<double>(lo_rows()) * (lo_code_row_bytes + lo_meta_row_bytes) +
                         static_cast<double>(head_meta_bytes);
    return bytes * 8.0 / (static_cast<double>(d_k) * d_v);
  }
  // Bits per value actually allocated (head_bytes * 8 / values).
  double StorageBitsPerValue() const {
    return static_cast<double>(head_bytes) * 8.0 / (static_cast<double>(d_k) * d_v);
  }
};

// Layout of one head in `spec` for a d_k x d_v state. The spec must already be
// valid (ValidateFormatSpec) and d_v a multiple of 32.
SC_HD PackedHeadLayout MakeHeadLayout(const FormatSpec& spec, int d_k, int d_v) {
  PackedHeadLayout l;
  l.d_k = d_k;
  l.d_v = d_v;
  l.k_hi = IsMixedFormat(spec.format) ? spec.k_hi : 0;
  l.hi = HiRowCodec(spec.format);
  l.lo = LoRowCodec(spec.format);
  l.transform = ValueTransformOf(spec.format);
  l.hi_row_bytes = RowCodeBytes(l.hi, d_v);
  l.lo_code_row_bytes = RowCodeBytes(l.lo, d_v);
  l.lo_meta_row_bytes = RowMetaBytes(l.lo, d_v);
  l.lo_meta_unit_bytes = RowMetaUnitBytes(l.lo);
  l.lo_code_unit_bytes = l.lo_meta_unit_bytes > 0 ? RowCodeBytes(l.lo, RowMetaUnitValues(l.lo)) : 0;
  l.has_global_scale = l.lo == RowCodec::kNvfp4;
  if (l.lo == RowCodec::kStepQuant) {
    l.step_bits = StepQuantNominalBits(spec.format);
    l.lo_code_row_bytes = int64_t{d_v} * l.step_bits / 8;
    l.lo_meta_row_bytes = 2;            // fp16 row scale
    l.head_meta_bytes = 2LL * d_v;      // fp16 column scales
  }
  int64_t off = 0;
  l.hi_offset = off;
  off = AlignUp(off + l.k_hi * l.hi_row_bytes, kHeadAlignment);
  l.lo_codes_offset = off;
  off = AlignUp(off + l.lo_rows() * l.lo_code_row_bytes, kHeadAlignment);
  l.lo_meta_offset = off;
  off = AlignUp(off + l.lo_rows() * l.lo_meta_row_bytes, kHeadAlignment);
  l.global_offset = off;
  if (l.has_global_scale) off = AlignUp(off + 4, kHeadAlignment);
  if (l.head_meta_bytes > 0) off = AlignUp(off + l.head_meta_bytes, kHeadAlignment);
  l.head_bytes = off;
  return l;
}

// Rows of a row block (see the layout above).
inline constexpr int kRowBlock = 8;

// A section stored in row blocks: its offset in the head, rows, bytes per
// row and per unit.
struct RowBlockSection {
  int64_t offset = 0;
  int rows = 0;
  int64_t row_bytes = 0;
  int64_t unit_bytes = 0;
};
SC_HD RowBlockSection LoCodes(const PackedHeadLayout& l) {
  return RowBlockSection{l.lo_codes_offset, l.lo_rows(), l.lo_code_row_bytes, l.lo_code_unit_bytes};
}
SC_HD RowBlockSection LoMeta(const PackedHeadLayout& l) {
  return RowBlockSection{l.lo_meta_offset, l.lo_rows(), l.lo_meta_row_bytes, l.lo_meta_unit_bytes};
}
// The hi rows: units of 32 columns whose runs of 8 are stored in the order
// HiStoredRun gives.
inline constexpr int kHiUnitValues = 32;
SC_HD RowBlockSection HiRows(const PackedHeadLayout& l) {
  return RowBlockSection{l.hi_offset, l.k_hi, l.hi_row_bytes,
                         RowCodeBytes(l.hi, kHiUnitValues)};
}
// Where run q (columns 8q .. 8q + 7) of a hi unit is stored: runs 0, 2, 1,
// 3 in that order (bits swapped), so the two GPU lanes holding a unit's
// halves store one whole 32-byte sector per instruction.
SC_HD int HiStoredRun(int q) { return ((q & 1) << 1) | (q >> 1); }
// Byte offset inside a hi unit of its run q (columns 8q .. 8q + 7).
SC_HD int64_t HiRunByte(const PackedHeadLayout& l, int q) {
  return RowCodeBytes(l.hi, 8 * HiStoredRun(q));
}

// Whether the lo rows are quantized, stored in row blocks (else plain rows).
SC_HD bool HasLoUnits(const PackedHeadLayout& l) { return l.lo_meta_unit_bytes > 0; }

// Rows of the row block that starts at row `first` (a multiple of
// kRowBlock) of a section: kRowBlock, fewer in the last one.
SC_HD int64_t BlockRows(const RowBlockSection& s, int first) {
  if (s.rows % kRowBlock == 0) return kRowBlock;  // folds for fixed layouts
  return s.rows - first < kRowBlock ? s.rows - first : kRowBlock;
}

// Byte offset in the head of unit u of row r (0 <= r < rows) of a section.
SC_HD int64_t UnitOffset(const RowBlockSection& s, int r, int u) {
  const int in_block = static_cast<int>(static_cast<unsigned>(r) % kRowBlock);
  const int first = r - in_block;
  return s.offset + first * s.row_bytes + (u * BlockRows(s, first) + in_block) * s.unit_bytes;
}

// Bytes from unit u to unit u + 1 of row r.
SC_HD int64_t UnitStride(const RowBlockSection& s, int r) {
  return BlockRows(s, r - static_cast<int>(static_cast<unsigned>(r) % kRowBlock)) * s.unit_bytes;
}

// Byte offset in the head of hi row r's run of 8 columns starting at column
// c (a multiple of 8): its unit's place plus the run's (HiRunByte).
SC_HD int64_t HiRunOffset(const PackedHeadLayout& l, int r, int c) {
  return UnitOffset(HiRows(l), r, c / kHiUnitValues) + HiRunByte(l, c / 8 % 4);
}

// Unit u of row r0 + rl, where r0 is a multiple of 16 and rows r0 .. r0 + 15
// exist (two whole blocks: a fixed-shape tile's row step), is at
// PairOffset(s, r0) + InPairOffset(s, rl, u): the second part does not
// depend on r0, so a GPU lane computes it once for all its row steps.
SC_HD int64_t PairOffset(const RowBlockSection& s, int r0) { return s.offset + r0 * s.row_bytes; }
SC_HD int64_t InPairOffset(const RowBlockSection& s, int rl, int u) {
  const int row_block = static_cast<int>(static_cast<unsigned>(rl) / kRowBlock);  // 0 or 1
  const int in_block = static_cast<int>(static_cast<unsigned>(rl) % kRowBlock);
  return row_block * kRowBlock * s.row_bytes + (u * kRowBlock + in_block) * s.unit_bytes;
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_HEAD_LAYOUT_H_
