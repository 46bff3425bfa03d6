// Where the StateLayout of a format comes from, for the worker's eval,
// generate and sweep:
//   - IdentityLayouts() (format_sweep.h): no calibration;
//   - CalibratedLayouts(): record FP32 trajectories of the calibration corpus
//     with this model, run the calibration of issue 3 (kernels/calibration)
//     once, and build damp / damp-sr layouts with their default selectors
//     (E*P for damp, the horizon objective for damp-sr), and stepquant-6 /
//     -4 layouts with kernels/stepquant's calibration (default
//     StepQuantOptions) from the same trajectories on first use; other
//     formats get the identity layout (they have no calibrated maps);
//   - LayoutsFromFiles(): checksummed layout files (kernels/layout/layout_file.h),
//     matched to a format by their stored state_format; identity otherwise.
//
//   ASSIGN_OR_RETURN(LayoutProvider p, CalibratedLayouts(*model, calibration_docs, {}));
//   ASSIGN_OR_RETURN(StateLayout l, p(geometry, *ParseFormatSpec("damp:16")));
#ifndef STATECACHE_CLIENT_MODEL_LAYOUT_PROVIDERS_H_
#define STATECACHE_CLIENT_MODEL_LAYOUT_PROVIDERS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/model/corpus.h"
#include "client/model/format_sweep.h"
#include "client/model/model.h"
#include "kernels/calibration/calibrator.h"

namespace statecache {

// True for the formats a calibration gives non-identity layouts: damp,
// damp-sr (mixed) and stepquant-*.
bool HasCalibratedLayout(StateFormat format);

// Calibrates once (FP32 trajectories of `docs`, each document from the zero
// state as one prefill chunk) and returns a provider that builds layouts from
// the statistics on demand. `info` (optional) receives a one-line summary.
absl::StatusOr<LayoutProvider> CalibratedLayouts(const LanguageModel& model,
                                                 const std::vector<Document>& docs,
                                                 const CalibrationOptions& options,
                                                 std::string* info = nullptr);

// Reads every file now (errors: see ReadLayoutFile, plus kInvalidArgument for
// two files of the same format or a geometry other than `geometry`).
absl::StatusOr<LayoutProvider> LayoutsFromFiles(const std::vector<std::string>& paths,
                                                const ModelGeometry& geometry);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_MODEL_LAYOUT_PROVIDERS_H_
