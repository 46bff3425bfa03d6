// CudaStatus: the one conversion of a cudaError_t (as int, the value the
// plain-C++ wrappers of kernels/cuda and kernels/cuda_ipc return) into an
// absl::Status, for every host file that calls CUDA.
//
//   RETURN_IF_ERROR(CudaStatus(cuda_ipc::Malloc(&p, n), "cudaMalloc"));
#ifndef STATECACHE_KERNELS_CUDA_IPC_CUDA_STATUS_H_
#define STATECACHE_KERNELS_CUDA_IPC_CUDA_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace statecache {

// OK when `cuda_error` is 0 (cudaSuccess); otherwise a status of `code`
// (kInternal unless the caller knows better, e.g. kInvalidArgument for a
// handle sent by another process) with the message
// "<what>: <cudaGetErrorString> (CUDA error <cuda_error>)".
absl::Status CudaStatus(int cuda_error, absl::string_view what,
                        absl::StatusCode code = absl::StatusCode::kInternal);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_IPC_CUDA_STATUS_H_
