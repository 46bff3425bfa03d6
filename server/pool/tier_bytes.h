// TierBytes: bytes of packed states split by storage tier.
//
// A packed head (kernels/formats/head_layout.h) is made of hi-precision rows
// (the fp16 rows of damp / damp-sr), low-precision codes (int8 / int4 / fp8
// codes, or all fp32 / fp16 / bf16 rows of the uniform formats), quantization
// metadata (group scales and zero points, nvfp4's global scale) and alignment
// padding. Stats and metrics report memory per tier with these four numbers.
//
//   TierBytes head = TierBytes::OfHead(layout.head_layout());
//   TierBytes used = head.Times(layout.geometry().HeadsPerSlot() * live_slots);
#ifndef STATECACHE_SERVER_POOL_TIER_BYTES_H_
#define STATECACHE_SERVER_POOL_TIER_BYTES_H_

#include <cstdint>

#include "kernels/formats/head_layout.h"

namespace statecache {

struct TierBytes {
  int64_t hi_rows = 0;   // k_hi * hi_row_bytes
  int64_t lo_codes = 0;  // (d_k - k_hi) * lo_code_row_bytes
  int64_t metadata = 0;  // (d_k - k_hi) * lo_meta_row_bytes (+ 4 for nvfp4)
  int64_t padding = 0;   // head_bytes - the above

  int64_t total() const { return hi_rows + lo_codes + metadata + padding; }

  // Split of one packed head; total() == head.head_bytes.
  static TierBytes OfHead(const PackedHeadLayout& head) {
    TierBytes t;
    t.hi_rows = int64_t{head.k_hi} * head.hi_row_bytes;
    t.lo_codes = int64_t{head.lo_rows()} * head.lo_code_row_bytes;
    t.metadata = int64_t{head.lo_rows()} * head.lo_meta_row_bytes + (head.has_global_scale ? 4 : 0);
    t.padding = head.head_bytes - t.hi_rows - t.lo_codes - t.metadata;
    return t;
  }

  TierBytes Times(int64_t n) const {
    return TierBytes{hi_rows * n, lo_codes * n, metadata * n, padding * n};
  }
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_TIER_BYTES_H_
