// The CUDA backend shared by a GPU test binary's tests.
#ifndef STATECACHE_KERNELS_CUDA_TESTING_GPU_BACKEND_H_
#define STATECACHE_KERNELS_CUDA_TESTING_GPU_BACKEND_H_

#include <memory>

#include "gtest/gtest.h"
#include "kernels/backend/backend.h"

namespace statecache {

// Created on first use (one per process: creating a CUDA backend costs a
// context and a stream); null when there is no usable CUDA device, so tests
// skip cleanly on machines without a GPU (CI).
std::unique_ptr<Backend>& TestGpu();

}  // namespace statecache

// In a test body: skips the test when TestGpu() is null.
#define STATECACHE_SKIP_WITHOUT_GPU() \
  if (::statecache::TestGpu() == nullptr) GTEST_SKIP() << "no usable CUDA device"

#endif  // STATECACHE_KERNELS_CUDA_TESTING_GPU_BACKEND_H_
