// Calibration statistics of DAMP / DAMP-SR from recorded trajectories
// (DESIGN.md section 4; seed 000 appendix A.2-A.4; seed 001 section 5.1 and
// appendix A.1-A.3).
//
// Calibrate() replays every trajectory in FP32 (the exact recurrence of
// DESIGN.md section 2, no readout needed), samples the state every
// `sample_every` tokens (after token t with (t + 1) % sample_every == 0) and
// accumulates, per (layer, value head, key channel u):
//   energy_u  = ||S_u||^2                                 (state-energy selector)
//   e_u       = ||Q_lo(S)_u - S_u||^2, Q_lo = int8-hadamard of the row in the
//               H32 domain (damp's lo rows)
//   e_u W_u   with W_u = 1 + sum_{j=1..H} prod_{r=1..j} a_{t+r,u}^2 (seed 001
//               eq. 15). When fewer than H tokens follow a sample, the missing
//               tail continues geometrically with this trajectory's own
//               a_eff,u (documented in docs/BENCHMARKS.md).
//   log a_u   over every token (state write) -> a_eff,u = exp(E[log a_u])
//   q_u^2     over every token (the readout weight of the "epq" selector)
// and, when `damp_sr` is set, the same error terms for every damp-sr value
// scaling / reordering candidate (symmetric int8 of S D^-1 P^T, error
// measured after restoring scale and order; plus the FP16 error of the row,
// which the candidate choice needs for the protected rows).
//
// Candidates (built after a first FP32 pass that collects the domain-balanced
// column RMS r_j of the states of each head): "identity" (no SR), then for
// each alpha in `sr_alphas`: scale c_j = max(r_j, 1e-3 max r)^alpha
// normalized to geometric mean 1, order = value channels by r_j / c_j
// descending (stable). build_layout.h picks one per head by simulated error.
//
// Means are domain balanced (seed 000 eq. 13): per domain the mean over its
// samples, then the plain mean over domains. Trajectories are also split into
// two disjoint halves, alternating within each domain in source order, for
// the stability report.
//
// Work is parallel over (layer, head) on `threads` threads; trajectories are
// streamed one at a time (the next `prefetch` load while the current one
// runs), so memory stays at a few trajectories plus the statistics.
//
//   ASSIGN_OR_RETURN(CalibrationStats st, Calibrate(TrajectoriesFromFiles(paths), {}));
#ifndef STATECACHE_KERNELS_CALIBRATION_CALIBRATOR_H_
#define STATECACHE_KERNELS_CALIBRATION_CALIBRATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/calibration/scores.h"
#include "kernels/layout/geometry.h"
#include "kernels/trajectory/trajectory.h"

namespace statecache {

// A list of trajectories loaded on demand (each may be loaded once per pass).
struct TrajectorySource {
  int count = 0;
  std::function<absl::StatusOr<std::shared_ptr<const Trajectory>>(int index)> load;
};
// Non-owning view of trajectories that outlive the source.
TrajectorySource TrajectoriesFromVector(const std::vector<Trajectory>* trajectories);
// Trajectory files (kernels/trajectory/TRAJECTORY_FORMAT.md).
TrajectorySource TrajectoriesFromFiles(std::vector<std::string> paths);

struct CalibrationProgress {
  int pass = 0;          // 1-based
  int passes = 0;
  int done = 0;          // trajectories finished in this pass
  int total = 0;
};

struct CalibrationOptions {
  int sample_every = 8;
  int horizon = 256;     // H of seed 001 eq. 15
  bool damp_sr = true;   // also collect damp-sr statistics (one extra FP32 pass)
  std::vector<double> sr_alphas = {0.0, 0.5, 0.75, 1.0};
  int threads = 0;       // 0 = hardware concurrency
  int prefetch = 2;      // trajectories loading concurrently ahead of the current one;
                         // 0 = load synchronously (clean timing on few cores)
  std::function<void(const CalibrationProgress&)> progress;  // optional
};

// Which trajectories a statistic averages over.
enum class Split : uint8_t { kAll = 0, kFirstHalf = 1, kSecondHalf = 2 };

// A damp-sr value map of one head: stored column j' holds value channel
// order[j'] divided by scale[order[j']] (state_layout.h convention).
struct SrCandidate {
  std::vector<int32_t> order;  // [d_v]
  std::vector<float> scale;    // [d_v], indexed by value channel
};

// Domain-balanced means of one head for one split. SR vectors are
// [candidate][d_k] flattened.
struct HeadStats {
  std::vector<double> energy, e_had, h_had, log_a;  // [d_k]
  std::vector<double> q2;                           // [d_k] E[q_u^2] over tokens
  std::vector<double> e_sr, h_sr, h16_sr;           // [candidates * d_k]
};

struct CalibrationStats {
  ModelGeometry geometry;
  CalibrationOptions options;
  int trajectories = 0;
  std::vector<std::string> domains;      // sorted
  int64_t samples = 0;                   // state samples per head (all trajectories)
  int64_t tokens = 0;                    // tokens per layer (all trajectories)
  bool has_second_half = false;          // some domain has >= 2 trajectories
  std::vector<std::string> sr_candidate_names;          // [candidates]; empty without damp_sr
  std::vector<std::vector<SrCandidate>> sr_candidates;  // [layers * h_v][candidates]
  std::vector<HeadStats> heads[3];                      // [Split][layers * h_v]
  double compute_seconds = 0;            // wall time minus time blocked on loading
  double load_seconds = 0;               // wall time blocked on loading trajectories
  int threads = 0;

  int num_sr_candidates() const { return static_cast<int>(sr_candidate_names.size()); }
  int64_t HeadIndex(int layer, int head) const { return int64_t{layer} * geometry.h_v + head; }
  // View for ChannelScores: `sr_candidate` < 0 selects damp's int8-hadamard
  // error, otherwise that damp-sr candidate.
  ChannelStatsView View(Split split, int64_t head_index, int sr_candidate) const;
};

// kInvalidArgument for an empty source, a trajectory that fails Validate(),
// geometries that differ between trajectories, or bad options
// (sample_every < 1, horizon < 0, d_v not a multiple of 32).
absl::StatusOr<CalibrationStats> Calibrate(const TrajectorySource& source,
                                           const CalibrationOptions& options);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CALIBRATION_CALIBRATOR_H_
