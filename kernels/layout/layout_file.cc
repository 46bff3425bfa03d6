#include "kernels/layout/layout_file.h"

#include <cstdint>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/common/status_macros.h"
#include "kernels/io/safetensors.h"

namespace statecache {
namespace {

const std::set<std::string>& ReservedKeys() {
  static const std::set<std::string> keys = {
      "format", "version", "arch", "layers", "h_qk", "h_v", "d_k", "d_v", "scale",
      "state_format", "fingerprint", "checksum"};
  return keys;
}

class Fnv1a64 {
 public:
  void Add(absl::string_view s) {
    for (unsigned char c : s) h_ = (h_ ^ c) * 1099511628211ULL;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 1469598103934665603ULL;
};

// The checksum of the header comment over a parsed file.
std::string Checksum(const SafetensorsFile& file) {
  Fnv1a64 h;
  for (const auto& [k, v] : file.metadata()) {  // std::map: sorted
    if (k == "checksum") continue;
    h.Add(k);
    h.Add("=");
    h.Add(v);
    h.Add("\n");
  }
  for (const std::string& name : file.names()) {  // sorted
    const TensorView t = file.tensor(name).value();
    h.Add(name);
    h.Add("\n");
    h.Add(SafetensorsDtypeName(t.dtype));
    h.Add("\n");
    for (int64_t d : t.shape) h.Add(absl::StrCat(d, ","));
    h.Add("\n");
    h.Add(t.bytes);
  }
  return absl::StrFormat("fnv1a64:%016x", h.value());
}

absl::StatusOr<std::string> Meta(const SafetensorsFile& f, const char* key) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) {
    return absl::InvalidArgumentError(absl::StrCat("layout file: metadata \"", key, "\" missing"));
  }
  return it->second;
}

absl::StatusOr<int> MetaInt(const SafetensorsFile& f, const char* key) {
  ASSIGN_OR_RETURN(std::string s, Meta(f, key));
  int v = 0;
  if (!absl::SimpleAtoi(s, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout file: metadata \"", key, "\" = \"", s, "\" is not an integer"));
  }
  return v;
}

absl::StatusOr<std::vector<int32_t>> IntTensor(const SafetensorsFile& f, const std::string& name,
                                               const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(TensorView t, f.tensor(name));
  if (t.dtype != SafetensorsDtype::kI32 || t.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("layout file: tensor ", name, " is ",
                                                   t.DebugString(), ", want I32 of layers x h_v x ",
                                                   shape.back()));
  }
  std::vector<int32_t> out(t.num_elements());
  std::memcpy(out.data(), t.bytes.data(), out.size() * 4);
  return out;
}

absl::StatusOr<std::vector<float>> FloatTensor(const SafetensorsFile& f, const std::string& name,
                                               const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(TensorView t, f.tensor(name));
  if (t.dtype != SafetensorsDtype::kF32 || t.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("layout file: tensor ", name, " is ",
                                                   t.DebugString(), ", want F32 of layers x h_v x ",
                                                   shape.back()));
  }
  std::vector<float> out(t.num_elements());
  std::memcpy(out.data(), t.bytes.data(), out.size() * 4);
  return out;
}

