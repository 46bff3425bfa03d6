#include "server/ops/calibrate.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/calibration/build_layout.h"
#include "kernels/calibration/calibrator.h"
#include "kernels/calibration/scores.h"
#include "kernels/common/status_macros.h"
#include "kernels/formats/format.h"
#include "kernels/io/safetensors.h"
#include "kernels/layout/layout_file.h"
#include "kernels/trajectory/trajectory_file.h"
#include "server/core/log.h"
#include "server/core/model_registry.h"
#include "server/core/proto_convert.h"

namespace statecache {
namespace ops {
namespace {

absl::Status Prefixed(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

// The first message's settings, checked.
struct Settings {
  ModelGeometry geometry;
  FormatSpec spec;
  Selector selector;
};

absl::StatusOr<Settings> ParseSettings(const v1::CalibrateSettings& set) {
  Settings out;
  absl::StatusOr<ModelGeometry> geometry = GeometryFromProto(set.geometry());
  if (!geometry.ok()) return Prefixed(geometry.status(), "settings.");
  out.geometry = *geometry;
  absl::StatusOr<FormatSpec> spec = ParseFormatSpec(set.format());
  if (!spec.ok()) return Prefixed(spec.status(), "settings.format: ");
  if (!IsMixedFormat(spec->format)) {
    return absl::InvalidArgumentError(absl::StrCat("settings.format: ", FormatSpecName(*spec),
                                                   " has no calibrated layout (use damp:K or "
                                                   "damp-sr:K)"));
  }
  out.spec = *spec;
  out.selector = DefaultSelector(spec->format);
  if (!set.selector().empty()) {
    absl::StatusOr<Selector> parsed = ParseSelector(set.selector());
    if (!parsed.ok()) return Prefixed(parsed.status(), "settings.selector: ");
    out.selector = *parsed;
  }
  if (set.sample_every() < 0) {
    return absl::InvalidArgumentError("settings.sample_every: must be >= 0 (0 = 8)");
  }
  if (set.horizon() < 0) {
    return absl::InvalidArgumentError("settings.horizon: must be >= 0 (0 = 256)");
  }
  if (!set.model_id().empty()) {
    absl::Status id_ok = ValidateModelId(set.model_id());
    if (!id_ok.ok()) return Prefixed(id_ok, "settings.");
  }
  return out;
}

// Every trajectory of the stream (bounded bytes), checked against the
// settings' geometry.
absl::StatusOr<std::vector<Trajectory>> ReadTrajectories(
    const std::vector<v1::CalibrateRequest>& msgs, const ModelGeometry& geometry,
    int64_t max_bytes) {
  int64_t total_bytes = 0;
  std::vector<Trajectory> trajectories;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const v1::CalibrateRequest& m = msgs[i];
    const std::string where = absl::StrCat("message ", i, ": ");
    if (i > 0 && m.has_settings()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "settings: only the first message may carry settings"));
    }
    if (m.trajectory_file().empty()) {
      if (!m.domain().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "domain: given without a trajectory_file"));
      }
      continue;
    }
    total_bytes += static_cast<int64_t>(m.trajectory_file().size());
    if (total_bytes > max_bytes) return ExceedsCalibrationBytes(total_bytes, max_bytes);
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(m.trajectory_file());
    if (!file.ok()) return Prefixed(file.status(), absl::StrCat(where, "trajectory_file: "));
    absl::StatusOr<Trajectory> t = TrajectoryFromSafetensors(*file);
    if (!t.ok()) return Prefixed(t.status(), absl::StrCat(where, "trajectory_file: "));
    if (!(t->geometry == geometry)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "trajectory_file: geometry ", t->geometry.DebugString(),
          " differs from settings.geometry ", geometry.DebugString()));
    }
    if (!m.domain().empty()) t->domain = m.domain();
    trajectories.push_back(std::move(*t));
  }
  if (trajectories.empty()) {
    return absl::InvalidArgumentError("trajectory_file: no trajectories in the stream");
  }
  return trajectories;
}

