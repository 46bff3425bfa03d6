// SlotHandle: the opaque name of one allocated slot.
//
// `id` is random (64 bits from a CSPRNG-seeded generator), assigned to a
// physical slot once, and never an index; `generation` counts allocations of
// that slot. A handle is valid while its slot is allocated with the same
// generation: after a release (or a release and re-allocation) the old handle
// is stale and is refused with kFailedPrecondition; an id the pool never
// issued is kNotFound.
#ifndef STATECACHE_SERVER_POOL_SLOT_HANDLE_H_
#define STATECACHE_SERVER_POOL_SLOT_HANDLE_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"

namespace statecache {

struct SlotHandle {
  uint64_t id = 0;
  uint32_t generation = 0;

  bool operator==(const SlotHandle& o) const { return id == o.id && generation == o.generation; }
  bool operator!=(const SlotHandle& o) const { return !(*this == o); }
  // "0123456789abcdef/3".
  std::string DebugString() const { return absl::StrFormat("%016x/%u", id, generation); }
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_SLOT_HANDLE_H_
