#include "kernels/stepquant/step_codec_gpu.h"

#include <cuda_runtime.h>

namespace statecache {
namespace {

__global__ void StepCodecKernel(const StepHeadLayout* layouts, const float* impact, const float* w,
                                const int64_t* offsets, int n, int d_k, int64_t head_values,
                                uint8_t* heads, float* decoded) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  StepEncodeHead(layouts[i], impact + int64_t{i} * d_k, w + i * head_values, heads + offsets[i]);
  StepDecodeHead(layouts[i], heads + offsets[i], decoded + i * head_values);
}

template <typename T>
cudaError_t Upload(T** dst, const T* src, int64_t count) {
  cudaError_t e = cudaMalloc(dst, count * sizeof(T));
  if (e != cudaSuccess) return e;
  return src == nullptr ? cudaSuccess : cudaMemcpy(*dst, src, count * sizeof(T), cudaMemcpyHostToDevice);
}

}  // namespace

int StepCodecOnGpu(const StepHeadLayout* layouts, const float* impact, const float* w,
                   const int64_t* offsets, int n, int d_k, int d_v, int64_t total_bytes,
                   uint8_t* heads, float* decoded) {
  const int64_t hv = int64_t{d_k} * d_v;
  StepHeadLayout* dl = nullptr;
  float *di = nullptr, *dw = nullptr, *dd = nullptr;
  int64_t* doff = nullptr;
  uint8_t* dh = nullptr;
  cudaError_t e = Upload(&dl, layouts, n);
  if (e == cudaSuccess) e = Upload(&di, impact, int64_t{n} * d_k);
  if (e == cudaSuccess) e = Upload(&dw, w, n * hv);
  if (e == cudaSuccess) e = Upload(&doff, offsets, n);
  if (e == cudaSuccess) e = Upload<float>(&dd, nullptr, n * hv);
  if (e == cudaSuccess) e = Upload<uint8_t>(&dh, nullptr, total_bytes);
  if (e == cudaSuccess) e = cudaMemset(dh, 0x77, total_bytes);  // the encoder must clear it
  if (e == cudaSuccess) {
    StepCodecKernel<<<(n + 31) / 32, 32>>>(dl, di, dw, doff, n, d_k, hv, dh, dd);
    e = cudaDeviceSynchronize();
  }
  if (e == cudaSuccess) e = cudaMemcpy(heads, dh, total_bytes, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(decoded, dd, n * hv * sizeof(float), cudaMemcpyDeviceToHost);
  for (void* p : {static_cast<void*>(dl), static_cast<void*>(di), static_cast<void*>(dw),
                  static_cast<void*>(dd), static_cast<void*>(doff), static_cast<void*>(dh)}) {
    if (p != nullptr) cudaFree(p);
  }
  return static_cast<int>(e);
}

}  // namespace statecache
