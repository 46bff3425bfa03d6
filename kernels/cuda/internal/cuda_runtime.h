// Thin wrappers over the CUDA runtime for host code that must not see CUDA
// types (headers included by .cc files stay CUDA-free). Each returns a
// cudaError_t value as int (0 = success); streams and events are opaque
// void* handles. Thread-safe as the CUDA runtime is.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_RUNTIME_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_RUNTIME_H_

#include <cstdint>
#include <string>

namespace statecache {
namespace cuda_internal {

struct DeviceInfo {
  std::string name;
  int64_t total_bytes = 0;
  int multiprocessors = 0;
  int l2_bytes = 0;
  int cc_major = 0;
  int cc_minor = 0;
};

const char* ErrorString(int code);
int GetDeviceCount(int* count);
int GetDeviceInfo(int device, DeviceInfo* info);
int SetDevice(int device);
int Malloc(void** ptr, int64_t bytes);
int Free(void* ptr);
int MemGetInfo(int64_t* free_bytes, int64_t* total_bytes);
// Synchronous copies (complete on return).
int CopyHostToDevice(void* dst, const void* src, int64_t bytes);
int CopyDeviceToHost(void* dst, const void* src, int64_t bytes);
// Stream-ordered operations.
int CopyHostToDeviceAsync(void* dst, const void* src, int64_t bytes, void* stream);
int MemsetAsync(void* dst, int value, int64_t bytes, void* stream);
int CopyDeviceToHostAsync(void* dst, const void* src, int64_t bytes, void* stream);
int CopyDeviceToDeviceAsync(void* dst, const void* src, int64_t bytes, void* stream);
int StreamCreate(void** stream);
int StreamDestroy(void* stream);
int StreamSynchronize(void* stream);
// cudaStreamQuery: 0 when every operation enqueued on `stream` completed,
// kErrorNotReady while some are pending, another cudaError_t on failure.
inline constexpr int kErrorNotReady = 600;  // cudaErrorNotReady
int StreamQuery(void* stream);
// Later work on `stream` waits (on the device) for `event`'s last record.
int StreamWaitEvent(void* stream, void* event);
int DeviceSynchronize();
// Host memory that CopyDeviceToHostAsync can target without staging.
int HostAllocPinned(void** ptr, int64_t bytes);
int HostFreePinned(void* ptr);
// Events (timing in the benchmark; timing = false: ordering only, cheaper;
// blocking_sync: EventSynchronize sleeps until the GPU signals instead of
// spinning).
int EventCreate(void** event, bool timing = true, bool blocking_sync = false);
int EventDestroy(void* event);
int EventRecord(void* event, void* stream);
int EventSynchronize(void* event);
int EventElapsedMs(void* start, void* stop, float* ms);
// CUDA graphs (the benchmark times launch sequences the way serving engines
// replay them): capture the work enqueued on `stream` between Begin and End
// (thread-local capture mode) into an executable graph.
int GraphCaptureBegin(void* stream);
int GraphCaptureEnd(void* stream, void** graph_exec);
int GraphLaunch(void* graph_exec, void* stream);
int GraphExecDestroy(void* graph_exec);

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_RUNTIME_H_
