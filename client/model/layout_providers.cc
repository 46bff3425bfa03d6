#include "client/model/layout_providers.h"

#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "client/model/fp32_state_store.h"
#include "client/model/record.h"
#include "kernels/calibration/build_layout.h"
#include "kernels/common/status_macros.h"
#include "kernels/layout/layout_file.h"

namespace statecache {

absl::StatusOr<LayoutProvider> CalibratedLayouts(const LanguageModel& model,
                                                 const std::vector<Document>& docs,
                                                 const CalibrationOptions& options,
                                                 std::string* info) {
  if (docs.empty()) return absl::InvalidArgumentError("calibration corpus: no documents");
  auto trajectories = std::make_shared<std::vector<Trajectory>>();
  Fp32StateStore store(model.config().Geometry(), model.pool());
  for (const Document& d : docs) {
    ASSIGN_OR_RETURN(Trajectory t, RecordTrajectory(model, &store, d, "model worker"));
    trajectories->push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(CalibrationStats stats,
                   Calibrate(TrajectoriesFromVector(trajectories.get()), options));
  if (info != nullptr) {
    *info = absl::StrCat("calibrated on ", stats.trajectories, " documents (",
                         stats.domains.size(), " domains, ", stats.samples,
                         " state samples per head) in ", stats.compute_seconds, " s");
  }
  auto shared_stats = std::make_shared<CalibrationStats>(std::move(stats));
  return LayoutProvider([shared_stats](const ModelGeometry& g,
                                       const FormatSpec& spec) -> absl::StatusOr<StateLayout> {
    if (!IsMixedFormat(spec.format)) return StateLayout::Identity(g, spec);
    if (g != shared_stats->geometry) {
      return absl::InvalidArgumentError(
          absl::StrCat("geometry: ", g.DebugString(), " is not the calibrated ",
                       shared_stats->geometry.DebugString()));
    }
    LayoutRequest request;
    request.format = spec;
    request.selector = DefaultSelector(spec.format);
    ASSIGN_OR_RETURN(BuiltLayout built, BuildLayout(*shared_stats, request));
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
