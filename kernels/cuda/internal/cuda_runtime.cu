#include "kernels/cuda/internal/cuda_runtime.h"

#include <cuda_runtime.h>

namespace statecache {
namespace cuda_internal {

static_assert(kErrorNotReady == cudaErrorNotReady, "kErrorNotReady");

const char* ErrorString(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int GetDeviceCount(int* count) {
  *count = 0;
  return cudaGetDeviceCount(count);
}

int GetDeviceInfo(int device, DeviceInfo* info) {
  cudaDeviceProp prop;
  const cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) return e;
  info->name = prop.name;
  info->total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info->multiprocessors = prop.multiProcessorCount;
  info->l2_bytes = prop.l2CacheSize;
  info->cc_major = prop.major;
  info->cc_minor = prop.minor;
  return cudaSuccess;
}

int SetDevice(int device) { return cudaSetDevice(device); }
int Malloc(void** ptr, int64_t bytes) { return cudaMalloc(ptr, static_cast<size_t>(bytes)); }
int Free(void* ptr) { return cudaFree(ptr); }

int MemGetInfo(int64_t* free_bytes, int64_t* total_bytes) {
  size_t f = 0, t = 0;
  const cudaError_t e = cudaMemGetInfo(&f, &t);
  *free_bytes = static_cast<int64_t>(f);
  *total_bytes = static_cast<int64_t>(t);
  return e;
}

int CopyHostToDevice(void* dst, const void* src, int64_t bytes) {
  return cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice);
}
int CopyDeviceToHost(void* dst, const void* src, int64_t bytes) {
  return cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost);
}
int CopyHostToDeviceAsync(void* dst, const void* src, int64_t bytes, void* stream) {
  return cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                         static_cast<cudaStream_t>(stream));
}
int MemsetAsync(void* dst, int value, int64_t bytes, void* stream) {
  return cudaMemsetAsync(dst, value, static_cast<size_t>(bytes), static_cast<cudaStream_t>(stream));
}
int CopyDeviceToHostAsync(void* dst, const void* src, int64_t bytes, void* stream) {
  return cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                         static_cast<cudaStream_t>(stream));
}
int CopyDeviceToDeviceAsync(void* dst, const void* src, int64_t bytes, void* stream) {
  return cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                         static_cast<cudaStream_t>(stream));
}
int StreamCreate(void** stream) {
  cudaStream_t s = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *stream = s;
  return e;
}
int StreamDestroy(void* stream) { return cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }
int StreamSynchronize(void* stream) {
  return cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
}
int StreamQuery(void* stream) { return cudaStreamQuery(static_cast<cudaStream_t>(stream)); }
int StreamWaitEvent(void* stream, void* event) {
  return cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0);
}
int DeviceSynchronize() { return cudaDeviceSynchronize(); }
int HostAllocPinned(void** ptr, int64_t bytes) {
  return cudaMallocHost(ptr, static_cast<size_t>(bytes));
}
int HostFreePinned(void* ptr) { return cudaFreeHost(ptr); }
int EventCreate(void** event, bool timing, bool blocking_sync) {
  cudaEvent_t e = nullptr;
  const unsigned flags = (timing ? cudaEventDefault : cudaEventDisableTiming) |
                         (blocking_sync ? cudaEventBlockingSync : 0u);
  const cudaError_t r = cudaEventCreateWithFlags(&e, flags);
  *event = e;
  return r;
}
int EventDestroy(void* event) { return cudaEventDestroy(static_cast<cudaEvent_t>(event)); }
int EventRecord(void* event, void* stream) {
  return cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
}
int EventSynchronize(void* event) { return cudaEventSynchronize(static_cast<cudaEvent_t>(event)); }
int EventElapsedMs(void* start, void* stop, float* ms) {
  return cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop));
}
int GraphCaptureBegin(void* stream) {
  return cudaStreamBeginCapture(static_cast<cudaStream_t>(stream),
                                cudaStreamCaptureModeThreadLocal);
}
int GraphCaptureEnd(void* stream, void** graph_exec) {
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
  if (e != cudaSuccess) return e;
  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  *graph_exec = exec;
  return e;
}
int GraphLaunch(void* graph_exec, void* stream) {
  return cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_exec),
                         static_cast<cudaStream_t>(stream));
}
int GraphExecDestroy(void* graph_exec) {
  return cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_exec));
}

}  // namespace cuda_internal
}  // namespace statecache
