#include "client/ctl_calibration/cli_flags.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/common/status_macros.h"

namespace statecache {

absl::StatusOr<CliFlags> CliFlags::Parse(const std::vector<std::string>& args,
                                         const Spec& spec) {
  CliFlags f;
  std::vector<std::string> known;
  for (const std::string& n : spec.value_flags) known.push_back(n);
  for (const std::string& n : spec.bool_flags) known.push_back(n);
  const bool has_help = spec.bool_flags.count("help") != 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      if (spec.stop_at_positional) {
        f.rest_.assign(args.begin() + i + 1, args.end());
        return f;
      }
      if (!spec.positional && i + 1 < args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[i + 1], "'"));
      }
      f.positional_.insert(f.positional_.end(), args.begin() + i + 1, args.end());
      return f;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      if (spec.stop_at_positional) {
        f.rest_.assign(args.begin() + i, args.end());
        return f;
      }
      if (!spec.positional) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
      }
      f.positional_.push_back(arg);
      continue;
    }
    const size_t dashes = arg[1] == '-' ? 2 : 1;
    const std::string body = arg.substr(dashes);
    std::string name = body, value;
    const size_t eq = body.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
    }
    if (name == "h" && has_help && !has_value) name = "help";
    if (spec.value_flags.count(name) == 0 && spec.bool_flags.count(name) == 0 &&
        name.find('-') != std::string::npos) {
      std::string snake = name;
      std::replace(snake.begin(), snake.end(), '-', '_');
      if (spec.value_flags.count(snake) != 0 || spec.bool_flags.count(snake) != 0) {
        f.warnings_.push_back(
            absl::StrCat("--", name, " is deprecated: use --", snake));
        name = snake;
      }
    }
    if (spec.bool_flags.count(name) != 0) {
      if (has_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": want true or false"));
      }
      if (!has_value || value == "true") f.values_[name] = "true";
      continue;
    }
    if (spec.value_flags.count(name) == 0) {
      std::string snake = name;
      std::replace(snake.begin(), snake.end(), '-', '_');
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag ", arg.substr(0, dashes + name.size()), DidYouMean(snake, known, "--"),
          has_help ? " (see --help)" : ""));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
      }
      value = args[++i];
    }
    f.values_[name] = value;
  }
  return f;
}

absl::StatusOr<CliFlags> CliFlags::Parse(int argc, char** argv,
                                         const std::set<std::string>& value_flags,
                                         const std::set<std::string>& bool_flags) {
  Spec spec;
  spec.value_flags = value_flags;
  spec.bool_flags = bool_flags;
  ASSIGN_OR_RETURN(CliFlags f,
                   Parse(std::vector<std::string>(argv + std::min(argc, 1), argv + argc), spec));
  for (const std::string& w : f.warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  return f;
}

int EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string ClosestMatch(absl::string_view word, const std::vector<std::string>& candidates) {
  const int limit = std::max<int>(1, (static_cast<int>(word.size()) + 2) / 3);
  std::string best;
  int best_distance = limit + 1;
  for (const std::string& c : candidates) {
    const int d = EditDistance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

std::string DidYouMean(absl::string_view word, const std::vector<std::string>& candidates,
                       absl::string_view prefix) {
  const std::string best = ClosestMatch(word, candidates);
  return best.empty() ? "" : absl::StrCat(" (did you mean '", prefix, best, "'?)");
}

std::string CliFlags::Get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int> CliFlags::GetInt(const std::string& name, int fallback) const {
  if (!Has(name)) return fallback;
  int v = 0;
  if (!absl::SimpleAtoi(Get(name, ""), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", Get(name, ""), "' is not an integer"));
  }
  return v;
}

absl::StatusOr<double> CliFlags::GetDouble(const std::string& name, double fallback) const {
  if (!Has(name)) return fallback;
  double v = 0;
  if (!absl::SimpleAtod(Get(name, ""), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", Get(name, ""), "' is not a number"));
  }
  return v;
}

absl::StatusOr<std::vector<std::string>> ExpandTrajectoryPaths(const std::string& list) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    const fs::path p{std::string(part)};
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(p, ec)) {
        if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
      }
      std::sort(files.begin(), files.end());
      out.insert(out.end(), files.begin(), files.end());
    } else if (fs::exists(p, ec)) {
      out.push_back(p.string());
    } else {
      return absl::NotFoundError(absl::StrCat("trajectories: ", p.string(), " does not exist"));
    }
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("trajectories: no files in '", list, "'"));
  }
  return out;
}