absl::StatusOr<LayoutFile> FromFile(const SafetensorsFile& f, const ModelGeometry* want_geometry,
                                    const FormatSpec* want_format) {
  ASSIGN_OR_RETURN(std::string format, Meta(f, "format"));
  if (format != kLayoutFormatName) {
    return absl::InvalidArgumentError(absl::StrCat("layout file: metadata \"format\" = \"", format,
                                                   "\", want \"", kLayoutFormatName, "\""));
  }
  ASSIGN_OR_RETURN(std::string stored_checksum, Meta(f, "checksum"));
  const std::string checksum = Checksum(f);
  if (stored_checksum != checksum) {
    return absl::DataLossError(absl::StrCat("layout file: checksum mismatch (stored ",
                                            stored_checksum, ", computed ", checksum,
                                            "): the file is corrupted"));
  }
  ASSIGN_OR_RETURN(int version, MetaInt(f, "version"));
  if (version != kLayoutFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("layout file: version ", version,
                                                   " is not supported (this build reads ",
                                                   kLayoutFormatVersion, ")"));
  }
  ModelGeometry geo;
  ASSIGN_OR_RETURN(std::string arch, Meta(f, "arch"));
  ASSIGN_OR_RETURN(geo.arch, ParseArch(arch));
  ASSIGN_OR_RETURN(geo.layers, MetaInt(f, "layers"));
  ASSIGN_OR_RETURN(geo.h_qk, MetaInt(f, "h_qk"));
  ASSIGN_OR_RETURN(geo.h_v, MetaInt(f, "h_v"));
  ASSIGN_OR_RETURN(geo.d_k, MetaInt(f, "d_k"));
  ASSIGN_OR_RETURN(geo.d_v, MetaInt(f, "d_v"));
  ASSIGN_OR_RETURN(std::string scale, Meta(f, "scale"));
  if (!absl::SimpleAtof(scale, &geo.scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout file: metadata \"scale\" = \"", scale, "\" is not a number"));
  }
  RETURN_IF_ERROR(geo.Validate());
  ASSIGN_OR_RETURN(std::string spec_text, Meta(f, "state_format"));
  ASSIGN_OR_RETURN(FormatSpec spec, ParseFormatSpec(spec_text));
  if (want_geometry != nullptr && geo != *want_geometry) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout file: geometry ", geo.DebugString(), " scale=", geo.scale,
        " does not match the model's ", want_geometry->DebugString(),
        " scale=", want_geometry->scale, " (a layout is calibrated for one model)"));
  }
  if (want_format != nullptr && spec != *want_format) {
    return absl::InvalidArgumentError(absl::StrCat("layout file: state_format ",
                                                   FormatSpecName(spec), " does not match ",
                                                   FormatSpecName(*want_format)));
  }
  const std::vector<int64_t> k_shape = {geo.layers, geo.h_v, geo.d_k};
  const std::vector<int64_t> v_shape = {geo.layers, geo.h_v, geo.d_v};
  const bool sr = spec.format == StateFormat::kDampSr;
  std::set<std::string> expected = {"key_perm"};
  ASSIGN_OR_RETURN(std::vector<int32_t> key_perm, IntTensor(f, "key_perm", k_shape));
  std::vector<int32_t> value_order;
  std::vector<float> value_scale;
  if (sr) {
    expected.insert({"value_order", "value_scale"});
    ASSIGN_OR_RETURN(value_order, IntTensor(f, "value_order", v_shape));
    ASSIGN_OR_RETURN(value_scale, FloatTensor(f, "value_scale", v_shape));
  }
  const bool step = IsStepQuantFormat(spec.format);
  std::vector<int32_t> row_bits32;
  std::vector<float> row_impact;
  if (step) {
    expected.insert({"row_bits", "row_impact"});
    ASSIGN_OR_RETURN(row_bits32, IntTensor(f, "row_bits", k_shape));
    ASSIGN_OR_RETURN(row_impact, FloatTensor(f, "row_impact", k_shape));
  }
  std::vector<float> scores;
  if (f.contains("scores")) {
    expected.insert("scores");
    ASSIGN_OR_RETURN(scores, FloatTensor(f, "scores", k_shape));
  }
  for (const std::string& name : f.names()) {
    if (expected.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("layout file: unexpected tensor ", name,
                                                     " for state_format ", FormatSpecName(spec)));
    }
  }
  absl::StatusOr<StateLayout> created = absl::UnknownError("unset");
  if (step) {
    std::vector<int8_t> row_bits(row_bits32.size());
    for (size_t i = 0; i < row_bits32.size(); ++i) {
      const int32_t b = row_bits32[i];
      row_bits[i] = static_cast<int8_t>(b >= -128 && b <= 127 ? b : 0);  // 0 is rejected
    }
    created = StateLayout::CreateStepQuant(geo, spec, std::move(key_perm), std::move(row_bits),
                                           std::move(row_impact));
  } else {
    created = StateLayout::Create(geo, spec, std::move(key_perm), std::move(value_order),
                                  std::move(value_scale));
  }
  ASSIGN_OR_RETURN(StateLayout layout, std::move(created));
  LayoutFile out{std::move(layout), {}, std::move(scores)};
  ASSIGN_OR_RETURN(std::string fp, Meta(f, "fingerprint"));
  const std::string want_fp = absl::StrFormat("%016x", out.layout.Fingerprint());
  if (fp != want_fp) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layout file: fingerprint ", fp, " != ", want_fp,
        " computed by this build (written by an incompatible version?)"));
  }
  for (const auto& [k, v] : f.metadata()) {
    if (ReservedKeys().count(k) == 0) out.info[k] = v;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> SerializeLayout(const StateLayout& layout,
                                            const std::map<std::string, std::string>& info,
                                            const std::vector<float>& scores) {
  const ModelGeometry& geo = layout.geometry();
  const std::vector<int64_t> k_shape = {geo.layers, geo.h_v, geo.d_k};
  const std::vector<int64_t> v_shape = {geo.layers, geo.h_v, geo.d_v};
  SafetensorsWriter w;
  for (const auto& [k, v] : info) {
    if (ReservedKeys().count(k) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("info: key \"", k, "\" is reserved by the layout file format"));
    }
    w.SetMetadata(k, v);
  }
  w.SetMetadata("format", kLayoutFormatName);
  w.SetMetadata("version", absl::StrCat(kLayoutFormatVersion));
  w.SetMetadata("arch", ArchName(geo.arch));
  w.SetMetadata("layers", absl::StrCat(geo.layers));
  w.SetMetadata("h_qk", absl::StrCat(geo.h_qk));
  w.SetMetadata("h_v", absl::StrCat(geo.h_v));
  w.SetMetadata("d_k", absl::StrCat(geo.d_k));
  w.SetMetadata("d_v", absl::StrCat(geo.d_v));
  w.SetMetadata("scale", absl::StrFormat("%.9g", geo.scale));
  w.SetMetadata("state_format", FormatSpecName(layout.format()));
  w.SetMetadata("fingerprint", absl::StrFormat("%016x", layout.Fingerprint()));
  RETURN_IF_ERROR(w.AddInt32("key_perm", k_shape, layout.all_key_perms()));
  if (layout.format().format == StateFormat::kDampSr) {
    RETURN_IF_ERROR(w.AddInt32("value_order", v_shape, layout.all_value_orders()));
    RETURN_IF_ERROR(w.AddFloat32("value_scale", v_shape, layout.all_value_scales()));
  }
  if (IsStepQuantFormat(layout.format().format)) {
    const std::vector<int8_t>& b8 = layout.all_row_bits();
    RETURN_IF_ERROR(w.AddInt32("row_bits", k_shape, std::vector<int32_t>(b8.begin(), b8.end())));
    RETURN_IF_ERROR(w.AddFloat32("row_impact", k_shape, layout.all_row_impacts()));
  }
  if (!scores.empty()) {
    if (static_cast<int64_t>(scores.size()) != geo.HeadsPerSlot() * geo.d_k) {
      return absl::InvalidArgumentError(absl::StrCat("scores: has ", scores.size(),
                                                     " values, want layers*h_v*d_k = ",
                                                     geo.HeadsPerSlot() * geo.d_k));
    }
    RETURN_IF_ERROR(w.AddFloat32("scores", k_shape, scores));
  }
  // The checksum is computed over the parsed image without "checksum".
  ASSIGN_OR_RETURN(SafetensorsFile image, SafetensorsFile::FromBytes(w.Serialize()));
  w.SetMetadata("checksum", Checksum(image));
  return w.Serialize();
}

