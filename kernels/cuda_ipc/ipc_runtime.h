// CUDA IPC for the data plane (issue 10): memory and event handles shared
// between a worker process and statecached on the same GPU.
//
// Plain C++ (no CUDA types): handles travel as 64-byte strings
// (cudaIpcMemHandle_t / cudaIpcEventHandle_t), events as opaque void*. Every
// function returns a cudaError_t value as int (0 = success; ErrorString
// names it). A handle can only be opened in ANOTHER process than the one that
// exported it (CUDA refuses the exporting process itself).
//
//   exporter:  Malloc(&p, n); GetMemHandle(p, &h); EventCreateInterprocess(&e);
//              GetEventHandle(e, &eh);   -> send h, eh
//   importer:  OpenMemHandle(h, &q); OpenEventHandle(eh, &f);
//              EventSynchronize(f); ... read q ...; CloseMemHandle(q);
#ifndef STATECACHE_KERNELS_CUDA_IPC_IPC_RUNTIME_H_
#define STATECACHE_KERNELS_CUDA_IPC_IPC_RUNTIME_H_

#include <cstdint>
#include <string>

namespace statecache {
namespace cuda_ipc {

inline constexpr int kHandleBytes = 64;

const char* ErrorString(int code);
// Number of visible devices (0 without a driver / GPU; never fails hard).
int DeviceCount();
int Malloc(void** ptr, int64_t bytes);
int Free(void* ptr);
int CopyHostToDevice(void* dst, const void* src, int64_t bytes);
int CopyDeviceToHost(void* dst, const void* src, int64_t bytes);

// Handle of the allocation whose base is `device_ptr`.
int GetMemHandle(void* device_ptr, std::string* handle);
// Maps another process's allocation (cudaIpcMemLazyEnablePeerAccess).
int OpenMemHandle(const std::string& handle, void** device_ptr);
int CloseMemHandle(void* device_ptr);

// An event usable across processes (cudaEventInterprocess |
// cudaEventDisableTiming).
int EventCreateInterprocess(void** event);
int EventDestroy(void* event);
int GetEventHandle(void* event, std::string* handle);
int OpenEventHandle(const std::string& handle, void** event);
// Records on `stream` (nullptr = the legacy default stream).
int EventRecord(void* event, void* stream);
int EventSynchronize(void* event);
int StreamWaitEvent(void* stream, void* event);
int DeviceSynchronize();

}  // namespace cuda_ipc
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_IPC_IPC_RUNTIME_H_
