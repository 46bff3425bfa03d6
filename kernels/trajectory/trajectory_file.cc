#include "kernels/trajectory/trajectory_file.h"

#include <cmath>
#include <cstdio>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

struct TensorSpec {
  const char* name;
  std::vector<float> LayerInputs::*field;
};

constexpr TensorSpec kTensors[] = {
    {"q", &LayerInputs::q}, {"k", &LayerInputs::k},       {"v", &LayerInputs::v},
    {"g", &LayerInputs::g}, {"beta", &LayerInputs::beta},
};

std::vector<int64_t> ShapeOf(const ModelGeometry& geo, int tokens, absl::string_view name) {
  const int64_t t = tokens;
  if (name == "q" || name == "k") return {t, geo.h_qk, geo.d_k};
  if (name == "v") return {t, geo.h_v, geo.d_v};
  if (name == "g") {
    return geo.arch == Arch::kKda ? std::vector<int64_t>{t, geo.h_v, geo.d_k}
                                  : std::vector<int64_t>{t, geo.h_v};
  }
  return {t, geo.h_v};  // beta
}

absl::StatusOr<std::string> RequireMeta(const SafetensorsFile& file, const char* key) {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata: missing \"", key, "\" (see kernels/trajectory/TRAJECTORY_FORMAT.md)"));
  }
  return it->second;
}

absl::StatusOr<int> RequireInt(const SafetensorsFile& file, const char* key) {
  ASSIGN_OR_RETURN(std::string text, RequireMeta(file, key));
  int v = 0;
  if (!absl::SimpleAtoi(text, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata: \"", key, "\" = \"", text, "\" is not an integer"));
  }
  return v;
}

// The writer holding every tensor and metadata entry of `traj`.
absl::Status FillWriter(const Trajectory& traj, SafetensorsWriter* w) {
  RETURN_IF_ERROR(traj.Validate());
  const ModelGeometry& geo = traj.geometry;
  w->SetMetadata("format", kTrajectoryFormatName);
  w->SetMetadata("version", absl::StrCat(kTrajectoryFormatVersion));
  w->SetMetadata("arch", ArchName(geo.arch));
  w->SetMetadata("layers", absl::StrCat(geo.layers));
  w->SetMetadata("h_qk", absl::StrCat(geo.h_qk));
  w->SetMetadata("h_v", absl::StrCat(geo.h_v));
  w->SetMetadata("d_k", absl::StrCat(geo.d_k));
  w->SetMetadata("d_v", absl::StrCat(geo.d_v));
  w->SetMetadata("scale", absl::StrFormat("%.9g", geo.scale));
  w->SetMetadata("tokens", absl::StrCat(traj.tokens));
  w->SetMetadata("domain", traj.domain);
  w->SetMetadata("source", traj.source);
  for (int l = 0; l < geo.layers; ++l) {
    for (const TensorSpec& t : kTensors) {
      RETURN_IF_ERROR(w->AddFloat32(absl::StrCat("layer", l, ".", t.name),
                                    ShapeOf(geo, traj.tokens, t.name), traj.layers[l].*t.field));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SerializeTrajectory(const Trajectory& traj) {
  SafetensorsWriter w;
  RETURN_IF_ERROR(FillWriter(traj, &w));
  return w.Serialize();
}

absl::Status WriteTrajectoryFile(const Trajectory& traj, const std::string& path) {
  SafetensorsWriter w;
  RETURN_IF_ERROR(FillWriter(traj, &w));
  return w.WriteFile(path);
}

absl::StatusOr<Trajectory> TrajectoryFromSafetensors(const SafetensorsFile& file) {
  ASSIGN_OR_RETURN(std::string format, RequireMeta(file, "format"));
  if (format != kTrajectoryFormatName) {
    return absl::InvalidArgumentError(absl::StrCat("metadata: \"format\" = \"", format,
                                                   "\", want \"", kTrajectoryFormatName, "\""));
  }
  ASSIGN_OR_RETURN(int version, RequireInt(file, "version"));
  if (version != kTrajectoryFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("metadata: \"version\" = ", version,
                                                   " is not supported (this reader reads ",
                                                   kTrajectoryFormatVersion, ")"));
  }
  Trajectory traj;
  ModelGeometry& geo = traj.geometry;
  ASSIGN_OR_RETURN(std::string arch, RequireMeta(file, "arch"));
  ASSIGN_OR_RETURN(geo.arch, ParseArch(arch));
  ASSIGN_OR_RETURN(geo.layers, RequireInt(file, "layers"));
  ASSIGN_OR_RETURN(geo.h_qk, RequireInt(file, "h_qk"));
  ASSIGN_OR_RETURN(geo.h_v, RequireInt(file, "h_v"));
  ASSIGN_OR_RETURN(geo.d_k, RequireInt(file, "d_k"));
  ASSIGN_OR_RETURN(geo.d_v, RequireInt(file, "d_v"));
  ASSIGN_OR_RETURN(std::string scale, RequireMeta(file, "scale"));
  if (!absl::SimpleAtof(scale, &geo.scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata: \"scale\" = \"", scale, "\" is not a number"));
  }
  RETURN_IF_ERROR(geo.Validate());
  ASSIGN_OR_RETURN(traj.tokens, RequireInt(file, "tokens"));
  if (traj.tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("metadata: \"tokens\" = ", traj.tokens, " < 1"));
  }
  ASSIGN_OR_RETURN(traj.domain, RequireMeta(file, "domain"));
  if (traj.domain.empty()) return absl::InvalidArgumentError("metadata: \"domain\" is empty");
  ASSIGN_OR_RETURN(traj.source, RequireMeta(file, "source"));

  std::set<std::string> expected;
  traj.layers.resize(geo.layers);
  for (int l = 0; l < geo.layers; ++l) {
    for (const TensorSpec& t : kTensors) {
      const std::string name = absl::StrCat("layer", l, ".", t.name);
      expected.insert(name);
      if (!file.contains(name)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": missing"));
      }
      ASSIGN_OR_RETURN(std::vector<float> values,
                       file.ToFloat32(name, ShapeOf(geo, traj.tokens, t.name)));
      const bool is_g = t.field == &LayerInputs::g, is_beta = t.field == &LayerInputs::beta;
      for (size_t i = 0; i < values.size(); ++i) {
        const float x = values[i];
        const bool bad = !std::isfinite(x) || (is_g && x > 0.0f) ||
                         (is_beta && (x < 0.0f || x > 1.0f));
        if (bad) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor ", name, ": element ", i, " = ", x,
              is_g ? " (g is a log decay: finite and <= 0)"
                   : is_beta ? " (beta must be in [0, 1])" : " (not finite)"));
        }
      }
      traj.layers[l].*t.field = std::move(values);
    }
  }
  for (const std::string& name : file.names()) {
    if (expected.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", name, ": unexpected (file has layers=", geo.layers, ")"));
    }
  }
  RETURN_IF_ERROR(traj.Validate());
  return traj;
}

absl::StatusOr<Trajectory> ReadTrajectoryFile(const std::string& path) {
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  absl::StatusOr<Trajectory> t = TrajectoryFromSafetensors(file);
  if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  return t;
}

}  // namespace statecache
