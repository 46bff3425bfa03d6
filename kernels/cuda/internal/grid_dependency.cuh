// Programmatic dependent launch (sm_90) for the decode kernels: a kernel
// launched with cudaLaunchAttributeProgrammaticStreamSerialization
// (LaunchPersistent in recurrence_launch.cuh) may be scheduled while the
// previous kernel of its stream is still running, so its launch latency
// hides behind that kernel's tail (in a CUDA graph as well).
//
// Contract: a kernel calls WaitForPrecedingGrids before its first access of
// global memory that the preceding kernel may write (our decode kernels call
// it first thing: slots, inputs, the validation flag and the pool are all
// read after it), and AllowDependentLaunch to let the next kernel start
// early; that kernel waits the same way for this one to complete and its
// writes to be visible before it touches them, so triggering at entry is
// safe. Both are no-ops when the kernel was launched without the attribute.
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
