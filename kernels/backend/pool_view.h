// PoolView: the only pool type shared with kernels - a plain index over one
// arena of fixed-size slots (packed, or at a larger stride: slot_stride).
// Metadata (which slot is free, leases) lives in the pool above; this struct
// only maps (slot, layer, head) to bytes.
//
// Formats with per-head sizes (stepquant-*, StateLayout::head_offsets()):
// head_bytes is the layout's mean head stride, so slot_bytes() and whole-slot
// operations are unchanged, and `head_offsets` - when set - gives each
// (layer, head)'s byte offset inside a slot. Pools above the backend leave it
// null; a backend fills it (from its PreparedModel, in its own memory space)
// before indexing heads of such a layout. nullptr keeps the uniform
// (layer * heads + head) * head_bytes indexing of every other format.
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
  const int64_t* head_offsets = nullptr;  // optional [layers * heads], see above
  // Optional int32 in backend memory read by StreamOps calls (stream_ops.h)
  // when they run: nonzero = the pool is fenced (an attached session that
  // was detached or whose lease expired) and the call writes nothing.
  const int32_t* fence = nullptr;
  // Bytes from one slot's start to the next: 0 (the default) = slot_bytes(),
  // a packed arena. A larger multiple of 16 indexes slots inside bigger
  // records the caller owns (an engine's state pages: LocalPool); the bytes
  // between slot_bytes() and the stride are never read or written.
  int64_t slot_stride = 0;

  SC_HD int64_t slot_bytes() const { return int64_t{layers} * heads * head_bytes; }
  SC_HD int64_t stride() const { return slot_stride != 0 ? slot_stride : slot_bytes(); }
  SC_HD uint8_t* slot(int64_t s) const { return base + s * stride(); }
  SC_HD uint8_t* head(int64_t s, int layer, int h) const {
    const int64_t i = int64_t{layer} * heads + h;
    return slot(s) + (head_offsets != nullptr ? head_offsets[i] : i * head_bytes);
  }
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_BACKEND_POOL_VIEW_H_
