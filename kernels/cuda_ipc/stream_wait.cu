#include "kernels/cuda_ipc/stream_wait.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>

namespace statecache {
namespace stream_wait {
namespace {

using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct Driver {
  bool device = false;
  WaitValue32Fn wait32 = nullptr;  // through the runtime (no libcuda link)
  std::atomic<bool> wait32_failed{false};
};

Driver& GetDriver() {
  static Driver* d = [] {
    auto* r = new Driver();
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      return r;
    }
    r->device = true;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess && fn != nullptr) {
      r->wait32 = reinterpret_cast<WaitValue32Fn>(fn);
    } else {
      cudaGetLastError();
    }
    return r;
  }();
  return *d;
}

__global__ void PollGeqKernel(const volatile uint32_t* word, uint32_t value) {
  while (static_cast<int32_t>(*word - value) < 0) __nanosleep(256);
}

__global__ void StoreWordKernel(unsigned long long* word, unsigned long long value) {
  atomicMax(word, value);
  __threadfence_system();
}

__global__ void GateKernel(const volatile uint32_t* words, uint32_t value, uint32_t* abort_word) {
  while (static_cast<int32_t>(words[0] - value) < 0) __nanosleep(128);
  if (words[1] != 0) *abort_word = 0x7fc00000u;  // NaN: the update's validation fails
}

}  // namespace

int AllocGateWords(uint32_t** words) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, 64, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) return e;
  *words = static_cast<uint32_t*>(p);
  (*words)[0] = 0;
  (*words)[1] = 0;
  return cudaSuccess;
}

int FreeGateWords(uint32_t* words) { return cudaFreeHost(words); }

int StreamGate(void* stream, const uint32_t* words, uint32_t value, void* abort_word) {
  void* dev = nullptr;
  if (cudaError_t e = cudaHostGetDevicePointer(&dev, const_cast<uint32_t*>(words), 0);
      e != cudaSuccess) {
    return e;
  }
  GateKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const volatile uint32_t*>(dev), value, static_cast<uint32_t*>(abort_word));
  return cudaGetLastError();
}

int EventQuery(void* event) { return cudaEventQuery(static_cast<cudaEvent_t>(event)); }

int StreamStoreWord(void* stream, void* device_word, uint64_t value) {
  StoreWordKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<unsigned long long*>(device_word), static_cast<unsigned long long>(value));
  return cudaGetLastError();
}

int ReleaseWord(void* device_word, uint64_t value) {
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
      cudaGetLastError();
      return static_cast<cudaStream_t>(nullptr);
    }
    return s;
  }();
  if (stream == nullptr) return cudaErrorNotReady;
  if (int e = StreamStoreWord(stream, device_word, value); e != cudaSuccess) return e;
  return cudaStreamSynchronize(stream);
}

int CreateWorkerStream(void** stream) {
  cudaStream_t s = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *stream = e == cudaSuccess ? s : nullptr;
  return e;
}

int DestroyWorkerStream(void* stream) {
  if (stream == nullptr) return cudaSuccess;
  const cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  const cudaError_t d = cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  return e != cudaSuccess ? e : d;
}

int StreamWaitGeq(void* stream, const void* device_word, uint32_t value) {
  Driver& d = GetDriver();
  if (!d.device) return cudaErrorNoDevice;
  if (d.wait32 != nullptr && !d.wait32_failed.load(std::memory_order_relaxed)) {
    const CUresult r = d.wait32(static_cast<CUstream>(stream),
                                reinterpret_cast<CUdeviceptr>(device_word), value,
                                CU_STREAM_WAIT_VALUE_GEQ);
    if (r == CUDA_SUCCESS) return cudaSuccess;
    // Not supported by this device / driver (not a sticky error): poll.
    d.wait32_failed.store(true, std::memory_order_relaxed);
  }
  PollGeqKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const volatile uint32_t*>(device_word), value);
  return cudaGetLastError();
}

const char* Mechanism() {
  Driver& d = GetDriver();
  if (!d.device) return "none";
  return d.wait32 != nullptr && !d.wait32_failed.load() ? "cuStreamWaitValue32" : "polling kernel";
}

}  // namespace stream_wait
}  // namespace statecache
