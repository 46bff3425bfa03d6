#include "kernels/cuda/internal/swizzle.h"

#include <cstdint>

#include "gtest/gtest.h"
#include "kernels/formats/format.h"
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
    const PackedHeadLayout l =
        MakeHeadLayout(FormatSpec{f, IsMixedFormat(f) ? kDefaultKHi : 0}, 128, 128);
    struct Region {
      const char* name;
      int64_t offset, row_bytes;
      int first_row, rows;  // stored rows of the region (r - first_row indexes it)
    };
    const Region regions[] = {
        {"hi", l.hi_offset, l.hi_row_bytes, 0, l.k_hi},
        {"lo codes", l.lo_codes_offset, l.lo_code_row_bytes, l.k_hi, 128 - l.k_hi},
        {"lo meta", l.lo_meta_offset, l.lo_meta_row_bytes, l.k_hi, 128 - l.k_hi},
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
    EXPECT_GT(checked, 0) << FormatName(f);
  }
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

}  // namespace
}  // namespace cuda_internal
}  // namespace statecache
