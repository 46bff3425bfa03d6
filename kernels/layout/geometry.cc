#include "kernels/layout/geometry.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace statecache {

const char* ArchName(Arch arch) { return arch == Arch::kKda ? "kda" : "gdn"; }

absl::StatusOr<Arch> ParseArch(absl::string_view name) {
  if (name == "gdn") return Arch::kGdn;
  if (name == "kda") return Arch::kKda;
  return absl::InvalidArgumentError(
      absl::StrCat("arch: unknown architecture '", name, "' (expected gdn or kda)"));
}

absl::Status ModelGeometry::Validate() const {
  auto bad = [](absl::string_view field, auto value, absl::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value, " is invalid (", want, ")"));
  };
  if (arch != Arch::kGdn && arch != Arch::kKda) {
    return bad("arch", static_cast<int>(arch), "gdn or kda");
  }
  if (layers <= 0 || layers > kMaxLayers) return bad("layers", layers, "1..1024");
  if (h_qk <= 0 || h_qk > kMaxHeads) return bad("h_qk", h_qk, "1..1024");
  if (h_v <= 0 || h_v > kMaxHeads) return bad("h_v", h_v, "1..1024");
  if (h_v % h_qk != 0) return bad("h_v", h_v, absl::StrCat("a multiple of h_qk=", h_qk));
  if (arch == Arch::kKda && h_qk != h_v) {
    return bad("h_qk", h_qk, absl::StrCat("kda needs h_qk == h_v=", h_v));
  }
  if (d_k <= 0 || d_k > kMaxHeadDim) return bad("d_k", d_k, "1..256");
  if (d_v <= 0 || d_v > kMaxHeadDim || d_v % 32 != 0) {
    return bad("d_v", d_v, "a multiple of 32 in 32..256");
  }
  if (!(scale >= 0.0f && scale <= kMaxReadoutScale)) {
    return bad("scale", scale, "in [0, 65536]; 0 selects 1/sqrt(d_k)");
  }
  return absl::OkStatus();
}

std::string ModelGeometry::DebugString() const {
  return absl::StrCat(ArchName(arch), " L=", layers, " Hqk=", h_qk, " Hv=", h_v,
                      " dk=", d_k, " dv=", d_v, " scale=", EffectiveScale());
}

absl::StatusOr<ModelGeometry> ParseGeometry(absl::string_view text, absl::string_view field) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  if (parts.size() != 6) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", text, "' is not arch:layers:h_qk:h_v:d_k:d_v"));
  }
  ModelGeometry g;
  absl::StatusOr<Arch> arch = ParseArch(parts[0]);
  if (!arch.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", arch.status().message()));
  }
  g.arch = *arch;
  int* fields[] = {&g.layers, &g.h_qk, &g.h_v, &g.d_k, &g.d_v};
  for (int i = 0; i < 5; ++i) {
    if (!absl::SimpleAtoi(parts[i + 1], fields[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", parts[i + 1], "' in '", text, "' is not a number"));
    }
  }
  const absl::Status valid = g.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", valid.message()));
  }
  return g;
}

}  // namespace statecache
