#include "kernels/cuda_ipc/ipc_runtime.h"

#include <cstring>

#include <cuda_runtime.h>

namespace statecache {
namespace cuda_ipc {

static_assert(sizeof(cudaIpcMemHandle_t) == kHandleBytes, "cudaIpcMemHandle_t size");
static_assert(sizeof(cudaIpcEventHandle_t) == kHandleBytes, "cudaIpcEventHandle_t size");

const char* ErrorString(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int Malloc(void** ptr, int64_t bytes) { return cudaMalloc(ptr, static_cast<size_t>(bytes)); }
int Free(void* ptr) { return cudaFree(ptr); }
int CopyHostToDevice(void* dst, const void* src, int64_t bytes) {
  return cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice);
}
int CopyDeviceToHost(void* dst, const void* src, int64_t bytes) {
  return cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost);
}

int GetMemHandle(void* device_ptr, std::string* handle) {
  cudaIpcMemHandle_t h;
  const cudaError_t e = cudaIpcGetMemHandle(&h, device_ptr);
  if (e == cudaSuccess) handle->assign(reinterpret_cast<const char*>(&h), sizeof(h));
  return e;
}

int OpenMemHandle(const std::string& handle, void** device_ptr) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) return cudaErrorInvalidValue;
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  return cudaIpcOpenMemHandle(device_ptr, h, cudaIpcMemLazyEnablePeerAccess);
}

int CloseMemHandle(void* device_ptr) { return cudaIpcCloseMemHandle(device_ptr); }

int EventCreateInterprocess(void** event) {
  cudaEvent_t e;
  const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming);
  if (r == cudaSuccess) *event = e;
  return r;
}

int EventDestroy(void* event) { return cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

int GetEventHandle(void* event, std::string* handle) {
  cudaIpcEventHandle_t h;
  const cudaError_t e = cudaIpcGetEventHandle(&h, static_cast<cudaEvent_t>(event));
  if (e == cudaSuccess) handle->assign(reinterpret_cast<const char*>(&h), sizeof(h));
  return e;
}

int OpenEventHandle(const std::string& handle, void** event) {
  if (handle.size() != sizeof(cudaIpcEventHandle_t)) return cudaErrorInvalidValue;
  cudaIpcEventHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  cudaEvent_t e;
  const cudaError_t r = cudaIpcOpenEventHandle(&e, h);
  if (r == cudaSuccess) *event = e;
  return r;
}

int EventRecord(void* event, void* stream) {
  return cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
}
int EventSynchronize(void* event) { return cudaEventSynchronize(static_cast<cudaEvent_t>(event)); }
int StreamWaitEvent(void* stream, void* event) {
  return cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0);
}
int DeviceSynchronize() { return cudaDeviceSynchronize(); }

}  // namespace cuda_ipc
}  // namespace statecache