absl::Status WriteLayoutFile(const StateLayout& layout,
                             const std::map<std::string, std::string>& info,
                             const std::vector<float>& scores, const std::string& path) {
  ASSIGN_OR_RETURN(std::string image, SerializeLayout(layout, info, scores));
  // Reuse the safetensors writer's atomic write: round-trip the image.
  ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::FromBytes(image));
  SafetensorsWriter w;
  for (const auto& [k, v] : f.metadata()) w.SetMetadata(k, v);
  for (const std::string& name : f.names()) {
    const TensorView t = f.tensor(name).value();
    RETURN_IF_ERROR(w.Add(name, t.dtype, t.shape, t.bytes));
  }
  return w.WriteFile(path);
}

absl::StatusOr<LayoutFile> ParseLayout(std::string bytes, const ModelGeometry* want_geometry,
                                       const FormatSpec* want_format) {
  ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::FromBytes(std::move(bytes)));
  return FromFile(f, want_geometry, want_format);
}

absl::StatusOr<LayoutFile> ReadLayoutFile(const std::string& path,
                                          const ModelGeometry* want_geometry,
                                          const FormatSpec* want_format) {
  ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
  absl::StatusOr<LayoutFile> r = FromFile(f, want_geometry, want_format);
  if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat(path, ": ", r.status().message()));
  return r;
}

}  // namespace statecache
