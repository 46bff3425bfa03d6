// Device layout of a StreamOps error record on CUDA (kernels/backend/
// stream_ops.h), shared by the validation kernel (op_validation.cu) and the
// binding (cuda_stream_ops.cc). int32 words:
//   [0, kRecordHeaderWords)           header (RecordWord)
//   sticky  [kOpFields]               the first failed call's fields
//   verdict [kOpFields]               the latest call's fields (its op kernel
//                                     reads the first kNumValidationFields)
//   scratch [kOpFields]               written by a call's validation CTAs,
//                                     kNoError between calls
//   src bitmap [BitmapWords(capacity)] zero between calls
//   dst bitmap [BitmapWords(capacity)] zero between calls
// Field words hold the first bad index or kNoError (kernel_params.h).
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_OP_RECORD_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_OP_RECORD_H_

#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/cuda/internal/kernel_params.h"

namespace statecache {
namespace cuda_internal {

enum RecordWord : int {
  kRecordMagic = 0,     // kCudaRecordMagic once initialized
  kRecordCapacity,      // slots the bitmaps cover
  kRecordFailedCalls,   // calls that failed validation since the last reset
  kRecordFirstOp,       // StreamOp of the first failed call (0 = none)
  kRecordFirstLayer,    // its layer (-1 for pack / unpack / copy)
  kRecordFirstSlot,     // the offending slot value of a slot error
  kRecordCtaCounter,    // validation CTAs done in the running call
  kRecordFirstPoolSlots,  // the pool size of the first failed call
  kRecordHeaderWords = 8,
};
inline constexpr int32_t kCudaRecordMagic = 0x53435232;  // "SCR2"

// A destination slot that is also a source of the same copy (copy only).
inline constexpr int kErrDstIsSource = kNumValidationFields;
// The pool's fence word was set (PoolView::fence): index 0.
inline constexpr int kErrFenced = kNumValidationFields + 1;
inline constexpr int kOpFields = kNumValidationFields + 2;

inline constexpr int64_t kRecordStickyWord = kRecordHeaderWords;
inline constexpr int64_t kRecordVerdictWord = kRecordStickyWord + kOpFields;
inline constexpr int64_t kRecordScratchWord = kRecordVerdictWord + kOpFields;
inline constexpr int64_t kRecordBitmapWord = (kRecordScratchWord + kOpFields + 3) / 4 * 4;

SC_HD int64_t RecordBitmapWords(int64_t capacity) { return (capacity + 31) / 32; }
SC_HD int64_t CudaRecordBytes(int64_t capacity) {
  return (kRecordBitmapWord + 2 * RecordBitmapWords(capacity)) * 4;
}

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_OP_RECORD_H_
