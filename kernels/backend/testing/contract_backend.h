// The backend a contract test binary runs on (defined by the binary's
// backend file), or null when it is unavailable (the test skips).
#ifndef STATECACHE_KERNELS_BACKEND_TESTING_CONTRACT_BACKEND_H_
#define STATECACHE_KERNELS_BACKEND_TESTING_CONTRACT_BACKEND_H_

#include <memory>

#include "kernels/backend/backend.h"

namespace statecache {

std::unique_ptr<Backend>& ContractBackend();

}  // namespace statecache

#endif  // STATECACHE_KERNELS_BACKEND_TESTING_CONTRACT_BACKEND_H_
