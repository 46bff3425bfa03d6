// The 128-byte swizzle of staged heads (CU_TENSOR_MAP_SWIZZLE_128B) and the
// split addressing the fixed-shape tile code reads them with. Host and
// device code (SC_HD): swizzle_test checks the split against the plain
// swizzle for every format's fixed layout.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_SWIZZLE_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_SWIZZLE_H_

#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/formats/head_layout.h"

namespace statecache {
namespace cuda_internal {

// The 128-byte swizzle of a byte offset inside a 1024-byte aligned region.
SC_HD uint32_t Swizzle128(uint32_t off) {
  return off ^ (((off >> 7) & 7u) << 4);
}

// A byte in a kSwizzled region: the region's shared address `base` (1024-byte
// aligned) plus `block + in_block`, where block is a multiple of 128 and of
// a power of two that in_block stays below (disjoint bits). Swizzle128 is
// linear over XOR and leaves a block's bits above 7 alone, so the address is
// (base + Swizzle128(in_block)) ^ x + block with x = Swizzle128(block) ^
// block (bits 4-6): a tile's lane position (in_block, the same for all its
// row blocks) is swizzled once per item, and each row block costs at most
// one XOR with a constant plus an immediate offset.
struct SwizzledRef {
  uint32_t base = 0;
  uint32_t block = 0;
  uint32_t in_block = 0;
  SC_HD uint32_t addr() const {
    const uint32_t lane = base + Swizzle128(in_block);
    const uint32_t x = Swizzle128(block) ^ block;
    return (x != 0 ? lane ^ x : lane) + block;
  }
};
// Offsets inside a row (columns, metadata words) stay inside the block.
SC_HD SwizzledRef operator+(SwizzledRef r, int64_t d) {
  r.in_block += static_cast<uint32_t>(d);
  return r;
}

// Offset block + in_block of a region at `base` (in_block < span), split
// for SwizzledRef when span is a power of two >= 128 that divides block (for
// a fixed layout every operand but the lane's in_block is a compile-time
// constant, so the test folds away); otherwise everything goes into
// in_block (exact, without the savings).
SC_HD SwizzledRef SplitRef(uint32_t base, int64_t block, int64_t in_block, int64_t span) {
  if (span >= 128 && (span & (span - 1)) == 0 && block % span == 0) {
    return SwizzledRef{base, static_cast<uint32_t>(block), static_cast<uint32_t>(in_block)};
  }
  return SwizzledRef{base, 0, static_cast<uint32_t>(block + in_block)};
}

// Row `r0 + rl` of a region of rows of row_bytes starting at `offset`
// (r0 a multiple of 16, rl < 16): the row block and the lane's row inside
// it, split with span = 16 * row_bytes.
SC_HD SwizzledRef RowRef(uint32_t base, int64_t offset, int64_t row_bytes, int r0, int rl) {
  return SplitRef(base, offset + r0 * row_bytes, rl * row_bytes, 16 * row_bytes);
}

// Byte `byte` of unit u of row r0 + rl of a section in row blocks
// (head_layout.h: lo codes, lo meta or hi rows) of a packed head at `base`,
// where r0 is a multiple of 16 and rows r0 .. r0 + 15 exist (as every row
// step of a fixed-shape tile): PairOffset / InPairOffset split as RowRef's
// rows, so the lane's part is swizzled once for all row steps.
SC_HD SwizzledRef UnitRef(uint32_t base, const RowBlockSection& s, int r0, int rl, int u, int byte) {
  return SplitRef(base, PairOffset(s, r0), InPairOffset(s, rl, u) + byte,
                  2 * kRowBlock * s.row_bytes);
}

// ---- Whole-line stores of FP tiles (tile_common.cuh, StoreStepLines) ----
// A row step of 16 rows goes through a warp's buffer of 16-byte units: N
// chunks of 16 bytes per lane (FP32: N = 4, FP16 / BF16: N = 2), 2N units
// per row. Lane (rl, cl) (lane = 2 rl + cl) writes its chunk v, the row's
// chunk 2v + cl, to LineWriteUnit; lane L then reads unit LineReadUnit(L, j)
// for j < N, which holds row LineReadRow(L, j), chunk LineReadChunk(L), and
// stores it there. Chunk k of row R sits at unit R * 2N + (k ^
// LineSwizzle(R)): the 8 lanes of a shared-memory phase (one 16-byte access
// each) hit 8 different bank groups on both sides (swizzle_test).
template <int N>
SC_HD int LineSwizzle(int row) {
  static_assert(N == 4 || N == 2, "16 FP32 or 16-bit values per lane");
  return N == 4 ? (row & 3) << 1 : row & 2;  // 4 rows of 2N units span 8 bank groups
}
template <int N>
SC_HD int LineWriteUnit(int rl, int cl, int v) {
  return rl * 2 * N + ((2 * v + cl) ^ LineSwizzle<N>(rl));
}
template <int N>
SC_HD int LineReadChunk(int lane) {
  return lane % (2 * N);
}
template <int N>
SC_HD int LineReadRow(int lane, int j) {
  return lane / (2 * N) + j * (16 / N);  // 16 / N rows per warp access
}
template <int N>
SC_HD int LineReadUnit(int lane, int j) {
  const int row = LineReadRow<N>(lane, j);
  return row * 2 * N + (LineReadChunk<N>(lane) ^ LineSwizzle<N>(row));
}

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_SWIZZLE_H_
