#include "kernels/create_backend/create_backend.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda_ipc/cuda_interprocess.h"
#include "kernels/shm/shm_interprocess.h"

namespace statecache {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view name,
                                                       const LaunchOptions& cuda_launch) {
  if (name == "cpu") return std::unique_ptr<Backend>(CpuBackend::Create({}));
  if (name == "cuda") return CreateCudaBackend(cuda_launch);
  if (absl::ConsumePrefix(&name, "cuda:")) {
    LaunchOptions on_device = cuda_launch;
    if (!absl::SimpleAtoi(name, &on_device.device) || on_device.device < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("backend: 'cuda:", name, "' does not name a device (cuda:<n>, n >= 0)"));
    }
    return CreateCudaBackend(on_device);
  }
  if (name == "auto") {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(cuda_launch);
    if (cuda.ok()) return cuda;
    return std::unique_ptr<Backend>(CpuBackend::Create({}));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("backend: unknown backend '", name,
                   "' (expected auto, cuda, cuda:<n> or cpu)"));
}

absl::StatusOr<std::unique_ptr<Interprocess>> CreateInterprocess(absl::string_view name) {
  if (name == "cpu") return NewSharedMemoryInterprocess();
  if (name == "cuda") return NewCudaInterprocess();
  return absl::InvalidArgumentError(
      absl::StrCat("backend: no interprocess memory for backend '", name, "' (expected cuda or cpu)"));
}

}  // namespace statecache
