// Runs the STEPQuant serial reference codec (stepquant_codec.h) on the GPU,
// one head per thread, so a test can check that the __host__ __device__
// element functions give the same bytes on both sides (the contract the fused
// CUDA kernel builds on). Host pointers in and out; synchronous.
#ifndef STATECACHE_KERNELS_STEPQUANT_STEP_CODEC_GPU_H_
#define STATECACHE_KERNELS_STEPQUANT_STEP_CODEC_GPU_H_

#include <cstdint>

#include "kernels/formats/stepquant_codec.h"

namespace statecache {

// For head i: StepEncodeHead(layouts[i], impact + i * d_k, w + i * d_k * d_v,
// heads + offsets[i]) then StepDecodeHead into decoded + i * d_k * d_v.
// Returns 0, or a cudaError_t value (no device: cudaErrorNoDevice etc.).
int StepCodecOnGpu(const StepHeadLayout* layouts, const float* impact, const float* w,
                   const int64_t* offsets, int n, int d_k, int d_v, int64_t total_bytes,
                   uint8_t* heads, float* decoded);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_STEPQUANT_STEP_CODEC_GPU_H_
