// MultiWorker (issue 33): W concurrent data-plane workers on distinct slots
// of one model, each stepping through every layer with SubmitUpdates, and
// the serial replay their results are checked against.
//
// A worker has its own client (gRPC channel), DataPlaneSession, registered
// buffers (inputs: seed `seed + w`, the same every layer and step; o: one
// FP32 [B, h_v, d_v] block per layer), done word, UpdateSubmitter and (CUDA)
// its own non-blocking stream, and B slots of its own. One step = every
// layer's Submit (the server runs one submitter's updates in order), then
// the host waits for the last reply; with `layer_waits` each Submit is
// followed by a StreamWait on its reply (a worker that consumes o between
// layers; with a host-visible done word that is a host wait per layer). The
// step's wall time is one sample of step_ms. Workers
// are set up one after another, then start together.
//
// Replay: for each worker, B fresh slots of the same model run the worker's
// steps_run steps one unary Update at a time (registered buffers, one
// thread); the last step's o of every layer and the exported bytes of the
// first `verify_slots` slot pairs must be equal byte for byte.
//
//   MultiWorkerOptions o;  // target, geometry, format, batch, steps, ...
//   ASSIGN_OR_RETURN(MultiWorkerReport r, RunMultiWorker(o, /*workers=*/8));
#ifndef STATECACHE_SERVER_DATAPLANE_BENCH_MULTI_WORKER_H_
#define STATECACHE_SERVER_DATAPLANE_BENCH_MULTI_WORKER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/layout/geometry.h"

namespace statecache {
namespace bench {

struct MultiWorkerOptions {
  std::string target;  // statecached with --shared_pools ("unix:..." for CUDA IPC)
  std::string model_id = "multi";
  ModelGeometry geometry;
  std::string format = "damp";
  int batch = 256;      // slots per worker
  int steps = 10;       // timed steps per worker
  int warmup = 2;       // untimed steps first
  bool verify = true;   // serial replay after the run
  int verify_slots = -1;  // slots per worker whose bytes are compared (-1: all)
  uint32_t seed = 1234;
  bool cuda_streams = false;  // each worker on its own non-blocking CUDA stream
  bool layer_waits = false;   // StreamWait after every layer's Submit
};

struct WorkerSteps {
  int steps_run = 0;            // warmup + steps on success
  std::vector<double> step_ms;  // the timed steps
};

struct MultiWorkerReport {
  std::vector<WorkerSteps> workers;
  double wall_ms = 0;  // from the common start until the last worker's last step
  // Replay (zero when !verify).
  int64_t o_compared = 0, o_mismatches = 0;        // FP32 values of the last step
  int64_t slots_compared = 0, slot_mismatches = 0;  // exported slot states
  // True when two workers' exported slot 0 differ (their inputs differ).
  bool workers_distinct = false;
};

// Registers (replacing) options.model_id with workers x batch + batch slots
// (the replay's), runs, replays, drops the model. The first worker error
// (naming the worker) fails the call.
absl::StatusOr<MultiWorkerReport> RunMultiWorker(const MultiWorkerOptions& options, int workers);

// The p-th percentile (0..100, nearest rank) of `v`; 0 when empty.
double Percentile(std::vector<double> v, double p);

}  // namespace bench
}  // namespace statecache

#endif  // STATECACHE_SERVER_DATAPLANE_BENCH_MULTI_WORKER_H_
