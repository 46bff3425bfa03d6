// SYNTHETIC trajectories for tests and benchmarks - not model data.
//
// Generates recurrent inputs with the structure the papers describe, so that
// format comparisons are meaningful without a model:
//  - decay: each head (GDN) or key channel (KDA) gets a retention a in (0, 1)
//    drawn from a spectrum with p10 / p50 / p90 = 0.376 / 0.967 / 0.9996
//    (seed 000, appendix C.2); g_t = log(a) plus small per-token jitter.
//  - outlier key rows: `outlier_key_channels` channels per key head get keys
//    `outlier_key_gain` times larger before L2 normalization, so their state
//    rows carry most of the energy.
//  - outlier value columns: `outlier_value_channels` value channels per head
//    scaled by `outlier_value_gain`.
//  - beta = sigmoid(N(0, 1)).
// Every trajectory it returns has source = "synthetic".
#ifndef STATECACHE_KERNELS_TRAJECTORY_SYNTHETIC_H_
#define STATECACHE_KERNELS_TRAJECTORY_SYNTHETIC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/trajectory/trajectory.h"

namespace statecache {

struct SyntheticOptions {
  ModelGeometry geometry;
  int tokens = 2048;
  uint64_t seed = 1;
  std::string domain = "synthetic";
  int outlier_key_channels = 4;
  float outlier_key_gain = 6.0f;
  int outlier_value_channels = 4;
  float outlier_value_gain = 8.0f;
  // The same seed_layout gives the same outlier channels and decay spectrum
  // (a "model"); `seed` varies the tokens (a "document").
  uint64_t seed_layout = 7;
};

// kInvalidArgument for an invalid geometry or tokens < 1.
absl::StatusOr<Trajectory> MakeSyntheticTrajectory(const SyntheticOptions& options);

// Quantile function of the decay spectrum: u in [0, 1] -> retention a.
double SyntheticDecayQuantile(double u);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_TRAJECTORY_SYNTHETIC_H_
