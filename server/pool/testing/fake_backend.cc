#include "server/pool/testing/fake_backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace statecache {
namespace testing {

class FakeBuffer : public BackendBuffer {
 public:
  FakeBuffer(FakeBackend* owner, uint8_t* data, int64_t size)
      : owner_(owner), data_(data), size_(size) {}
  ~FakeBuffer() override {
    std::free(data_);
    owner_->live_ -= size_;
  }
  uint8_t* data() const override { return data_; }
  int64_t size() const override { return size_; }

 private:
  FakeBackend* owner_;
  uint8_t* data_;
  int64_t size_;
};

namespace {

class FakePrepared : public PreparedModel {
 public:
  explicit FakePrepared(const StateLayout& layout) : layout_(layout) {}
  const StateLayout& layout() const override { return layout_; }

 private:
  StateLayout layout_;
};

absl::Status NoMath(const char* what) {
  return absl::UnimplementedError(absl::StrCat("FakeBackend has no ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BackendBuffer>> FakeBackend::Allocate(int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError("bytes: must be > 0");
  if (live_.load() + bytes > limit_) {
    return absl::ResourceExhaustedError(absl::StrCat("fake backend: ", bytes,
                                                     " bytes exceed the limit"));
  }
  const int64_t rounded = (bytes + 255) / 256 * 256;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(256, rounded));
  if (p == nullptr) return absl::ResourceExhaustedError("fake backend: out of memory");
  std::memset(p, 0, rounded);
  live_ += bytes;
  return std::unique_ptr<BackendBuffer>(new FakeBuffer(this, p, bytes));
}

absl::Status FakeBackend::CopyIn(void* dst, const void* src, int64_t bytes) {
  bytes_in_ += bytes;
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status FakeBackend::CopyOut(void* dst, const void* src, int64_t bytes) {
  bytes_out_ += bytes;
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status FakeBackend::CopyWithin(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("bytes: negative");
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PreparedModel>> FakeBackend::Prepare(const StateLayout& layout) {
  return std::unique_ptr<PreparedModel>(new FakePrepared(layout));
}

absl::Status FakeBackend::DecodeUpdate(const PreparedModel&, const PoolView&, int,
                                       const DecodeInputs&) {
  return NoMath("DecodeUpdate");
}
absl::Status FakeBackend::Prefill(const PreparedModel&, const PoolView&, int,
                                  const PrefillInputs&) {
  return NoMath("Prefill");
}
absl::Status FakeBackend::PackStates(const PreparedModel&, const PoolView&, const int32_t*, int,
                                     const float*) {
  return NoMath("PackStates");
}
absl::Status FakeBackend::UnpackStates(const PreparedModel&, const PoolView&, const int32_t*, int,
                                       float*) {
  return NoMath("UnpackStates");
}

absl::Status FakeBackend::CopySlots(const PoolView& src, const int32_t* src_slots,
                                    const PoolView& dst, const int32_t* dst_slots, int n) {
  ++copy_calls_;
  if (src.slot_bytes() != dst.slot_bytes()) {
    return absl::InvalidArgumentError("slot_bytes: pools differ");
  }
  for (int i = 0; i < n; ++i) {
    if (src_slots[i] < 0 || src_slots[i] >= src.num_slots || dst_slots[i] < 0 ||
        dst_slots[i] >= dst.num_slots) {
      return absl::InvalidArgumentError("slots: index out of range");
    }
  }
  for (int i = 0; i < n; ++i) {
    std::memmove(dst.slot(dst_slots[i]), src.slot(src_slots[i]), src.slot_bytes());
  }
  return absl::OkStatus();
}

absl::Status FakeBackend::ZeroSlots(const PoolView& pool, const int32_t* slots, int n) {
  for (int i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] >= pool.num_slots) {
      return absl::InvalidArgumentError("slots: index out of range");
    }
  }
  for (int i = 0; i < n; ++i) std::memset(pool.slot(slots[i]), 0, pool.slot_bytes());
  return absl::OkStatus();
}

}  // namespace testing
}  // namespace statecache
