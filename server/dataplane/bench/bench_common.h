// Shared by the data-plane benchmarks (dataplane_bench, multi_worker_bench)
// and their tests: host inputs of one decode layer, their staging into
// registered worker buffers, and a statecached in this process or a child.
#ifndef STATECACHE_SERVER_DATAPLANE_BENCH_BENCH_COMMON_H_
#define STATECACHE_SERVER_DATAPLANE_BENCH_BENCH_COMMON_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/dataplane_client.h"
#include "kernels/layout/geometry.h"
#include "server/server.h"

namespace statecache {
namespace bench {

// Host inputs of one layer for B slots: q and k L2-normalized per head,
// v ~ N(0, 1), g in [-0.095, -0.005], beta in [0.05, 0.95]; FP32.
struct Inputs {
  std::vector<float> q, k, v, g, beta;
  int64_t o_count = 0;  // FP32 values of o: B x h_v x d_v
};
// Deterministic in (geometry, b, seed).
Inputs MakeInputs(const ModelGeometry& geo, int b, uint32_t seed);

// q, k, v, g, beta written into one new registered buffer of `session`
// (256-byte aligned parts) and a new output buffer of `o_bytes` (at least
// 4 x o_count) for o; the returned call references them for `slots`, o at
// offset 0 (layer 0). *out_buffer: the output buffer.
absl::StatusOr<RefUpdateCall> StageInputs(DataPlaneSession* session, const Inputs& in,
                                          const std::vector<SlotHandle>& slots, int64_t o_bytes,
                                          WorkerBuffer** out_buffer);

// Where statecached runs and how it is started.
struct ServerSpec {
  std::string listen;       // "unix:/path" or "host:port"
  std::string backend = "cpu";
  bool spawn = false;       // false: in this process (CPU only for the data plane)
  std::string statecached;  // binary, when spawn
  int64_t state_bytes = 0;
};

// A statecached with --shared_pools and no slot idle timeout; a spawned one
// is sent SIGTERM and reaped on destruction.
class ServerHandle {
 public:
  static absl::StatusOr<std::unique_ptr<ServerHandle>> Start(const ServerSpec& spec);
  ~ServerHandle();
  const std::string& target() const { return target_; }

 private:
  std::string target_;
  std::unique_ptr<StateCacheServer> server_;
  pid_t pid_ = 0;
};

}  // namespace bench
}  // namespace statecache

#endif  // STATECACHE_SERVER_DATAPLANE_BENCH_BENCH_COMMON_H_
