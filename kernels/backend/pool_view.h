// PoolView: the only pool type shared with kernels - a plain index over one
// arena of fixed-size slots. Metadata (which slot is free, leases) lives in
// the pool above; this struct only maps (slot, layer, head) to bytes.
#ifndef STATECACHE_KERNELS_BACKEND_POOL_VIEW_H_
#define STATECACHE_KERNELS_BACKEND_POOL_VIEW_H_

#include <cstdint>

#include "kernels/common/host_device.h"

namespace statecache {

struct PoolView {
  uint8_t* base = nullptr;  // [num_slots][layers][heads][head_bytes], backend memory
  int64_t num_slots = 0;
  int layers = 0;
  int heads = 0;            // value heads per layer
  int64_t head_bytes = 0;   // multiple of 16

  SC_HD int64_t slot_bytes() const { return int64_t{layers} * heads * head_bytes; }
  SC_HD uint8_t* slot(int64_t s) const { return base + s * slot_bytes(); }
  SC_HD uint8_t* head(int64_t s, int layer, int h) const {
    return slot(s) + (int64_t{layer} * heads + h) * head_bytes;
  }
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_BACKEND_POOL_VIEW_H_
