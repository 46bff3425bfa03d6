#include "kernels/cuda_ipc/cuda_interprocess.h"

#include <string>
#include <utility>

#include "kernels/backend/backend.h"
#include "kernels/common/status_macros.h"
#include "kernels/cuda_ipc/cuda_status.h"
#include "kernels/cuda_ipc/ipc_runtime.h"
#include "kernels/cuda_ipc/stream_wait.h"

namespace statecache {
namespace {

// A device allocation: made here (Allocate; freed) or another process's,
// mapped (Open; unmapped).
class CudaIpcBuffer : public InterprocessBuffer {
 public:
  CudaIpcBuffer(uint8_t* data, int64_t size, std::string handle, bool owned)
      : data_(data), size_(size), handle_(std::move(handle)), owned_(owned) {}
  ~CudaIpcBuffer() override {
    if (data_ == nullptr) return;
    if (owned_) {
      cuda_ipc::Free(data_);
    } else {
      cuda_ipc::CloseMemHandle(data_);
    }
  }
  uint8_t* data() const override { return data_; }
  int64_t size() const override { return size_; }
  const std::string& handle() const override { return handle_; }
  absl::Status Write(int64_t offset, const void* host, int64_t bytes) override {
    return CudaStatus(cuda_ipc::CopyHostToDevice(data_ + offset, host, bytes), "write");
  }
  absl::Status Read(int64_t offset, void* host, int64_t bytes) const override {
    return CudaStatus(cuda_ipc::CopyDeviceToHost(host, data_ + offset, bytes), "read");
  }

 private:
  uint8_t* const data_;
  const int64_t size_;
  const std::string handle_;
  const bool owned_;
};

// An interprocess event (created here or opened from another process's
// handle; both are released with cudaEventDestroy).
class CudaIpcEvent : public InterprocessEvent {
 public:
  CudaIpcEvent(void* event, std::string handle) : event_(event), handle_(std::move(handle)) {}
  ~CudaIpcEvent() override { cuda_ipc::EventDestroy(event_); }
  const std::string& handle() const override { return handle_; }
  absl::Status Record(void* stream) override {
    return CudaStatus(cuda_ipc::EventRecord(event_, stream), "record an interprocess event");
  }
  absl::Status Synchronize() override {
    return CudaStatus(cuda_ipc::EventSynchronize(event_), "wait for an interprocess event");
  }
  absl::Status StreamWait(void* stream) override {
    return CudaStatus(cuda_ipc::StreamWaitEvent(stream, event_),
                      "make a stream wait for an interprocess event");
  }
  absl::StatusOr<bool> Query() override {
    const int rc = stream_wait::EventQuery(event_);
    if (rc == kNotReady) return false;
    if (rc != 0) return CudaStatus(rc, "query an interprocess event");
    return true;
  }

 private:
  static constexpr int kNotReady = 600;  // cudaErrorNotReady
  void* const event_;
  const std::string handle_;
};

// Two words of pinned, mapped host memory: [0] the gate, [1] the abort flag.
class CudaGate : public StreamGate {
 public:
  explicit CudaGate(uint32_t* words) : words_(words) {}
  ~CudaGate() override { stream_wait::FreeGateWords(words_); }
  absl::Status Enqueue(void* stream, uint32_t value, void* abort_word) override {
    return CudaStatus(stream_wait::StreamGate(stream, words_, value, abort_word),
                      "enqueue a gate kernel");
  }
  void Release(uint32_t value) override { __atomic_store_n(&words_[0], value, __ATOMIC_SEQ_CST); }
  void SetAbort() override { __atomic_store_n(&words_[1], uint32_t{1}, __ATOMIC_SEQ_CST); }

 private:
  uint32_t* const words_;
};

class CudaInterprocess : public Interprocess {
 public:
  Transport transport() const override { return Transport::kCudaIpc; }
  bool uses_events() const override { return true; }
  bool host_accessible() const override { return false; }
  int handle_bytes() const override { return cuda_ipc::kHandleBytes; }

