// Trajectory: the recurrent inputs a model worker produced, per layer, for one
// token sequence - what calibration and evaluation replay.
//
// All tensors are FP32, dense, natural channel order, already activated
// (q, k L2-normalized, g = log decay <= 0, beta after sigmoid):
//   q, k  [tokens, h_qk, d_k]
//   v     [tokens, h_v, d_v]
//   g     [tokens, h_v] (GDN) or [tokens, h_v, d_k] (KDA)
//   beta  [tokens, h_v]
// `domain` names the corpus domain (calibration balances over domains) and
// `source` says where the data came from ("synthetic", a model name, ...).
#ifndef STATECACHE_KERNELS_TRAJECTORY_TRAJECTORY_H_
#define STATECACHE_KERNELS_TRAJECTORY_TRAJECTORY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/layout/geometry.h"

namespace statecache {

struct LayerInputs {
  std::vector<float> q, k, v, g, beta;
};

struct Trajectory {
  ModelGeometry geometry;
  int tokens = 0;
  std::string domain;
  std::string source;
  std::vector<LayerInputs> layers;  // [geometry.layers]

  // Sizes of every tensor match geometry and tokens; kInvalidArgument naming
  // the layer and tensor otherwise.
  absl::Status Validate() const;
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_TRAJECTORY_TRAJECTORY_H_
