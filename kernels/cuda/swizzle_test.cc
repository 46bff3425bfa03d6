#include "kernels/cuda/internal/swizzle.h"

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/formats/format.h"
#include "kernels/cuda/internal/stage_layout.h"
#include "kernels/formats/head_layout.h"

namespace statecache {
namespace cuda_internal {
namespace {

TEST(Swizzle128, XorsTheChunkIndexWithTheRowIndexModEight) {
  EXPECT_EQ(Swizzle128(0), 0u);
  EXPECT_EQ(Swizzle128(16), 16u);          // row 0: chunks stay
  EXPECT_EQ(Swizzle128(128), 128u + 16);   // row 1, chunk 0 -> chunk 1
  EXPECT_EQ(Swizzle128(7 * 128 + 7 * 16 + 5), 7 * 128 + 5u);  // row 7, chunk 7 -> 0
  EXPECT_EQ(Swizzle128(1024 + 128), 1024 + 128 + 16u);       // period 1024
}

// Every byte the fixed-shape tile code reads through RowRef (LoadTileFixed:
// hi rows, lo codes and lo metadata of each row block r0 = 16 * step of each
// row warp, lane row rl, any offset inside the row) lands where the plain
// swizzle of its offset puts it, for every format's fixed 128 x 128 layout
// and a few 1024-aligned stage bases.
TEST(RowRef, SplitAddressingEqualsThePlainSwizzleForEveryFixedLayout) {
  for (StateFormat f : AllStateFormats()) {
    const PackedHeadLayout l = FixedShapeHeadLayout(f);
    struct Region {
      const char* name;
      int64_t offset, row_bytes;
      int first_row, rows;  // stored rows of the region (r - first_row indexes it)
    };
    const Region regions[] = {
        // Hi rows and quantized lo rows are in row blocks (UnitRef, below).
        {"lo codes", l.lo_codes_offset, HasLoUnits(l) ? 0 : l.lo_code_row_bytes, l.k_hi,
         128 - l.k_hi},
    };
    int64_t checked = 0;
    for (const Region& g : regions) {
      if (g.rows == 0 || g.row_bytes == 0) continue;
      for (uint32_t base : {0u, 1024u, 7u * 1024u}) {
        for (int r0 = 0; r0 < 128; r0 += 16) {
          for (int rl = 0; rl < 16; ++rl) {
            const int r = r0 + rl - g.first_row;  // row index inside the region
            if (r < 0 || r >= g.rows) continue;
            for (int64_t d = 0; d < g.row_bytes; ++d) {
              const SwizzledRef ref = RowRef(base, g.offset, g.row_bytes, r0 - g.first_row, rl) + d;
              const uint32_t want =
                  base + Swizzle128(static_cast<uint32_t>(g.offset + r * g.row_bytes + d));
              ASSERT_EQ(ref.addr(), want) << FormatName(f) << " " << g.name << " row " << r
                                          << " byte " << d << " base " << base;
              ++checked;
            }
          }
        }
      }
    }
    EXPECT_EQ(checked > 0, !HasLoUnits(l)) << FormatName(f);  // the FP formats
  }
}

// Every code and metadata byte of a quantized lo row and every hi row byte
// that LoadTileFixed reads through UnitRef (row steps r0 = 16 * step - k_hi,
// or 0 for the hi rows, lane row rl, the lane's unit u, any byte of it)
// lands where the plain swizzle of UnitOffset puts it, for every format's fixed layout and a few
// 1024-aligned stage bases; and the split holds (the lane's part is
// swizzled once per item).
TEST(UnitRef, SplitAddressingEqualsThePlainSwizzleForEveryFixedLayout) {
  int64_t checked = 0;
  for (StateFormat f : AllStateFormats()) {
    const PackedHeadLayout l = FixedShapeHeadLayout(f);
    if (!HasLoUnits(l)) continue;
    std::vector<std::pair<RowBlockSection, int>> sections = {  // with their units per row
        {LoCodes(l), 128 / RowMetaUnitValues(l.lo)}, {LoMeta(l), 128 / RowMetaUnitValues(l.lo)}};
    if (l.k_hi > 0) sections.push_back({HiRows(l), 128 / kHiUnitValues});
    for (const auto& [sec, units] : sections) {
      for (uint32_t base : {0u, 1024u, 7u * 1024u}) {
        for (int r0 = 0; r0 < sec.rows; r0 += 16) {
          for (int rl = 0; rl < 16; ++rl) {
            for (int u = 0; u < units; ++u) {
              for (int d = 0; d < sec.unit_bytes; ++d) {
                const SwizzledRef ref = UnitRef(base, sec, r0, rl, u, d);
                ASSERT_EQ(ref.block, static_cast<uint32_t>(PairOffset(sec, r0)));
                const uint32_t want =
                    base + Swizzle128(static_cast<uint32_t>(UnitOffset(sec, r0 + rl, u) + d));
                ASSERT_EQ(ref.addr(), want) << FormatName(f) << " row " << r0 + rl << " unit " << u;
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

// The fallback (a region whose row blocks do not align to their span) is
// exact too, just without the split.
TEST(RowRef, UnalignedRegionsFallBackToThePlainSwizzle) {
  for (int64_t offset : {16, 48, 4096 + 80}) {
    for (int64_t row_bytes : {4, 16, 24, 128, 512}) {
      for (int rl = 0; rl < 16; ++rl) {
        const SwizzledRef ref = RowRef(2048, offset, row_bytes, 32, rl) + 8;
        EXPECT_EQ(ref.addr(),
                  2048 + Swizzle128(static_cast<uint32_t>(offset + (32 + rl) * row_bytes + 8)))
            << offset << " " << row_bytes << " " << rl;
      }
    }
  }
}

// StoreStepLines' unit map (N chunks of 16 bytes per lane): every chunk a
// lane pair holds is written to one unit and read back by the lane that
// stores it at its own row and chunk; the reads of one lane are 32 units
// apart (the kernel indexes them that way); and the 8 lanes of each
// shared-memory phase touch 8 different 16-byte bank groups on both sides.
template <int N>
void CheckLineUnits() {
  constexpr int kUnits = 16 * 2 * N;  // 16 rows x 2N chunks
  std::vector<int> written(kUnits, -1);  // unit -> row * 2N + chunk written there
  for (int lane = 0; lane < 32; ++lane) {
    const int rl = lane / 2, cl = lane % 2;
    for (int v = 0; v < N; ++v) {
      const int u = LineWriteUnit<N>(rl, cl, v);
      ASSERT_GE(u, 0);
      ASSERT_LT(u, kUnits);
      ASSERT_EQ(written[u], -1) << "unit written twice, N " << N;
      written[u] = rl * 2 * N + 2 * v + cl;  // lane cl's chunk v is the row's chunk 2v + cl
    }
  }
  std::vector<int> read(kUnits, 0);
  for (int lane = 0; lane < 32; ++lane) {
    for (int j = 0; j < N; ++j) {
      const int u = LineReadUnit<N>(lane, j);
      ASSERT_EQ(u, LineReadUnit<N>(lane, 0) + 32 * j) << "lane " << lane << " j " << j;
      ++read[u];
      EXPECT_EQ(written[u], LineReadRow<N>(lane, j) * 2 * N + LineReadChunk<N>(lane))
          << "N " << N << " lane " << lane << " j " << j;
    }
  }
  for (int u = 0; u < kUnits; ++u) EXPECT_EQ(read[u], 1) << "unit " << u << " N " << N;
  // 16-byte accesses are served 8 lanes at a time; 128 bytes of banks per phase.
  for (int phase = 0; phase < 4; ++phase) {
    for (int v = 0; v < N; ++v) {
      std::set<int> groups;
      for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) {
        groups.insert(LineWriteUnit<N>(lane / 2, lane % 2, v) % 8);
      }
      EXPECT_EQ(groups.size(), 8u) << "write conflict, N " << N << " phase " << phase;
    }
    for (int j = 0; j < N; ++j) {
      std::set<int> groups;
      for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) {
        groups.insert(LineReadUnit<N>(lane, j) % 8);
      }
      EXPECT_EQ(groups.size(), 8u) << "read conflict, N " << N << " phase " << phase;
    }
  }
}

TEST(LineUnits, Fp32StepsStoreEveryChunkOnceWithoutBankConflicts) { CheckLineUnits<4>(); }
TEST(LineUnits, SixteenBitStepsStoreEveryChunkOnceWithoutBankConflicts) { CheckLineUnits<2>(); }

}  // namespace
}  // namespace cuda_internal
}  // namespace statecache
