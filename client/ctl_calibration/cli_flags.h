// Small helpers of statecachectl and the calibration commands: a strict
// --flag parser (no global flag registry, so every command parses its own
// flags), "did you mean" suggestions, trajectory path lists and the
// SYNTHETIC trajectory spec.
//
// Flag names are snake_case (--sample_every). The kebab-case spelling of a
// snake_case flag (--sample-every) is a deprecated alias: accepted, with a
// warning in warnings().
//
//   ASSIGN_OR_RETURN(CliFlags f, CliFlags::Parse(args, {.value_flags = {"format", "out"},
//                                                       .bool_flags = {"help"}}));
//   std::string fmt = f.Get("format", "damp:16");
#ifndef STATECACHE_CLIENT_CTL_CALIBRATION_CLI_FLAGS_H_
#define STATECACHE_CLIENT_CTL_CALIBRATION_CLI_FLAGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/trajectory/synthetic.h"
#include "kernels/trajectory/trajectory.h"

namespace statecache {

class CliFlags {
 public:
  struct Spec {
    std::set<std::string> value_flags;  // --name=value or --name value
    std::set<std::string> bool_flags;   // --name, --name=true|false
    // Positional arguments are kept in positional(); otherwise they are
    // kInvalidArgument.
    bool positional = false;
    // Stop at the first positional argument: it and everything after it are
    // left unparsed in rest() (flags before a subcommand's name).
    bool stop_at_positional = false;
  };

  // `args` excludes the program / command name. Accepts --name=value,
  // --name value, a single dash (-name) and "--" (the rest is positional);
  // with "help" among bool_flags, -h is --help. Unknown flags are
  // kInvalidArgument naming them, with the closest known flag suggested.
  static absl::StatusOr<CliFlags> Parse(const std::vector<std::string>& args, const Spec& spec);
  // argv[0] is the command name; no positional arguments; deprecation
  // warnings are printed to stderr.
  static absl::StatusOr<CliFlags> Parse(int argc, char** argv,
                                        const std::set<std::string>& value_flags,
                                        const std::set<std::string>& bool_flags);
  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  const std::vector<std::string>& positional() const { return positional_; }
  const std::vector<std::string>& rest() const { return rest_; }
  // "--sample-every is deprecated: use --sample_every", one per use.
  const std::vector<std::string>& warnings() const { return warnings_; }
  std::string Get(const std::string& name, const std::string& fallback) const;
  absl::StatusOr<int> GetInt(const std::string& name, int fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  std::vector<std::string> rest_;
  std::vector<std::string> warnings_;
};

// Levenshtein distance (insertions, deletions, substitutions of bytes).
int EditDistance(absl::string_view a, absl::string_view b);
// The candidate closest to `word` when it is plausibly a typo of it (edit
// distance <= max(1, ceil(|word| / 3)), ties: the first), else "".
std::string ClosestMatch(absl::string_view word, const std::vector<std::string>& candidates);
// " (did you mean 'x'?)" with `prefix` before x, or "" when nothing is close.
std::string DidYouMean(absl::string_view word, const std::vector<std::string>& candidates,
                       absl::string_view prefix = "");

// Comma-separated files and directories; a directory contributes its
// *.safetensors files in name order. kInvalidArgument when the result is
// empty, kNotFound for a missing path.
absl::StatusOr<std::vector<std::string>> ExpandTrajectoryPaths(const std::string& list);

// "arch=gdn,layers=4,h_qk=4,h_v=8,d_k=128,d_v=128,docs=16,tokens=256,
//  domains=4,seed=1,model_seed=7" (every key optional; these are the
// defaults). Document i gets domain "synthetic-<i % domains>" and its own
// token seed; model_seed fixes the "model" (decay spectrum, outliers).
struct SyntheticSpec {
  SyntheticOptions base;  // geometry, tokens, seed_layout
  int docs = 16;
  int domains = 4;
  uint64_t seed = 1;
  std::string text;  // canonical text, for reports
};
absl::StatusOr<SyntheticSpec> ParseSyntheticSpec(const std::string& text);

// --geometry of `statecachectl register`: "arch=gdn,layers=4,h_qk=2,h_v=4,
// d_k=128,d_v=128[,scale=0.088]" (arch defaults to gdn, KDA's h_qk to h_v,
// scale to 0 = 1/sqrt(d_k)); kInvalidArgument naming the key or the
// geometry rule that fails.
absl::StatusOr<ModelGeometry> ParseGeometrySpec(const std::string& text);
// The same model, other documents (disjoint token seeds): for held-out sets.
SyntheticSpec HeldOutSpec(const SyntheticSpec& spec, int docs);
// Generates document i (0 <= i < docs).
absl::StatusOr<Trajectory> MakeSyntheticDocument(const SyntheticSpec& spec, int i);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CTL_CALIBRATION_CLI_FLAGS_H_
