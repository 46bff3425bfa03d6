// CreateBackend: picks the CPU or CUDA implementation at run time.
#include "absl/strings/str_cat.h"
#include "kernels/backend/backend.h"
#include "kernels/cpu/cpu_backend.h"

namespace statecache {

// Defined by the CUDA backend library (kernels/cuda); returns kUnavailable
// when no usable GPU is present.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackendOrUnavailable();

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view name) {
  if (name == "cpu") return std::unique_ptr<Backend>(CpuBackend::Create({}));
  if (name == "cuda") return CreateCudaBackendOrUnavailable();
  if (name == "auto") {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackendOrUnavailable();
    if (cuda.ok()) return cuda;
    return std::unique_ptr<Backend>(CpuBackend::Create({}));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("backend: unknown backend '", name, "' (expected auto, cuda or cpu)"));
}

}  // namespace statecache
