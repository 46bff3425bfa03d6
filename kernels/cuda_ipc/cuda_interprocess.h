// The CUDA IPC implementation of the Interprocess capability
// (kernels/backend/interprocess.h), handed out by the CUDA backend: device
// allocations and interprocess events exported as 64-byte handles
// (ipc_runtime.h), done words raised and waited for on streams
// (stream_wait.h). A handle can only be opened in another process than the
// one that exported it.
#ifndef STATECACHE_KERNELS_CUDA_IPC_CUDA_INTERPROCESS_H_
#define STATECACHE_KERNELS_CUDA_IPC_CUDA_INTERPROCESS_H_

#include <memory>

#include "kernels/backend/interprocess.h"

namespace statecache {

std::unique_ptr<Interprocess> NewCudaInterprocess();

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_IPC_CUDA_INTERPROCESS_H_
