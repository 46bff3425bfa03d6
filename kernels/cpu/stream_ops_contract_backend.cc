#include "kernels/backend/testing/contract_backend.h"
#include "kernels/cpu/cpu_backend.h"

namespace statecache {

std::unique_ptr<Backend>& ContractBackend() {
  static std::unique_ptr<Backend> b = CpuBackend::Create({.threads = 2});
  return b;
}

}  // namespace statecache
