// Stand-in for builds without the CUDA library linked: "cuda" is unavailable.
#include "kernels/backend/backend.h"

namespace statecache {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackendOrUnavailable() {
  return absl::UnavailableError("backend: this binary was built without the CUDA backend");
}

}  // namespace statecache
