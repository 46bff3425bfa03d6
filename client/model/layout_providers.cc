#include "client/model/layout_providers.h"

#include <map>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "client/model/fp32_state_store.h"
#include "client/model/record.h"
#include "kernels/calibration/build_layout.h"
#include "kernels/common/status_macros.h"
#include "kernels/layout/layout_file.h"
#include "kernels/stepquant/calibration.h"

namespace statecache {

bool HasCalibratedLayout(StateFormat format) {
  return IsMixedFormat(format) || IsStepQuantFormat(format);
}

namespace {

// What a calibrated provider keeps: the damp / damp-sr statistics, the FP32
// trajectories (STEPQuant calibrates from them on first use) and the
// STEPQuant layouts built so far, by format name.
struct CalibratedState {
  std::vector<Trajectory> trajectories;
  CalibrationStats stats;
  std::mutex mu;
  std::map<std::string, StateLayout> stepquant;
};

}  // namespace

absl::StatusOr<LayoutProvider> CalibratedLayouts(const LanguageModel& model,
                                                 const std::vector<Document>& docs,
                                                 const CalibrationOptions& options,
                                                 std::string* info) {
  if (docs.empty()) return absl::InvalidArgumentError("calibration corpus: no documents");
  auto state = std::make_shared<CalibratedState>();
  Fp32StateStore store(model.config().Geometry(), model.pool());
  for (const Document& d : docs) {
    ASSIGN_OR_RETURN(Trajectory t, RecordTrajectory(model, &store, d, "model worker"));
    state->trajectories.push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(state->stats,
                   Calibrate(TrajectoriesFromVector(&state->trajectories), options));
  if (info != nullptr) {
    *info = absl::StrCat("calibrated on ", state->stats.trajectories, " documents (",
                         state->stats.domains.size(), " domains, ", state->stats.samples,
                         " state samples per head) in ", state->stats.compute_seconds, " s");
  }
  return LayoutProvider([state](const ModelGeometry& g,
                                const FormatSpec& spec) -> absl::StatusOr<StateLayout> {
    if (!HasCalibratedLayout(spec.format)) return StateLayout::Identity(g, spec);
    if (g != state->stats.geometry) {
      return absl::InvalidArgumentError(
          absl::StrCat("geometry: ", g.DebugString(), " is not the calibrated ",
                       state->stats.geometry.DebugString()));
    }
    if (IsStepQuantFormat(spec.format)) {
      std::lock_guard<std::mutex> lock(state->mu);
      const std::string name = FormatSpecName(spec);
      auto it = state->stepquant.find(name);
      if (it == state->stepquant.end()) {
        ASSIGN_OR_RETURN(StepQuantCalibration cal,
                         CalibrateStepQuant(state->trajectories, spec, StepQuantOptions{}));
        it = state->stepquant.emplace(name, std::move(cal.layout)).first;
      }
      return it->second;
    }
    LayoutRequest request;
    request.format = spec;
    request.selector = DefaultSelector(spec.format);
    ASSIGN_OR_RETURN(BuiltLayout built, BuildLayout(state->stats, request));
    return std::move(built.layout);
  });
}

absl::StatusOr<LayoutProvider> LayoutsFromFiles(const std::vector<std::string>& paths,
                                                const ModelGeometry& geometry) {
  auto by_format = std::make_shared<std::map<std::string, StateLayout>>();
  for (const std::string& p : paths) {
    ASSIGN_OR_RETURN(LayoutFile f, ReadLayoutFile(p, &geometry, nullptr));
    const std::string name = FormatSpecName(f.layout.format());
    if (by_format->count(name) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layouts: two files for format ", name, " (", p, ")"));
    }
    by_format->emplace(name, std::move(f.layout));
  }
  return LayoutProvider([by_format](const ModelGeometry& g,
                                    const FormatSpec& spec) -> absl::StatusOr<StateLayout> {
    auto it = by_format->find(FormatSpecName(spec));
    if (it == by_format->end()) return StateLayout::Identity(g, spec);
    return it->second;
  });
}

}  // namespace statecache
