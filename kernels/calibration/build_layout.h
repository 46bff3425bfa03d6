// From calibration statistics to a StateLayout (seed 000 algorithm 1; seed
// 001 appendix A.2-A.3), and the split-half stability report (seed 000
// appendix C.1, table 5).
//
// damp:    scores = ChannelScores(selector) with E from int8-hadamard;
//          protected set = TopK(scores, k_hi); key_perm = stable partition.
// damp-sr: for every value scaling / reordering candidate c of the head
//          (calibrator.h), H_c = TopK(scores_c, k_hi) and
//            J(c) = sum_{u not in H_c} E[e8_{c,u} W_u] + sum_{u in H_c} E[e16_{c,u} W_u]
//          (seed 001's selection objective with the horizon weights W);
//          the candidate with the smallest J (ties: lower index, so
//          "identity" wins a tie) gives value_order / value_scale and H_c.
// Other formats have no calibrated maps: the identity layout.
//
//   ASSIGN_OR_RETURN(BuiltLayout b, BuildLayout(stats, {spec, Selector::kErrorPersistence}));
#ifndef STATECACHE_KERNELS_CALIBRATION_BUILD_LAYOUT_H_
#define STATECACHE_KERNELS_CALIBRATION_BUILD_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/calibration/calibrator.h"
#include "kernels/calibration/scores.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

struct LayoutRequest {
  FormatSpec format;
  Selector selector = Selector::kErrorPersistence;
  double tau = 1e-4;
  uint64_t random_seed = 1;  // combined with (layer, head) for the random selector
  Split split = Split::kAll;
};

// The default selector of a format: E*P for damp (seed 000), horizon for
// damp-sr (seed 001).
Selector DefaultSelector(StateFormat format);

struct BuiltLayout {
  StateLayout layout;
  std::vector<float> scores;         // [layers * h_v * d_k], natural channel order
  std::vector<int32_t> sr_choice;    // [layers * h_v] candidate index (damp-sr), else empty
  std::vector<int32_t> sr_choice_count;  // [candidates]: heads that chose each
};

// kFailedPrecondition for damp-sr when the statistics were collected without
// damp_sr; kInvalidArgument for an invalid format for the geometry.
absl::StatusOr<BuiltLayout> BuildLayout(const CalibrationStats& stats, const LayoutRequest& request);

// Scores of every channel of head `head_index` under `request` (for damp-sr
// with candidate `sr_candidate`).
std::vector<double> HeadScores(const CalibrationStats& stats, const LayoutRequest& request,
                               int64_t head_index, int sr_candidate);

struct StabilityRow {
  int layer = -1;          // -1 = all layers
  double common = 0;       // mean |H_1 ∩ H_2|
  double overlap = 0;      // mean |H_1 ∩ H_2| / top
  double spearman = 0;     // mean Spearman of the full score vectors
};

struct StabilityReport {
  int top = 16;
  double random_common = 0;  // top^2 / d_k, expected by chance
  std::vector<StabilityRow> layers;
  StabilityRow overall;
};

// Scores from the two disjoint halves (Split::kFirstHalf / kSecondHalf) of
// the calibration set under the same format and selector (damp-sr uses the
// candidate chosen on all data for both halves). kFailedPrecondition when no
// domain has two trajectories.
absl::StatusOr<StabilityReport> ComputeStability(const CalibrationStats& stats,
                                                 const LayoutRequest& request, int top);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CALIBRATION_BUILD_LAYOUT_H_
