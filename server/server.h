// StateCacheServer: a running statecached (backend, models, gRPC, metrics).
//
// Owns the Backend, the ModelRegistry, the Metrics, the StateCacheService and
// the grpc::Server with health checking (grpc.health.v1, status SERVING while
// up) and server reflection. Used by the statecached binary and by tests,
// which listen on "127.0.0.1:0" and read the chosen port from port().
//
//   StateCacheServer::Options options;
//   options.sockets.listen = "127.0.0.1:0";
//   ASSIGN_OR_RETURN(auto server, StateCacheServer::Create(options));
//   ... server->port() ...
//   server->Shutdown(absl::Seconds(10));  // drains in-flight calls
#ifndef STATECACHE_SERVER_SERVER_H_
#define STATECACHE_SERVER_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "kernels/backend/backend.h"
#include "kernels/cuda/launch_options.h"
#include "server/metrics.h"
#include "server/auth/tenants.h"
#include "server/dataplane/data_plane.h"
#include "server/core/model_registry.h"
#include "server/model_store.h"
#include "server/statecache_service.h"

namespace statecache {

// True for addresses only this host can reach: unix sockets, 127.0.0.0/8,
// [::1] and localhost.
bool IsLoopbackAddress(absl::string_view listen);

class StateCacheServer {
 public:
  struct SocketOptions {
    // gRPC listen address: "host:port" (port 0 = pick one) or "unix:/path".
    std::string listen = "127.0.0.1:50051";
    // Largest request / response message in bytes (inline tensors; gRPC's
    // own default is 4 MiB). 1 GiB holds an Update at B = 4096 or a Prefill
    // of states of 16 slots of Qwen3.6-35B-A3B (30 GDN layers, 32 x 128 x 128
    // FP32 states per layer: 62.9 MB a slot). Co-located workers avoid the
    // copies with registered buffers (issue 10).
    int max_message_bytes = 1 << 30;
    // gRPC sync-server threads kept ready (polling) between calls, over all
    // completion queues. gRPC's own default keeps 1-2 and starts a thread
    // for a call that finds none idle (on that call's path) and ends it
    // afterwards; a server of many concurrent workers wants them kept.
    // Threads beyond it still start for bursts (UpdateStream holds one while
    // open) and end when idle. 0 = kDefaultGrpcThreads.
    int grpc_threads = 0;
    static constexpr int kDefaultGrpcThreads = 64;
    // Completion queues the threads poll; 0 = min(4, hardware threads).
    int grpc_completion_queues = 0;
  };
  // Data plane for co-located workers (issue 10, server/dataplane/).
  struct DataPlaneOptions {
    // Serve OpenSession / RegisterBuffer / AttachSlots and buffer references.
    bool enabled = true;
    // CPU backend: allocate slot arenas in POSIX shared memory so attached
    // workers can map them (AttachSlots). /dev/shm must hold the budget.
    bool shared_pools = false;
    // Default / maximum data-plane session lease.
    absl::Duration session_lease = absl::Seconds(30);
    absl::Duration max_session_lease = absl::Minutes(10);
    // SubmitUpdates on CUDA: how long a worker's ring event may stay
    // incomplete before the stream's gated updates are aborted, and whether
    // the stream waits for those events on the device instead
    // (DataPlane::Options::device_event_wait).
    absl::Duration ring_wait_timeout = absl::Seconds(10);
    bool device_event_wait = false;
  };
  struct MemoryOptions {
    // "auto", "cuda" or "cpu".
    std::string backend = "auto";
    // Launch paths of a CUDA backend's kernels (kernels/cuda/launch_options.h;
    // statecached_main reads them from the environment, once).
    LaunchOptions cuda_launch;
    // State-memory budget for live slots; 0 = memory_fraction of the
    // backend's available memory.
    int64_t state_memory_bytes = 0;
    // Checkpoint-memory budget; 0 = checkpoint_fraction of available memory.
    int64_t checkpoint_memory_bytes = 0;
    double memory_fraction = 0.5;
    double checkpoint_fraction = 0.2;
    // Lower checkpoint tiers, per model, and their format.
    CheckpointTierOptions tiers;
    absl::Duration lease_default = absl::Seconds(30);
    absl::Duration lease_max = absl::Minutes(10);
  };
  // Transport security and authentication (issue 8).
  struct SecurityOptions {
    // TLS: PEM server certificate chain and private key. Both empty = a
    // plaintext listener, which must be loopback (127.0.0.0/8, ::1,
    // localhost) or a unix socket unless allow_insecure_remote is set.
    std::string tls_cert_file;
    std::string tls_key_file;
    // Mutual TLS: PEM CA bundle; clients must present a certificate signed by
    // it (requires tls_cert_file).
    std::string tls_client_ca_file;
    // Accept a plaintext listener on a non-loopback address (trusted
    // networks only; tokens then travel in clear).
    bool allow_insecure_remote = false;
    // Tenants file (server/auth/tenants.h). Empty = authentication off:
    // single-tenant local development mode (logged at start-up).
    std::string tenants_file;
  };
  struct PersistenceOptions {
    // Directory where registrations are persisted and reloaded at start-up
    // (server/model_store.h); empty = nothing is persisted. States (slots,
    // checkpoints) are volatile either way.
    std::string data_dir;
  };
  struct MetricsOptions {
    // Prometheus /metrics endpoint; port < 0 disables it, 0 picks a port.
    std::string host = "127.0.0.1";
    int port = 9464;
    // Labels of statecache_build_info (the binary's //tools/build_info).
    std::string version = "unknown";
    std::string revision = "unknown";
  };
  struct Options {
    SocketOptions sockets;
    MemoryOptions memory;
    MetricsOptions metrics;
    StateCacheService::Limits limits;
    StateCacheService::ComputeOptions compute;
    SecurityOptions security;
    PersistenceOptions persistence;
    DataPlaneOptions dataplane;
    // Slot leases: an allocated slot unused (no call on it) for this long is
    // released, so slots of a client that died come back. Zero = never.
    absl::Duration slot_idle_timeout = absl::Minutes(10);
    // Shutdown: how long no call may arrive before the listener closes
    // (calls the transport had accepted reach the service meanwhile and get
    // UNAVAILABLE instead of being cut off).
    absl::Duration drain_quiet_period = absl::Milliseconds(100);
    // Test hook: use this backend instead of creating memory.backend.
    std::unique_ptr<Backend> backend;
    // Test hook: time source of LookupPrefix leases (thread-safe); absl::Now
    // when empty.
    std::function<absl::Time()> clock;
  };

