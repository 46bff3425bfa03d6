// FakeBackend: a TEST-ONLY Backend with real memory operations and no math.
//
// Allocate / CopyIn / CopyOut / CopySlots / ZeroSlots work on aligned host
// memory exactly as the contract says; Prepare returns a layout holder; the
// compute calls (DecodeUpdate, Prefill, PackStates, UnpackStates) return
// kUnimplemented. Pool and checkpoint tests need only memory; anything that
// checks numbers uses the real CPU backend (CreateBackend("cpu")).
//
// `memory_limit` caps the total bytes live at once (kResourceExhausted
// beyond), so tests can exercise allocation failures.
#ifndef STATECACHE_SERVER_POOL_TESTING_FAKE_BACKEND_H_
#define STATECACHE_SERVER_POOL_TESTING_FAKE_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "kernels/backend/backend.h"
#include "kernels/backend/sync_stream_ops.h"

namespace statecache {
namespace testing {

class FakeBackend : public Backend {
 public:
  explicit FakeBackend(int64_t memory_limit = std::numeric_limits<int64_t>::max())
      : limit_(memory_limit) {}

  const char* name() const override { return "fake"; }
  std::string Describe() const override { return "fake test backend (host memory, no math)"; }
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(int64_t bytes) override;
  absl::StatusOr<int64_t> AvailableBytes() const override { return limit_ - live_.load(); }
  absl::Status CopyIn(void* dst, const void* src, int64_t bytes) override;
  absl::Status CopyOut(void* dst, const void* src, int64_t bytes) override;
  // In place (not counted in bytes_in / bytes_out).
  absl::Status CopyWithin(void* dst, const void* src, int64_t bytes) override;
  absl::StatusOr<std::unique_ptr<PreparedModel>> Prepare(const StateLayout& layout) override;
  absl::Status DecodeUpdate(const PreparedModel&, const PoolView&, int,
                            const DecodeInputs&) override;
  absl::Status Prefill(const PreparedModel&, const PoolView&, int, const PrefillInputs&) override;
  absl::Status PackStates(const PreparedModel&, const PoolView&, const int32_t*, int,
                          const float*) override;
  absl::Status UnpackStates(const PreparedModel&, const PoolView&, const int32_t*, int,
                            float*) override;
  absl::Status CopySlots(const PoolView& src, const int32_t* src_slots, const PoolView& dst,
                         const int32_t* dst_slots, int n) override;
  absl::Status ZeroSlots(const PoolView& pool, const int32_t* slots, int n) override;
  StreamOps& stream_ops() override { return stream_ops_; }

  // Bytes currently allocated.
  int64_t live_bytes() const { return live_.load(); }
  // Number of CopySlots calls so far.
  int64_t copy_calls() const { return copy_calls_.load(); }
  // Bytes moved by CopyIn / CopyOut so far (host <-> backend).
  int64_t bytes_in() const { return bytes_in_.load(); }
  int64_t bytes_out() const { return bytes_out_.load(); }

 private:
  friend class FakeBuffer;
  const int64_t limit_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> copy_calls_{0};
  std::atomic<int64_t> bytes_in_{0};
  std::atomic<int64_t> bytes_out_{0};
  SyncStreamOps stream_ops_{*this};
};

}  // namespace testing
}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_TESTING_FAKE_BACKEND_H_
