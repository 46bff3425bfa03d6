#include "kernels/cuda/testing/gpu_backend.h"

#include <utility>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_backend.h"

namespace statecache {

std::unique_ptr<Backend>& TestGpu() {
  static auto* backend = new std::unique_ptr<Backend>([] {
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateCudaBackend();
    if (!b.ok()) return std::unique_ptr<Backend>();
    return std::move(b).value();
  }());
  return *backend;
}

}  // namespace statecache
