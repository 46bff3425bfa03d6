// PackedHeadLayout: byte layout of one packed d_k x d_v recurrent state.
//
// A head is laid out as (each section starts 16-byte aligned, and the head
// size is a multiple of kHeadAlignment so consecutive heads stay aligned):
//
//   hi rows   [k_hi][d_v]            hi codec (fp16 for damp / damp-sr)
//   lo codes  [d_k - k_hi][code bytes per row]
//   lo meta   (d_k - k_hi) x (meta bytes per row): one unit per group (s, z /
//             scale) or nvfp4 block, unit-major in blocks of 8 rows (below)
//   global    fp32 global scale (nvfp4 only)
//
// Lo metadata in row blocks: block b holds lo rows 8b .. 8b + n - 1 (n = 8,
// fewer in the last block) as [unit][n], so unit u of row r sits at
//   lo_meta_offset + 8b * meta_bytes_per_row + (u * n + r % 8) * unit bytes
// (LoMetaUnitOffset). The units of one group of 8 rows are contiguous: a
// GPU warp, which owns one group (a 32-column stripe) of its rows, stores
// them as whole 32-byte sectors instead of one 4-byte word per row-major
// 16-byte row (H200, B = 256: DAMP decode -1.5% GDN / -1.1% KDA,
// docs/BENCHMARKS.md). Rows with one unit (STEPQuant's row scales) are plain
// row order. (Packed-format revision 2, server/proto_convert.h.)
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

// Bytes of one metadata unit (a group's or nvfp4 block's parameters).
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
  int64_t lo_meta_unit_bytes = 0;  // one unit of lo metadata (lo_meta_row_bytes if one per row)
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
  l.has_global_scale = l.lo == RowCodec::kNvfp4;
  if (l.lo == RowCodec::kStepQuant) {
    l.step_bits = StepQuantNominalBits(spec.format);
    l.lo_code_row_bytes = int64_t{d_v} * l.step_bits / 8;
    l.lo_meta_row_bytes = 2;            // fp16 row scale
    l.lo_meta_unit_bytes = 2;
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

// Rows of a lo metadata block (see the layout above).
inline constexpr int kMetaRowBlock = 8;

// Rows of the lo metadata block that starts at lo row `first` (a multiple
// of kMetaRowBlock): kMetaRowBlock, fewer in the last one.
SC_HD int64_t LoMetaBlockRows(const PackedHeadLayout& l, int first) {
  if (l.lo_rows() % kMetaRowBlock == 0) return kMetaRowBlock;  // folds for fixed layouts
  return l.lo_rows() - first < kMetaRowBlock ? l.lo_rows() - first : kMetaRowBlock;
}

// Byte offset in the head of metadata unit u of lo row r (0 <= r < lo_rows).
SC_HD int64_t LoMetaUnitOffset(const PackedHeadLayout& l, int r, int u) {
  const int in_block = static_cast<int>(static_cast<unsigned>(r) % kMetaRowBlock);
  const int first = r - in_block;
  return l.lo_meta_offset + first * l.lo_meta_row_bytes +
         (u * LoMetaBlockRows(l, first) + in_block) * l.lo_meta_unit_bytes;
}

// Unit u of lo row r0 + rl, where r0 is a multiple of 16 and rows r0 ..
// r0 + 15 are lo rows (two whole blocks: a fixed-shape tile's row step),
// is at LoMetaPairOffset(l, r0) + LoMetaInPairOffset(l, rl, u): the second
// part does not depend on r0, so a GPU lane computes it once for all its
// row steps.
SC_HD int64_t LoMetaPairOffset(const PackedHeadLayout& l, int r0) {
  return l.lo_meta_offset + r0 * l.lo_meta_row_bytes;
}
SC_HD int64_t LoMetaInPairOffset(const PackedHeadLayout& l, int rl, int u) {
  const int row_block = static_cast<int>(static_cast<unsigned>(rl) / kMetaRowBlock);  // 0 or 1
  const int in_block = static_cast<int>(static_cast<unsigned>(rl) % kMetaRowBlock);
  return row_block * kMetaRowBlock * l.lo_meta_row_bytes +
         (u * kMetaRowBlock + in_block) * l.lo_meta_unit_bytes;
}

// Bytes from unit u to unit u + 1 of lo row r.
SC_HD int64_t LoMetaUnitStride(const PackedHeadLayout& l, int r) {
  return LoMetaBlockRows(l, r - static_cast<int>(static_cast<unsigned>(r) % kMetaRowBlock)) *
         l.lo_meta_unit_bytes;
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_HEAD_LAYOUT_H_
