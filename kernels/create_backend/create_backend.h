// CreateBackend: the one place that knows every Backend implementation
// (kernels/backend/backend.h is the interface; kernels/cpu and kernels/cuda
// implement it and never depend on this package).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("auto"));
#ifndef STATECACHE_KERNELS_CREATE_BACKEND_CREATE_BACKEND_H_
#define STATECACHE_KERNELS_CREATE_BACKEND_CREATE_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/interprocess.h"
#include "kernels/cuda/launch_options.h"

namespace statecache {

// "cpu", "cuda" (device 0, or cuda_launch.device), "cuda:<n>" (device n)
// or "auto" (CUDA when a GPU is usable, else CPU). kInvalidArgument for
// other names and devices that do not exist; kUnavailable for "cuda"
// without a GPU.
// A CUDA backend launches its kernels with `cuda_launch` (the defaults are
// the production paths; a process edge may read LaunchOptionsFromEnvironment).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view name,
                                                       const LaunchOptions& cuda_launch = {});

// The Interprocess capability (kernels/backend/interprocess.h) that backend
// `name` ("cpu" or "cuda") hands out, without making the backend: for a
// process that shares memory with a server of that backend but computes
// nothing itself (a data-plane worker's buffers). kInvalidArgument for other
// names.
absl::StatusOr<std::unique_ptr<Interprocess>> CreateInterprocess(absl::string_view name);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CREATE_BACKEND_CREATE_BACKEND_H_
