#include "kernels/trajectory/golden.h"

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/io/safetensors.h"
#include "kernels/io/test_data.h"

namespace statecache {

absl::StatusOr<Trajectory> GoldenTrajectory(const std::string& model,
                                            const ModelGeometry& geometry) {
  ASSIGN_OR_RETURN(std::string path, SharedDataPath("models/" + model + "/golden.safetensors"));
  ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  Trajectory t;
  t.geometry = geometry;
  t.tokens = kGoldenTokens;
  t.domain = "golden";
  t.source = model + " golden.safetensors";
  for (int l = 0; l < geometry.layers; ++l) {
    const std::string p = absl::StrCat("layer", l, ".");
    LayerInputs& in = t.layers.emplace_back();
    ASSIGN_OR_RETURN(in.q, file.ToFloat32(p + "q"));
    ASSIGN_OR_RETURN(in.k, file.ToFloat32(p + "k"));
    ASSIGN_OR_RETURN(in.v, file.ToFloat32(p + "v"));
    ASSIGN_OR_RETURN(in.g, file.ToFloat32(p + "g"));
    ASSIGN_OR_RETURN(in.beta, file.ToFloat32(p + "beta"));
  }
  RETURN_IF_ERROR(t.Validate());
  return t;
}

}  // namespace statecache
