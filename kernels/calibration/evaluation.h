// Held-out accuracy of formats and calibrated layouts (DESIGN.md section 5;
// seed 000 table 7, figure 5 and table 6): every case is replayed through a
// Backend with ReplayAgainstFp32 (each token a decode step, so the state is
// requantized after every token) and compared with the FP32 replay.
//
// A plan has three sections:
//  - "formats":   every storage format; damp / damp-sr with their default
//                 selector at K_hi = 16 (clamped to d_k)
//  - "selectors": damp and damp-sr at K_hi = 16 under every selector
//                 (matched budget: same bits/value)
//  - "k_sweep":   damp (E*P) and damp-sr (horizon) at K_hi in
//                 {0, 4, 8, 16, 32, 64, 128} (those <= d_k)
//
//   std::vector<EvalCase> plan = StandardEvalPlan(geometry, {"formats"});
//   ASSIGN_OR_RETURN(auto rows, RunEvaluation(*backend, stats, plan, heldout, {}, nullptr));
#ifndef STATECACHE_KERNELS_CALIBRATION_EVALUATION_H_
#define STATECACHE_KERNELS_CALIBRATION_EVALUATION_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend/backend.h"
#include "kernels/calibration/build_layout.h"
#include "kernels/calibration/calibrator.h"
#include "kernels/eval/replay.h"

namespace statecache {

struct EvalCase {
  std::string section;  // "formats", "selectors", "k_sweep", "layout_file"
  FormatSpec format;
  Selector selector = Selector::kErrorPersistence;  // mixed formats only
  // When set, evaluate this layout instead of building one from the stats.
  const StateLayout* layout = nullptr;
  std::string label;  // free text for layout-file cases
};

struct EvalRow {
  EvalCase spec;
  double bits_per_value = 0;  // PackedHeadLayout::PayloadBitsPerValue
  uint64_t fingerprint = 0;
  ReplayResult result;
  double seconds = 0;
};

// The cases of the header for `sections` (any of "formats", "selectors",
// "k_sweep"), skipping formats the geometry cannot hold and damp-sr when
// `with_sr` is false.
std::vector<EvalCase> StandardEvalPlan(const ModelGeometry& geometry,
                                       const std::vector<std::string>& sections, bool with_sr);

// Builds each case's layout from `stats` (or uses case.layout), replays
// `heldout` and collects the RRMSEs. `progress(i, n)` after each case.
absl::StatusOr<std::vector<EvalRow>> RunEvaluation(
    Backend& backend, const CalibrationStats& stats, const std::vector<EvalCase>& plan,
    const std::vector<Trajectory>& heldout, const ReplayOptions& replay,
    const std::function<void(int, int)>& progress);

// "damp:16/ep", "int8-hadamard", or the label of a layout-file case.
std::string CaseName(const EvalCase& c);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CALIBRATION_EVALUATION_H_
