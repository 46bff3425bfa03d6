// The fused decode / prefill kernels of the uniform and mixed formats, for
// the translation units that launch them (recurrence_kernel.cu,
// recurrence_kernel_affine.cu, through recurrence_launch.cuh). Everything has
// internal linkage, so each unit holds only the formats of its CUDA unit
// (the format table, kernels/formats/format.h).
//
// Every kernel keeps each lane's 4 x 16 slice of a head in registers from
// the decode to the encode (the head is read once and written once) and runs
// TokenStep (decode_math.h's arithmetic). Which one a call takes is
// LaunchT's choice (recurrence_launch.cuh):
//   PipelinedDecodeKernel  decode (T = 1) with 16-byte aligned inputs: the
//                          serving path (pipelined_decode_kernel.cuh)
//   StagedFpDecodeKernel   the same for fixed-shape fp32 heads, on column
//                          halves (staged_decode_kernel.cuh)
//   RecurrenceKernel       prefill and every other decode step
//                          (recurrence_direct_kernel.cuh)
// Design notes and the measurements behind the choices: docs/BENCHMARKS.md,
// "Kernel design notes".
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_KERNELS_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_KERNELS_CUH_

#include "kernels/cuda/internal/pipelined_decode_kernel.cuh"
#include "kernels/cuda/internal/recurrence_direct_kernel.cuh"
#include "kernels/cuda/internal/staged_decode_kernel.cuh"

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_RECURRENCE_KERNELS_CUH_
