#include "kernels/backend/testing/contract_backend.h"
#include "kernels/cuda/testing/gpu_backend.h"

namespace statecache {

std::unique_ptr<Backend>& ContractBackend() { return TestGpu(); }

}  // namespace statecache
