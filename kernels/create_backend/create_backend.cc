#include "kernels/create_backend/create_backend.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda_ipc/cuda_interprocess.h"
#include "kernels/shm/shm_interprocess.h"

namespace statecache {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view name,
                                                       const LaunchOptions& cuda_launch) {
  if (name == "cpu") return std::unique_ptr<Backend>(CpuBackend::Create({}));
  if (name == "cuda") return CreateCudaBackend(cuda_launch);
  if (name == "auto") {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(cuda_launch);
    if (cuda.ok()) return cuda;
    return std::unique_ptr<Backend>(CpuBackend::Create({}));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("backend: unknown backend '", name, "' (expected auto, cuda or cpu)"));
}

absl::StatusOr<std::unique_ptr<Interprocess>> CreateInterprocess(absl::string_view name) {
  if (name == "cpu") return NewSharedMemoryInterprocess();
  if (name == "cuda") return NewCudaInterprocess();
  return absl::InvalidArgumentError(
      absl::StrCat("backend: no interprocess memory for backend '", name, "' (expected cuda or cpu)"));
}

}  // namespace statecache
