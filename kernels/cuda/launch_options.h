// LaunchOptions: the launch-path switches of the CUDA backend's kernels, for
// A/B benchmarks and tests. A CudaBackend holds one, given at creation
// (CreateCudaBackend); every launch of that backend (synchronous calls,
// decode queues, stream_ops()) uses it. The defaults are the production
// launch paths. Plain C++ (no CUDA types).
//
// Only a process edge (a benchmark's or server's main) reads the
// environment, once, with LaunchOptionsFromEnvironment:
//
//   ASSIGN_OR_RETURN(auto gpu, CreateCudaBackend(LaunchOptionsFromEnvironment()));
#ifndef STATECACHE_KERNELS_CUDA_LAUNCH_OPTIONS_H_
#define STATECACHE_KERNELS_CUDA_LAUNCH_OPTIONS_H_

namespace statecache {

// The decode kernel of an eligible STEPQuant decode step (StepFastDecode-
// Eligible, kernels/cuda/internal/stepquant_params.h).
enum class StepQuantVariant {
  kTile,  // StepTileDecodeKernel when StepTileDecodeEligible, else kH2
  kH2,    // StepFastDecodeKernel, two threads per value column (256 threads)
  kC2,    // StepFastDecodeKernel, a thread per column, two CTAs per SM
  kC3,    // StepFastDecodeKernel, a thread per column, three CTAs per SM
};

struct LaunchOptions {
  // The persistent decode kernels are launched as programmatic dependents of
  // the previous kernel of their stream (grid_dependency.cuh); false
  // launches them plainly. Environment: STATECACHE_CUDA_PDL=0 -> false.
  bool programmatic_launch = true;
  // Eligible decode steps take the pipelined (bulk-copy, persistent)
  // kernels; false forces the one-CTA-per-head RecurrenceKernel.
  // Environment: STATECACHE_CUDA_PIPELINE=0 -> false.
  bool pipeline = true;
  // 1..3 forces the stage count of the persistent kernels (never more stages
  // than one CTA holds; large heads may then run one CTA per SM); 0 lets the
  // launch choose. Environment: STATECACHE_CUDA_STAGES=<n> (atoi).
  int forced_stages = 0;
  // Eligible STEPQuant decode steps take `stepquant_variant`'s kernel; false
  // forces the one-CTA-per-head StepRecurrenceKernel for every call.
  // Environment: STATECACHE_STEPQUANT_FAST=0 -> false.
  bool stepquant_fast = true;
  // Environment: STATECACHE_STEPQUANT_VARIANT=h2|c2|c3 (anything else,
  // "tile" or unset: kTile).
  StepQuantVariant stepquant_variant = StepQuantVariant::kTile;
  // A decode queue's completion thread (SubmitUpdates streams) waits for
  // each submission on a blocking-sync event - asleep until the GPU signals -
  // instead of spinning on a core; its replies then come some microseconds
  // later, which a worker waiting on the done word on the device does not
  // see. Environment: STATECACHE_QUEUE_BLOCKING_SYNC=1 -> true.
  bool queue_blocking_sync = false;
  // The CUDA device the backend drives. Create makes it current for the
  // calling thread; every later call into the backend must come from a
  // thread whose current device it is (the kernels' one-time device queries
  // read the current device: one device per process, as a tensor-parallel
  // engine's rank on its GPU). CreateBackend("cuda:<n>") sets it; not read
  // from the environment.
  int device = 0;
};

// The options the environment variables above select (unset or empty: the
// defaults; a flag set to anything else is on unless its value starts with
// '0'). Reads the environment;
// call it once, at a process edge.
LaunchOptions LaunchOptionsFromEnvironment();

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_LAUNCH_OPTIONS_H_