// Per-domain counts and the selection's stability into the response.
void ReportCalibration(const std::vector<Trajectory>& trajectories, const CalibrationStats& st,
                       const CalibrationOptions& opts, const LayoutRequest& lreq,
                       const ModelGeometry& geometry, v1::CalibrateResponse* resp) {
  resp->set_samples(st.samples);
  resp->set_tokens(st.tokens);
  std::map<std::string, v1::CalibrationDomain> domains;
  for (const Trajectory& t : trajectories) {
    v1::CalibrationDomain& d = domains[t.domain];
    d.set_domain(t.domain);
    d.set_trajectories(d.trajectories() + 1);
    d.set_samples(d.samples() + t.tokens / opts.sample_every);
  }
  for (auto& [name, d] : domains) *resp->add_domains() = std::move(d);
  absl::StatusOr<StabilityReport> stab =
      ComputeStability(st, lreq, std::min(16, geometry.d_k));
  if (stab.ok()) {
    v1::CalibrationStability* s = resp->mutable_stability();
    s->set_top(stab->top);
    s->set_common(stab->overall.common);
    s->set_overlap(stab->overall.overlap);
    s->set_spearman(stab->overall.spearman);
    s->set_random_common(stab->random_common);
  }
}

}  // namespace

absl::Status ExceedsCalibrationBytes(int64_t total, int64_t limit) {
  return absl::ResourceExhaustedError(
      absl::StrCat("trajectory_file: the stream carries more than max_calibration_bytes=", limit,
                   " bytes of trajectories (", total, " so far)"));
}

absl::Status Calibrate(const CalibrateInput& in, v1::CalibrateResponse* resp) {
  const std::vector<v1::CalibrateRequest>& msgs = *in.messages;
  if (msgs.empty() || !msgs[0].has_settings()) {
    return absl::InvalidArgumentError("settings: the first message must carry the settings");
  }
  const v1::CalibrateSettings& set = msgs[0].settings();
  ASSIGN_OR_RETURN(Settings settings, ParseSettings(set));
  ASSIGN_OR_RETURN(std::vector<Trajectory> trajectories,
                   ReadTrajectories(msgs, settings.geometry, in.max_calibration_bytes));

  CalibrationOptions opts;
  if (set.sample_every() > 0) opts.sample_every = set.sample_every();
  if (set.horizon() > 0) opts.horizon = set.horizon();
  opts.damp_sr = settings.spec.format == StateFormat::kDampSr;
  opts.prefetch = 0;  // already in memory
  ASSIGN_OR_RETURN(CalibrationStats st,
                   statecache::Calibrate(TrajectoriesFromVector(&trajectories), opts));
  LayoutRequest lreq;
  lreq.format = settings.spec;
  lreq.selector = settings.selector;
  ASSIGN_OR_RETURN(BuiltLayout built, BuildLayout(st, lreq));
  const std::map<std::string, std::string> info = {
      {"selector", SelectorName(settings.selector)},
      {"calibration", absl::StrCat(trajectories.size(), " streamed trajectories")},
      {"samples_per_head", absl::StrCat(st.samples)},
      {"sample_every", absl::StrCat(opts.sample_every)},
      {"horizon", absl::StrCat(opts.horizon)},
      {"tau", absl::StrCat(lreq.tau)},
      {"domains", absl::StrJoin(st.domains, ",")},
      {"tool", "statecached Calibrate"},
  };
  ASSIGN_OR_RETURN(std::string file_bytes, SerializeLayout(built.layout, info, built.scores));

  resp->set_layout_fingerprint(built.layout.Fingerprint());
  resp->set_selector(SelectorName(settings.selector));
  ReportCalibration(trajectories, st, opts, lreq, settings.geometry, resp);
  if (!set.model_id().empty()) {
    v1::RegisterModelRequest reg;
    reg.set_model_id(set.model_id());
    *reg.mutable_geometry() = set.geometry();
    reg.set_format(set.format());
    reg.set_layout_file(file_bytes);
    reg.set_slots(set.slots());
    reg.set_checkpoints(set.checkpoints());
    v1::RegisterModelResponse registered;
    RETURN_IF_ERROR(in.register_model(reg, &registered));
    *resp->mutable_model() = std::move(*registered.mutable_model());
  }
  resp->set_layout_file(std::move(file_bytes));
  LogEvent("model_calibrated",
           absl::StrCat("format=", FormatSpecName(settings.spec),
                        " selector=", SelectorName(settings.selector),
                        " trajectories=", trajectories.size(), " samples=", st.samples,
                        " fingerprint=", absl::Hex(built.layout.Fingerprint(), absl::kZeroPad16),
                        " model=", set.model_id()));
  return absl::OkStatus();
}

}  // namespace ops
}  // namespace statecache