namespace {

// Applies one geometry key of a spec ("arch", "layers", "h_qk", "h_v", "d_k",
// "d_v", and with `allow_scale` "scale") to `g`; false when `key` is not a
// geometry key.
absl::StatusOr<bool> ApplyGeometryKey(absl::string_view kv, const std::string& key,
                                      const std::string& value, bool allow_scale,
                                      absl::string_view what, ModelGeometry* g) {
  if (key == "arch") {
    ASSIGN_OR_RETURN(g->arch, ParseArch(value));
    return true;
  }
  if (allow_scale && key == "scale") {
    if (!absl::SimpleAtof(value, &g->scale)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", kv, "' is not scale=number"));
    }
    return true;
  }
  int* field = key == "layers" ? &g->layers
               : key == "h_qk" ? &g->h_qk
               : key == "h_v"  ? &g->h_v
               : key == "d_k"  ? &g->d_k
               : key == "d_v"  ? &g->d_v
                               : nullptr;
  if (field == nullptr) return false;
  if (!absl::SimpleAtoi(value, field)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", kv, "' is not key=integer (or arch=gdn|kda)"));
  }
  return true;
}

}  // namespace

absl::StatusOr<ModelGeometry> ParseGeometrySpec(const std::string& text) {
  ModelGeometry g{Arch::kGdn, 0, 0, 0, 0, 0, 0.0f};
  bool h_qk_given = false;
  for (absl::string_view kv : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    ASSIGN_OR_RETURN(bool known, ApplyGeometryKey(kv, p.first, p.second, true, "--geometry", &g));
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--geometry: unknown key '", p.first,
          "' (keys: arch, layers, h_qk, h_v, d_k, d_v, scale)"));
    }
    h_qk_given |= p.first == "h_qk";
  }
  if (g.arch == Arch::kKda && !h_qk_given) g.h_qk = g.h_v;
  RETURN_IF_ERROR(g.Validate());
  return g;
}

absl::StatusOr<SyntheticSpec> ParseSyntheticSpec(const std::string& text) {
  SyntheticSpec s;
  s.base.geometry = ModelGeometry{Arch::kGdn, 4, 4, 8, 128, 128, 0.0f};
  s.base.tokens = 256;
  for (absl::string_view kv : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    const std::string& k = p.first;
    ASSIGN_OR_RETURN(bool geometry_key,
                     ApplyGeometryKey(kv, k, p.second, false, "synthetic", &s.base.geometry));
    if (geometry_key) continue;
    int64_t v = 0;
    if (!absl::SimpleAtoi(p.second, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic: '", kv, "' is not key=integer (or arch=gdn|kda)"));
    }
    if (k == "docs") s.docs = static_cast<int>(v);
    else if (k == "tokens") s.base.tokens = static_cast<int>(v);
    else if (k == "domains") s.domains = static_cast<int>(v);
    else if (k == "seed") s.seed = static_cast<uint64_t>(v);
    else if (k == "model_seed") s.base.seed_layout = static_cast<uint64_t>(v);
    else return absl::InvalidArgumentError(absl::StrCat("synthetic: unknown key '", k, "'"));
  }
  if (s.base.geometry.arch == Arch::kKda) s.base.geometry.h_qk = s.base.geometry.h_v;
  RETURN_IF_ERROR(s.base.geometry.Validate());
  if (s.docs < 1 || s.domains < 1 || s.base.tokens < 1) {
    return absl::InvalidArgumentError("synthetic: docs, domains and tokens must be >= 1");
  }
  const ModelGeometry& g = s.base.geometry;
  s.text = absl::StrCat("arch=", ArchName(g.arch), ",layers=", g.layers, ",h_qk=", g.h_qk,
                        ",h_v=", g.h_v, ",d_k=", g.d_k, ",d_v=", g.d_v, ",docs=", s.docs,
                        ",tokens=", s.base.tokens, ",domains=", s.domains, ",seed=", s.seed,
                        ",model_seed=", s.base.seed_layout);
  return s;
}

SyntheticSpec HeldOutSpec(const SyntheticSpec& spec, int docs) {
  SyntheticSpec h = spec;
  h.docs = docs;
  h.seed = spec.seed + 1000003;
  const ModelGeometry& g = h.base.geometry;
  h.text = absl::StrCat("arch=", ArchName(g.arch), ",layers=", g.layers, ",h_qk=", g.h_qk,
                        ",h_v=", g.h_v, ",d_k=", g.d_k, ",d_v=", g.d_v, ",docs=", docs,
                        ",tokens=", h.base.tokens, ",domains=", h.domains, ",seed=", h.seed,
                        ",model_seed=", h.base.seed_layout, " (held out: same model, other seeds)");
  return h;
}

absl::StatusOr<Trajectory> MakeSyntheticDocument(const SyntheticSpec& spec, int i) {
  SyntheticOptions o = spec.base;
  o.seed = spec.seed * 1000 + static_cast<uint64_t>(i);
  o.domain = absl::StrCat("synthetic-", i % spec.domains);
  return MakeSyntheticTrajectory(o);
}

}  // namespace statecache
