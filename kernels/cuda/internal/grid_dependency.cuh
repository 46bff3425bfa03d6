// Programmatic dependent launch (sm_90) for the decode kernels: a kernel
// launched with cudaLaunchAttributeProgrammaticStreamSerialization
// (LaunchPersistent in recurrence_launch.cuh, LaunchValidateOp) may be
// scheduled once every CTA of the previous kernel of its stream called
// AllowDependentLaunch (or exited), so its launch latency hides behind that
// kernel (in a CUDA graph as well). PTX (griddepcontrol): .wait blocks the
// calling thread until the prerequisite grids (the previous kernel only)
// completed and their memory operations are performed and visible to this
// grid; .launch_dependents only allows the next grid to be scheduled and
// orders no memory. Both are no-ops in a kernel launched without the
// attribute (it starts after the previous kernel completed).
//
// Contract of every kernel of ours:
//  (a) Completion implies the previous kernel's completion: the threads
//      that access global memory call WaitForPrecedingGrids before they
//      exit (a grid completes when its last thread exits, so one waiting
//      thread suffices), and a .wait on a kernel of ours also covers every
//      earlier kernel of the stream: the dependence is transitive.
//  (b) Before WaitForPrecedingGrids a kernel reads only what the previous
//      kernel does not write, and writes nothing global.
// The decode kernels call it first thing, with two exceptions:
//  - early_heads (RecurrenceParams): the previous kernel writes neither
//    slots nor the pool; the kernel stages its first heads before waiting.
//  - defer_writes (RecurrenceParams): the previous kernel V is this call's
//    validation kernel, which waits at entry and only then calls
//    AllowDependentLaunch, and writes only its record. So when the op
//    kernel R starts, every kernel before V has completed and its writes
//    were performed (V's waits returned before any V CTA allowed R), and by
//    (a) so had every kernel before those: R may read the inputs, slots and
//    pool at once; the ordering is V's .wait -> V's launch_dependents -> R's
//    launch, and R's loads see memory no later kernel has touched yet (R's
//    own successors wait for R). Only the record is still being written,
//    so each thread of R calls WaitForPrecedingGrids, then reads the
//    verdict, before its first global write (and writes nothing, after
//    draining its CTA's copies into shared memory, when it is set); R's
//    writes thus also follow V's reads of the same buffers.
// A kernel calls AllowDependentLaunch to let the next kernel start early;
// that kernel waits the same way, so triggering at entry is safe.
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_GRID_DEPENDENCY_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_GRID_DEPENDENCY_CUH_

namespace statecache {
namespace cuda_internal {

// Blocks until the grids this one depends on completed and their memory
// operations are visible to it.
__device__ __forceinline__ void WaitForPrecedingGrids() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Lets the next programmatically dependent grid be scheduled (once every CTA
// of this grid called it or exited).
__device__ __forceinline__ void AllowDependentLaunch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_GRID_DEPENDENCY_CUH_