  absl::StatusOr<std::unique_ptr<InterprocessBuffer>> Allocate(int64_t bytes) override {
    void* p = nullptr;
    RETURN_IF_ERROR(CudaStatus(cuda_ipc::Malloc(&p, bytes), "cudaMalloc"));
    std::string handle;
    if (absl::Status st = CudaStatus(cuda_ipc::GetMemHandle(p, &handle), "IPC handle");
        !st.ok()) {
      cuda_ipc::Free(p);
      return st;
    }
    return std::unique_ptr<InterprocessBuffer>(
        new CudaIpcBuffer(static_cast<uint8_t*>(p), bytes, std::move(handle), /*owned=*/true));
  }

  absl::StatusOr<std::unique_ptr<InterprocessBuffer>> Open(const std::string& handle,
                                                           int64_t bytes, bool /*unlink_name*/,
                                                           absl::string_view field) override {
    void* p = nullptr;
    RETURN_IF_ERROR(CudaStatus(cuda_ipc::OpenMemHandle(handle, &p), field,
                               absl::StatusCode::kInvalidArgument));
    return std::unique_ptr<InterprocessBuffer>(
        new CudaIpcBuffer(static_cast<uint8_t*>(p), bytes, handle, /*owned=*/false));
  }

  absl::StatusOr<std::string> Export(const BackendBuffer& buffer) override {
    std::string handle;
    RETURN_IF_ERROR(CudaStatus(cuda_ipc::GetMemHandle(buffer.data(), &handle),
                               "arena IPC handle", absl::StatusCode::kInvalidArgument));
    return handle;
  }

  absl::StatusOr<std::unique_ptr<InterprocessEvent>> CreateEvent() override {
    void* e = nullptr;
    RETURN_IF_ERROR(
        CudaStatus(cuda_ipc::EventCreateInterprocess(&e), "create an interprocess event"));
    std::string handle;
    if (absl::Status st = CudaStatus(cuda_ipc::GetEventHandle(e, &handle), "event handle");
        !st.ok()) {
      cuda_ipc::EventDestroy(e);
      return st;
    }
    return std::unique_ptr<InterprocessEvent>(new CudaIpcEvent(e, std::move(handle)));
  }

  absl::StatusOr<std::unique_ptr<InterprocessEvent>> OpenEvent(
      const std::string& handle, absl::string_view field) override {
    void* e = nullptr;
    RETURN_IF_ERROR(CudaStatus(cuda_ipc::OpenEventHandle(handle, &e), field,
                               absl::StatusCode::kInvalidArgument));
    return std::unique_ptr<InterprocessEvent>(new CudaIpcEvent(e, handle));
  }

  absl::StatusOr<std::unique_ptr<StreamGate>> NewGate() override {
    uint32_t* words = nullptr;
    RETURN_IF_ERROR(CudaStatus(stream_wait::AllocGateWords(&words), "allocate gate words"));
    return std::unique_ptr<StreamGate>(new CudaGate(words));
  }

  absl::Status StoreWord(void* word, uint64_t value, void* stream) override {
    return CudaStatus(stream_wait::StreamStoreWord(stream, word, value), "store the done word");
  }
  absl::Status ReleaseWord(void* word, uint64_t value) override {
    return CudaStatus(stream_wait::ReleaseWord(word, value), "release waiters");
  }
  absl::Status StreamWaitWord(void* stream, const void* word, uint32_t value) override {
    return CudaStatus(stream_wait::StreamWaitGeq(stream, word, value), "stream wait");
  }
  absl::Status SynchronizeDevice() override {
    return CudaStatus(cuda_ipc::DeviceSynchronize(), "wait for device work");
  }
};

}  // namespace

std::unique_ptr<Interprocess> NewCudaInterprocess() {
  return std::make_unique<CudaInterprocess>();
}

}  // namespace statecache
