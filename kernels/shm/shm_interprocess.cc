#include "kernels/shm/shm_interprocess.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/common/status_macros.h"
#include "kernels/shm/shm_region.h"

namespace statecache {
namespace {

// Slot arena in POSIX shared memory (host memory: CPU backend only).
class SharedArenaBuffer : public BackendBuffer {
 public:
  explicit SharedArenaBuffer(std::unique_ptr<SharedMemoryRegion> region)
      : region_(std::move(region)) {}
  uint8_t* data() const override { return region_->data(); }
  int64_t size() const override { return region_->size(); }
  const std::string& name() const { return region_->name(); }

 private:
  std::unique_ptr<SharedMemoryRegion> region_;
};

class ShmBuffer : public InterprocessBuffer {
 public:
  explicit ShmBuffer(std::unique_ptr<SharedMemoryRegion> region) : region_(std::move(region)) {}
  uint8_t* data() const override { return region_->data(); }
  int64_t size() const override { return region_->size(); }
  const std::string& handle() const override { return region_->name(); }
  absl::Status Write(int64_t offset, const void* host, int64_t bytes) override {
    std::memcpy(region_->data() + offset, host, bytes);
    return absl::OkStatus();
  }
  absl::Status Read(int64_t offset, void* host, int64_t bytes) const override {
    std::memcpy(host, region_->data() + offset, bytes);
    return absl::OkStatus();
  }
  void Unlink() override { region_->Unlink(); }

 private:
  std::unique_ptr<SharedMemoryRegion> region_;
};

void RaiseWord(void* word, uint64_t value) {
  auto* w = static_cast<uint64_t*>(word);
  uint64_t old = __atomic_load_n(w, __ATOMIC_RELAXED);
  while (old < value &&
         !__atomic_compare_exchange_n(w, &old, value, /*weak=*/true, __ATOMIC_RELEASE,
                                      __ATOMIC_RELAXED)) {
  }
}

absl::Status NoEvents() {
  return absl::UnimplementedError(
      "shared memory: the messages order both processes' accesses (no events)");
}

class ShmInterprocess : public Interprocess {
 public:
  Transport transport() const override { return Transport::kSharedMemory; }
  bool uses_events() const override { return false; }
  bool host_accessible() const override { return true; }
  int handle_bytes() const override { return 0; }

  absl::StatusOr<std::unique_ptr<InterprocessBuffer>> Allocate(int64_t bytes) override {
    ASSIGN_OR_RETURN(std::unique_ptr<SharedMemoryRegion> region,
                     SharedMemoryRegion::Create(bytes));
    return std::unique_ptr<InterprocessBuffer>(new ShmBuffer(std::move(region)));
  }
  absl::StatusOr<std::unique_ptr<InterprocessBuffer>> Open(const std::string& handle,
                                                           int64_t bytes, bool unlink_name,
                                                           absl::string_view field) override {
    ASSIGN_OR_RETURN(std::unique_ptr<SharedMemoryRegion> region,
                     SharedMemoryRegion::Open(handle, bytes, unlink_name, field));
    return std::unique_ptr<InterprocessBuffer>(new ShmBuffer(std::move(region)));
  }
  absl::StatusOr<std::string> Export(const BackendBuffer& buffer) override {
    const auto* shared = dynamic_cast<const SharedArenaBuffer*>(&buffer);
    if (shared == nullptr) {
      return absl::FailedPreconditionError("the buffer is not in shared memory");
    }
    return shared->name();
  }
  absl::StatusOr<std::unique_ptr<InterprocessEvent>> CreateEvent() override {
    return NoEvents();
  }
  absl::StatusOr<std::unique_ptr<InterprocessEvent>> OpenEvent(
      const std::string& /*handle*/, absl::string_view /*field*/) override {
    return NoEvents();
  }
  absl::StatusOr<std::unique_ptr<StreamGate>> NewGate() override { return NoEvents(); }
  absl::Status StoreWord(void* word, uint64_t value, void* /*stream*/) override {
    RaiseWord(word, value);
    return absl::OkStatus();
  }
  absl::Status ReleaseWord(void* word, uint64_t value) override {
    RaiseWord(word, value);
    return absl::OkStatus();
  }
  absl::Status StreamWaitWord(void* /*stream*/, const void* /*word*/,
                              uint32_t /*value*/) override {
    return absl::UnimplementedError("shared memory: no device streams (the host waits)");
  }
  absl::Status SynchronizeDevice() override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Interprocess> NewSharedMemoryInterprocess() {
  return std::make_unique<ShmInterprocess>();
}

std::function<absl::StatusOr<std::unique_ptr<BackendBuffer>>(int64_t)> SharedArenaAllocator() {
  return [](int64_t bytes) -> absl::StatusOr<std::unique_ptr<BackendBuffer>> {
    ASSIGN_OR_RETURN(std::unique_ptr<SharedMemoryRegion> region,
                     SharedMemoryRegion::Create(std::max<int64_t>(bytes, 256)));
    return std::unique_ptr<BackendBuffer>(new SharedArenaBuffer(std::move(region)));
  };
}

}  // namespace statecache
