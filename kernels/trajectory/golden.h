// The recorded recurrent inputs in a shipped model's golden.safetensors
// (../shared/models/<model>/golden.safetensors: 64 tokens, per layer
// layer{i}.q / k / v / g / beta) as a Trajectory of the given geometry.
//
//   ASSIGN_OR_RETURN(Trajectory t, GoldenTrajectory("gdn-tiny", geometry));
#ifndef STATECACHE_KERNELS_TRAJECTORY_GOLDEN_H_
#define STATECACHE_KERNELS_TRAJECTORY_GOLDEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "kernels/trajectory/trajectory.h"

namespace statecache {

inline constexpr int kGoldenTokens = 64;

// kNotFound when the shared data is absent; kInvalidArgument when a tensor is
// missing or its size does not match `geometry`.
absl::StatusOr<Trajectory> GoldenTrajectory(const std::string& model,
                                            const ModelGeometry& geometry);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_TRAJECTORY_GOLDEN_H_
