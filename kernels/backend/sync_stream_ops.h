// SyncStreamOps: StreamOps (stream_ops.h) over a backend whose calls are
// synchronous and validated (the CPU backend, test backends): each call runs
// the backend's binding at once on the calling thread; a data error
// (kInvalidArgument from the binding, which then wrote nothing) goes into the
// record instead of being returned, so callers see the same contract as on
// CUDA. The record is RecordBytes() bytes of host memory.
#ifndef STATECACHE_KERNELS_BACKEND_SYNC_STREAM_OPS_H_
#define STATECACHE_KERNELS_BACKEND_SYNC_STREAM_OPS_H_

#include "kernels/backend/stream_ops.h"

namespace statecache {

class SyncStreamOps : public StreamOps {
 public:
  // `backend` must outlive this object and be synchronous.
  explicit SyncStreamOps(Backend& backend) : backend_(backend) {}

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
  // kInvalidArgument from a binding goes into the record (OK returned);
  // other errors are returned.
  absl::Status Record(const OpRecord& record, StreamOp op, int layer, absl::Status st);

  Backend& backend_;
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_BACKEND_SYNC_STREAM_OPS_H_