  // Creates the backend, budgets, metrics endpoint and starts serving.
  // kInvalidArgument for bad options, kUnavailable when a port cannot be
  // bound or the backend is unavailable.
  static absl::StatusOr<std::unique_ptr<StateCacheServer>> Create(Options options);

  ~StateCacheServer();

  // Port gRPC listens on (TCP), 0 for unix sockets.
  int port() const { return port_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  Backend& backend() { return *backend_; }
  ModelRegistry& registry() { return *registry_; }
  Metrics& metrics() { return *metrics_; }
  const std::string& listen_address() const { return listen_address_; }
  StateCacheService& service() { return *service_; }
  // Registrations reloaded from data_dir at start-up.
  int models_reloaded() const { return models_reloaded_; }
  // One sweep of the slot leases (also run every few seconds by a thread
  // while slot_idle_timeout > 0): releases slots idle since before `cutoff`.
  int64_t ReleaseIdleSlots(absl::Time cutoff);

  // Drains, then stops; within `grace` in all. Health turns NOT_SERVING and
  // the service refuses every call that arrives (UNAVAILABLE: it did not
  // run) while running calls finish; once none runs and none arrived for
  // drain_quiet_period, streams idle between messages are cancelled (all
  // their messages were answered) and gRPC stops. Calls still running when
  // `grace` ends are cancelled. Idempotent; also run by the destructor.
  void Shutdown(absl::Duration grace);

 private:
  StateCacheServer() = default;

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ModelRegistry> registry_;
  std::shared_ptr<Metrics> metrics_;
  std::unique_ptr<StateCacheService> service_;
  std::unique_ptr<grpc::Server> server_;
  // After server_: destroyed first (its attachments hold registry slots).
  std::unique_ptr<DataPlane> dataplane_;
  std::unique_ptr<TenantDirectory> tenants_;
  std::unique_ptr<ModelStore> model_store_;
  int models_reloaded_ = 0;
  // The slot-lease sweeper.
  std::unique_ptr<std::thread> sweeper_;
  absl::Mutex sweeper_mu_;
  bool stop_sweeper_ ABSL_GUARDED_BY(sweeper_mu_) = false;
  std::string listen_address_;
  int port_ = 0;
  absl::Duration drain_quiet_period_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_SERVER_H_
