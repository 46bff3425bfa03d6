// CudaStreamOps: StreamOps (kernels/backend/stream_ops.h) on CUDA. Each call
// is two kernels on the caller's stream: the validation kernel
// (op_validation.h: slots and values into the record) and the op's kernel
// (fused recurrence, pack / unpack, copy), which reads the record's verdict
// after the grid dependency wait and writes nothing when it is set. The
// persistent decode kernels overlap the validation kernel: they load and
// compute while it runs and wait for it only before their first write
// (RecurrenceParams::defer_writes, grid_dependency.cuh). No host wait,
// allocation or host-to-device copy; capturable in CUDA graphs.
// Thread-safe (no mutable state); the record orders calls that share it.
// Launches use the LaunchOptions given at construction (the backend's).
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_STREAM_OPS_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_STREAM_OPS_H_

#include "kernels/backend/stream_ops.h"
#include "kernels/cuda/launch_options.h"

namespace statecache {
namespace cuda_internal {

class CudaStreamOps : public StreamOps {
 public:
  explicit CudaStreamOps(const LaunchOptions& options) : options_(options) {}

  int64_t RecordBytes(int64_t num_slots) const override;
  absl::Status InitRecord(const OpRecord& record, void* stream) override;
  absl::Status EnqueueDecode(const PreparedModel& model, const PoolView& pool, int layer,
                             const DecodeInputs& in, const OpRecord& record,
                             void* stream) override;
  absl::Status EnqueuePrefill(const PreparedModel& model, const PoolView& pool, int layer,
                              const PrefillInputs& in, const OpRecord& record,
                              void* stream) override;
  absl::Status EnqueuePack(const PreparedModel& model, const PoolView& pool, const int32_t* slots,
                           int n, const float* states, const OpRecord& record,
                           void* stream) override;
  absl::Status EnqueueUnpack(const PreparedModel& model, const PoolView& pool,
                             const int32_t* slots, int n, float* states, const OpRecord& record,
                             void* stream) override;
  absl::Status EnqueueCopySlots(const PoolView& pool, const int32_t* src_slots,
                                const int32_t* dst_slots, int n, const OpRecord& record,
                                void* stream) override;
  absl::Status CheckRecord(const OpRecord& record, void* stream, bool reset) override;

 private:
  const LaunchOptions options_;
};

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_CUDA_STREAM_OPS_H_
