#include "kernels/calibration/evaluation.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace statecache {

std::string CaseName(const EvalCase& c) {
  if (!c.label.empty()) return c.label;
  if (IsMixedFormat(c.format.format)) {
    return absl::StrCat(FormatSpecName(c.format), "/", SelectorName(c.selector));
  }
  return FormatSpecName(c.format);
}

std::vector<EvalCase> StandardEvalPlan(const ModelGeometry& geometry,
                                       const std::vector<std::string>& sections, bool with_sr) {
  std::vector<EvalCase> plan;
  const int k16 = std::min(kDefaultKHi, geometry.d_k);
  auto wanted = [&](const char* s) {
    return std::find(sections.begin(), sections.end(), s) != sections.end();
  };
  std::vector<StateFormat> mixed = {StateFormat::kDamp};
  if (with_sr) mixed.push_back(StateFormat::kDampSr);
  if (wanted("formats")) {
    for (StateFormat f : AllStateFormats()) {
      if (f == StateFormat::kDampSr && !with_sr) continue;
      EvalCase c;
      c.section = "formats";
      c.format = FormatSpec{f, IsMixedFormat(f) ? k16 : 0};
      c.selector = DefaultSelector(f);
      plan.push_back(c);
    }
  }
  if (wanted("selectors")) {
    for (StateFormat f : mixed) {
      for (Selector s : AllSelectors()) {
        plan.push_back(EvalCase{"selectors", FormatSpec{f, k16}, s, nullptr, ""});
      }
    }
  }
  if (wanted("k_sweep")) {
    for (StateFormat f : mixed) {
      for (int k : {0, 4, 8, 16, 32, 64, 128}) {
        if (k > geometry.d_k) continue;
        plan.push_back(EvalCase{"k_sweep", FormatSpec{f, k}, DefaultSelector(f), nullptr, ""});
      }
    }
  }
  return plan;
}

absl::StatusOr<std::vector<EvalRow>> RunEvaluation(
    Backend& backend, const CalibrationStats& stats, const std::vector<EvalCase>& plan,
    const std::vector<Trajectory>& heldout, const ReplayOptions& replay,
    const std::function<void(int, int)>& progress) {
  std::vector<EvalRow> rows;
  for (size_t i = 0; i < plan.size(); ++i) {
    const EvalCase& c = plan[i];
    const auto start = std::chrono::steady_clock::now();
    EvalRow row;
    row.spec = c;
    const StateLayout* layout = c.layout;
    absl::StatusOr<BuiltLayout> built = absl::UnknownError("unset");
    if (layout == nullptr) {
      LayoutRequest req;
      req.format = c.format;
      req.selector = c.selector;
      built = BuildLayout(stats, req);
      if (!built.ok()) {
        return absl::Status(built.status().code(),
                            absl::StrCat(CaseName(c), ": ", built.status().message()));
      }
      layout = &built->layout;
    }
    row.bits_per_value = layout->head_layout().PayloadBitsPerValue();
    row.fingerprint = layout->Fingerprint();
    ASSIGN_OR_RETURN(row.result, ReplayAgainstFp32(backend, *layout, heldout, replay));
    row.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rows.push_back(std::move(row));
    if (progress) progress(static_cast<int>(i) + 1, static_cast<int>(plan.size()));
  }
  return rows;
}

}  // namespace statecache
