// The normalized block-32 Walsh-Hadamard transform H32 (H H^T = I, H = H^T,
// so it is its own inverse), applied in place to consecutive blocks of 32.
//
// The butterfly order (stride 1, 2, 4, 8, 16, then one multiply by
// 1/sqrt(32)) is part of the contract: a CUDA warp doing the same butterflies
// with __shfl_xor_sync in the same order gets the same bits.
#ifndef STATECACHE_KERNELS_FORMATS_HADAMARD_H_
#define STATECACHE_KERNELS_FORMATS_HADAMARD_H_

#include "kernels/common/host_device.h"

namespace statecache {

inline constexpr int kHadamardBlock = 32;
inline constexpr float kHadamardNorm = 0.17677669529663688f;  // 1/sqrt(32)

// In-place H32 on x[0..31].
SC_HD void Hadamard32(float* x) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int h = 1; h < kHadamardBlock; h <<= 1) {
    for (int i = 0; i < kHadamardBlock; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  for (int j = 0; j < kHadamardBlock; ++j) x[j] *= kHadamardNorm;
}

// In-place H32 on each of the n / 32 blocks of x (n a multiple of 32).
SC_HD void BlockHadamard32(float* x, int n) {
  for (int b = 0; b < n; b += kHadamardBlock) Hadamard32(x + b);
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_HADAMARD_H_
