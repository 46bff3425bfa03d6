// Dense FP32 linear layers for the reference model worker.
//
// MatMulTransposed computes Y[T, N] = X[T, K] * W[N, K]^T (nn.Linear with the
// PyTorch [out, in] weight layout), split over output rows and tokens on a
// ThreadPool. The inner kernel uses 8-wide vector accumulators and is compiled
// for AVX2+FMA with a portable fallback (chosen at load time through GCC
// target_clones), so results differ from a serial dot product only by
// summation order (~1e-7 relative).
//
//   MatMulTransposed(pool, x.data(), T, K, w.data(), N, y.data());
#ifndef STATECACHE_CLIENT_MODEL_LINEAR_H_
#define STATECACHE_CLIENT_MODEL_LINEAR_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace statecache {

// y [t, n] = x [t, k] . w [n, k]^T. `pool` may be null (serial). y must not
// alias x or w. Row strides are the dense widths (k for x and w, n for y).
void MatMulTransposed(ThreadPool* pool, const float* x, int64_t t, int64_t k, const float* w,
                      int64_t n, float* y);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_MODEL_LINEAR_H_
