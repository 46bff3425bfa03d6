// Replay of recorded trajectories through a backend in some format, measured
// against the same replay with FP32 states (DESIGN.md section 5):
//   RRMSE = sqrt(sum_t ||Y_hat_t - Y_t||_F^2 / sum_t ||Y_t||_F^2)
// for the states (sampled every `state_sample_every` tokens) and the outputs
// (every token). Each token is one decode step, so the state is requantized
// after every token - what generation sees.
//
//   ASSIGN_OR_RETURN(ReplayResult r, ReplayAgainstFp32(*backend, layout, trajs, {}));
//   printf("%.3e\n", r.total.StateRrmse());
#ifndef STATECACHE_KERNELS_EVAL_REPLAY_H_
#define STATECACHE_KERNELS_EVAL_REPLAY_H_

#include <cmath>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend/backend.h"
#include "kernels/layout/state_layout.h"
#include "kernels/trajectory/trajectory.h"

namespace statecache {

struct ReplayOptions {
  int state_sample_every = 8;
  // Prefill the first `prefill_tokens` tokens in one Prefill call (FP32 within
  // the chunk, one quantization) before decoding the rest.
  int prefill_tokens = 0;
};

// Sums of squared errors and squared references.
struct ErrorSums {
  double state_err2 = 0, state_ref2 = 0, out_err2 = 0, out_ref2 = 0;
  void Add(const ErrorSums& o) {
    state_err2 += o.state_err2;
    state_ref2 += o.state_ref2;
    out_err2 += o.out_err2;
    out_ref2 += o.out_ref2;
  }
  double StateRrmse() const { return state_ref2 > 0 ? std::sqrt(state_err2 / state_ref2) : 0.0; }
  double OutputRrmse() const { return out_ref2 > 0 ? std::sqrt(out_err2 / out_ref2) : 0.0; }
};

struct ReplayResult {
  std::vector<ErrorSums> layers;  // [geometry.layers]
  ErrorSums total;
};

// All trajectories must have the layout's geometry (kInvalidArgument
// otherwise). Uses two one-slot pools per trajectory on `backend`.
absl::StatusOr<ReplayResult> ReplayAgainstFp32(Backend& backend, const StateLayout& layout,
                                               const std::vector<Trajectory>& trajectories,
                                               const ReplayOptions& options);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_EVAL_REPLAY_H_
