// Links the CUDA backend into CreateBackend (kernels/backend/create_backend.cc):
// a binary depends on :create_backend_hook instead of the no-CUDA stub
// (kernels/backend/no_cuda_backend.cc) to get "cuda" / "auto" on a GPU.
#include "kernels/backend/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace statecache {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackendOrUnavailable() {
  return CreateCudaBackend();
}

}  // namespace statecache
