// Small helpers of the calibration commands: a strict --flag parser (no
// global flag registry, so the commands can live inside statecachectl),
// trajectory path lists and the SYNTHETIC trajectory spec.
//
//   ASSIGN_OR_RETURN(CliFlags f, CliFlags::Parse(argc, argv, {"format", "out"}, {"json"}));
//   std::string fmt = f.Get("format", "damp:16");
#ifndef STATECACHE_CLIENT_CTL_CALIBRATION_CLI_FLAGS_H_
#define STATECACHE_CLIENT_CTL_CALIBRATION_CLI_FLAGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/trajectory/synthetic.h"
#include "kernels/trajectory/trajectory.h"

namespace statecache {

class CliFlags {
 public:
  // argv[0] is the command name. Accepts --name=value, --name value and
  // (for `bool_flags`) a bare --name. Unknown flags and positional
  // arguments are kInvalidArgument naming them.
  static absl::StatusOr<CliFlags> Parse(int argc, char** argv,
                                        const std::set<std::string>& value_flags,
                                        const std::set<std::string>& bool_flags);
  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  std::string Get(const std::string& name, const std::string& fallback) const;
  absl::StatusOr<int> GetInt(const std::string& name, int fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

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
// The same model, other documents (disjoint token seeds): for held-out sets.
SyntheticSpec HeldOutSpec(const SyntheticSpec& spec, int docs);
// Generates document i (0 <= i < docs).
absl::StatusOr<Trajectory> MakeSyntheticDocument(const SyntheticSpec& spec, int i);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CTL_CALIBRATION_CLI_FLAGS_H_
