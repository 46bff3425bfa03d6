// The value-axis map M of a format (DESIGN.md section 7), applied to vectors.
//
// The packed head stores S M. Because the recurrence is linear along the value
// axis it runs on the stored rows directly when v enters as v' = M^T v and the
// readout leaves as o = M^-T o'. The same two maps convert state rows when
// packing (row' = M^T row, as a column) and unpacking (row = M^-T row'):
//  - kHadamard32: M = blockdiag(H32), symmetric and orthogonal: both maps are H32.
//  - kScaleReorder (damp-sr): M = D^-1 P^T with stored column j' holding value
//    channel order[j'] scaled by 1 / scale[order[j']].
//  - kNone: identity.
#ifndef STATECACHE_KERNELS_FORMATS_VALUE_TRANSFORM_H_
#define STATECACHE_KERNELS_FORMATS_VALUE_TRANSFORM_H_

#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/formats/format.h"
#include "kernels/formats/hadamard.h"

namespace statecache {

// The maps of one (layer, head). order/scale are [d_v] for damp-sr, else null.
struct ValueMap {
  ValueTransform transform = ValueTransform::kNone;
  const int32_t* order = nullptr;
  const float* scale = nullptr;
};

// out = M^T x (x in value order, out in stored order). out != x.
SC_HD void ValueToStored(const ValueMap& m, const float* x, float* out, int d_v) {
  switch (m.transform) {
    case ValueTransform::kNone:
      for (int j = 0; j < d_v; ++j) out[j] = x[j];
      return;
    case ValueTransform::kHadamard32:
      for (int j = 0; j < d_v; ++j) out[j] = x[j];
      BlockHadamard32(out, d_v);
      return;
    case ValueTransform::kScaleReorder:
      for (int j = 0; j < d_v; ++j) out[j] = x[m.order[j]] / m.scale[m.order[j]];
      return;
  }
}

// out = M^-T x (x in stored order, out in value order). out != x.
SC_HD void ValueFromStored(const ValueMap& m, const float* x, float* out, int d_v) {
  switch (m.transform) {
    case ValueTransform::kNone:
      for (int j = 0; j < d_v; ++j) out[j] = x[j];
      return;
    case ValueTransform::kHadamard32:
      for (int j = 0; j < d_v; ++j) out[j] = x[j];
      BlockHadamard32(out, d_v);
      return;
    case ValueTransform::kScaleReorder:
      for (int j = 0; j < d_v; ++j) out[m.order[j]] = x[j] * m.scale[m.order[j]];
      return;
  }
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_VALUE_TRANSFORM_H_
