// CpuBackend: the CPU reference implementation of Backend, and the CPU
// serving backend.
//
// Memory is 256-byte-aligned host memory. Each (slot, head) item of a batch
// is decoded with DecodeHead, updated in FP32 by HeadStep and re-encoded with
// EncodeHead (kernels/formats/head_codec.h), on a thread pool. Inputs are
// validated on the host before anything is written (batch_validation.h).
//
//   auto backend = CpuBackend::Create({.threads = 4});
#ifndef STATECACHE_KERNELS_CPU_CPU_BACKEND_H_
#define STATECACHE_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>
#include <string>

#include "kernels/backend/backend.h"
#include "kernels/backend/interprocess.h"
#include "kernels/backend/pinned_memory.h"
#include "kernels/backend/sync_stream_ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/shm/shm_interprocess.h"

namespace statecache {

class CpuBackend : public Backend {
 public:
  struct Options {
    // Worker threads; 0 = hardware concurrency.
    int threads = 0;
  };
  static std::unique_ptr<CpuBackend> Create(const Options& options);

  const char* name() const override { return "cpu"; }
  std::string Describe() const override;
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(int64_t bytes) override;
  absl::StatusOr<int64_t> AvailableBytes() const override;
  bool host_memory() const override { return true; }
  absl::Status CopyIn(void* backend_dst, const void* host_src, int64_t bytes) override;
  absl::Status CopyOut(void* host_dst, const void* backend_src, int64_t bytes) override;
  absl::Status CopyWithin(void* dst, const void* src, int64_t bytes) override;
  absl::StatusOr<std::unique_ptr<PreparedModel>> Prepare(const StateLayout& layout) override;
  absl::Status DecodeUpdate(const PreparedModel& model, const PoolView& pool, int layer,
                            const DecodeInputs& in) override;
  absl::Status Prefill(const PreparedModel& model, const PoolView& pool, int layer,
                       const PrefillInputs& in) override;
  absl::Status PackStates(const PreparedModel& model, const PoolView& pool, const int32_t* slots,
                          int n, const float* states) override;
  absl::Status UnpackStates(const PreparedModel& model, const PoolView& pool,
                            const int32_t* slots, int n, float* states) override;
  absl::Status CopySlots(const PoolView& src, const int32_t* src_slots, const PoolView& dst,
                         const int32_t* dst_slots, int n) override;
  absl::Status ZeroSlots(const PoolView& pool, const int32_t* slots, int n) override;
  // Synchronous, with the StreamOps record contract (sync_stream_ops.h).
  StreamOps& stream_ops() override { return stream_ops_; }
  // POSIX shared memory (kernels/shm/shm_interprocess.h).
  Interprocess* interprocess() override { return interprocess_.get(); }
  // Plain aligned host memory (page_locked() is false): backend memory is
  // host memory, so CopyIn / CopyOut are memcpy from any of it.
  PinnedMemory* pinned_memory() override { return pinned_.get(); }

 private:
  explicit CpuBackend(int threads);

  ThreadPool threads_;
  SyncStreamOps stream_ops_{*this};
  const std::unique_ptr<Interprocess> interprocess_ = NewSharedMemoryInterprocess();
  const std::unique_ptr<PinnedMemory> pinned_;
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CPU_CPU_BACKEND_H_
