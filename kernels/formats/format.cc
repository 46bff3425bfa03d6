#include "kernels/formats/format.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace statecache {

const char* FormatName(StateFormat format) {
  for (StateFormat f : kAllFormats) {
    if (f == format) return TraitsOf(f).name;
  }
  return "unknown";
}

std::string FormatSpecName(const FormatSpec& spec) {
  if (IsMixedFormat(spec.format)) {
    return absl::StrCat(FormatName(spec.format), ":", spec.k_hi);
  }
  return FormatName(spec.format);
}

std::vector<StateFormat> AllStateFormats() {
  std::vector<StateFormat> all;
  for (StateFormat f : kAllFormats) {
    if (!IsStepQuantFormat(f)) all.push_back(f);
  }
  return all;
}

std::vector<StateFormat> AllFormatsWithStepQuant() {
  std::vector<StateFormat> all = AllStateFormats();
  for (StateFormat f : kAllFormats) {
    if (IsStepQuantFormat(f)) all.push_back(f);
  }
  return all;
}

absl::StatusOr<FormatSpec> ParseFormatSpec(absl::string_view text) {
  std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(text, absl::MaxSplits(':', 1));
  for (StateFormat f : AllFormatsWithStepQuant()) {
    if (parts.first != FormatName(f)) continue;
    FormatSpec spec{f, IsMixedFormat(f) ? kDefaultKHi : 0};
    if (text.find(':') == absl::string_view::npos) return spec;
    if (!IsMixedFormat(f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "format: '", text, "': only damp and damp-sr take a ':<k_hi>' suffix"));
    }
    if (!absl::SimpleAtoi(parts.second, &spec.k_hi) || spec.k_hi < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "format: '", text, "': k_hi must be a non-negative integer"));
    }
    return spec;
  }
  std::string known;
  for (StateFormat f : AllFormatsWithStepQuant()) absl::StrAppend(&known, known.empty() ? "" : ", ", FormatName(f));
  return absl::InvalidArgumentError(
      absl::StrCat("format: unknown state format '", text, "' (known: ", known, ")"));
}

absl::Status ValidateFormatSpec(const FormatSpec& spec, int d_k) {
  if (static_cast<int>(spec.format) < 0 || static_cast<int>(spec.format) >= kNumAllStateFormats) {
    return absl::InvalidArgumentError(
        absl::StrCat("format: unknown format code ", static_cast<int>(spec.format)));
  }
  if (!IsMixedFormat(spec.format)) {
    if (spec.k_hi != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("format: '", FormatName(spec.format), "' is uniform and takes no k_hi (got ",
                       spec.k_hi, "; only damp and damp-sr have FP16 key rows)"));
    }
    return absl::OkStatus();
  }
  if (spec.k_hi < 0 || spec.k_hi > d_k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format: '", FormatSpecName(spec), "': k_hi ", spec.k_hi, " is outside 0..", d_k,
        " (the FP16 key rows of a head: at most d_k = ", d_k, ")"));
  }
  return absl::OkStatus();
}

std::vector<int> StepQuantCandidateBits(StateFormat format) {
  if (format == StateFormat::kStepQuant6) return {4, 6, 8};
  if (format == StateFormat::kStepQuant4) return {3, 4, 6, 8};
  return {};
}

}  // namespace statecache
