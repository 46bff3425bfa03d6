#include "kernels/backend/pinned_memory.h"

#include <algorithm>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend/backend.h"

namespace statecache {
namespace {

class PlainHostBuffer : public BackendBuffer {
 public:
  PlainHostBuffer(uint8_t* data, int64_t size) : data_(data), size_(size) {}
  ~PlainHostBuffer() override { std::free(data_); }
  uint8_t* data() const override { return data_; }
  int64_t size() const override { return size_; }

 private:
  uint8_t* data_;
  int64_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BackendBuffer>> PlainHostMemory::AllocatePinned(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("bytes: ", bytes, " is negative"));
  const int64_t rounded = std::max<int64_t>(256, (bytes + 255) / 256 * 256);
  void* p = std::aligned_alloc(256, static_cast<size_t>(rounded));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host memory: cannot allocate ", bytes, " bytes"));
  }
  return std::unique_ptr<BackendBuffer>(new PlainHostBuffer(static_cast<uint8_t*>(p), bytes));
}

PinnedMemory* PinnedOrPlain(PinnedMemory* backend_pinned) {
  static PlainHostMemory* const plain = new PlainHostMemory();
  return backend_pinned != nullptr ? backend_pinned : plain;
}

}  // namespace statecache
