#include "kernels/trajectory/trajectory.h"

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace statecache {

absl::Status Trajectory::Validate() const {
  RETURN_IF_ERROR(geometry.Validate());
  if (tokens < 1) return absl::InvalidArgumentError(absl::StrCat("tokens: ", tokens, " < 1"));
  if (static_cast<int>(layers.size()) != geometry.layers) {
    return absl::InvalidArgumentError(absl::StrCat("layers: trajectory has ", layers.size(),
                                                   ", geometry says ", geometry.layers));
  }
  const int64_t t = tokens;
  for (int l = 0; l < geometry.layers; ++l) {
    const LayerInputs& in = layers[l];
    const struct {
      const char* name;
      size_t have;
      int64_t want;
    } checks[] = {
        {"q", in.q.size(), t * geometry.h_qk * geometry.d_k},
        {"k", in.k.size(), t * geometry.h_qk * geometry.d_k},
        {"v", in.v.size(), t * geometry.h_v * geometry.d_v},
        {"g", in.g.size(), t * geometry.h_v * geometry.GateWidth()},
        {"beta", in.beta.size(), t * geometry.h_v},
    };
    for (const auto& c : checks) {
      if (static_cast<int64_t>(c.have) != c.want) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", l, " ", c.name, ": has ", c.have,
                                                       " values, want ", c.want));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace statecache
