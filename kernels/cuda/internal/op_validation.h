// Launchers of the StreamOps validation (op_record.h has the record layout).
// Asynchronous on `stream`, return a cudaError_t as int, trust their inputs
// (the binding, cuda_stream_ops.cc, checked sizes and the record capacity).
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_OP_VALIDATION_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_OP_VALIDATION_H_

#include <cstdint>

#include "kernels/cuda/internal/launchers.h"

namespace statecache {
namespace cuda_internal {

struct OpValidationParams {
  int32_t* record = nullptr;           // device record (op_record.h), capacity >= num_slots
  int op = 0;                          // StreamOp, stored with the first failure
  int layer = -1;
  const int32_t* slots = nullptr;      // [n]: -1 or [0, num_slots), no repeats; copy: sources
                                       // (repeats allowed)
  const int32_t* dst_slots = nullptr;  // [n] copy destinations or nullptr
  int n = 0;
  int64_t num_slots = 0;
  const int32_t* fence = nullptr;      // PoolView::fence: nonzero fails the call
  ValueChecks values;                  // value checks (fields kErrQ ... kErrStates)
};

// One validation kernel: the slot checks and value checks of one call write
// the record's scratch block; its last CTA to finish moves scratch into the
// verdict (which the call's op kernel reads), merges a failure into the
// sticky block and the failed-call count, and clears scratch and bitmaps for
// the next call.
int LaunchValidateOp(const OpValidationParams& p, void* stream);

// Writes an empty record of `capacity` slots.
int LaunchInitRecord(int32_t* record, int64_t capacity, void* stream);

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_OP_VALIDATION_H_
