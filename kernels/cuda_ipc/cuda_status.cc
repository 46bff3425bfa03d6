#include "kernels/cuda_ipc/cuda_status.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda_ipc/ipc_runtime.h"

namespace statecache {

absl::Status CudaStatus(int cuda_error, absl::string_view what, absl::StatusCode code) {
  if (cuda_error == 0) return absl::OkStatus();
  return absl::Status(code, absl::StrCat(what, ": ", cuda_ipc::ErrorString(cuda_error),
                                         " (CUDA error ", cuda_error, ")"));
}

}  // namespace statecache
