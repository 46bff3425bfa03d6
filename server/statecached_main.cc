// statecached: the statecache server.
//
// Serves statecache.v1.StateCache (plus grpc.health.v1 and server
// reflection) over gRPC and Prometheus metrics over HTTP, on the CUDA backend
// when a GPU is usable and the CPU backend otherwise. SIGTERM / SIGINT drain
// in-flight calls (up to --shutdown_grace_ms) and exit 0. States are volatile:
// a restart loses slots and checkpoints (registrations survive with
// --data_dir). Security: TLS / mutual TLS from --tls_* files, bearer-token
// tenants from --tenants_file; plaintext only on loopback unless
// --allow_insecure_remote.
//
//   statecached --listen=127.0.0.1:50051 --backend=cpu --state_memory_bytes=1073741824
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/launch_options.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"
#include "server/core/log.h"
#include "server/server.h"
#include "tools/build_info/build_info.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC listen address: host:port (port 0 picks a free port), [::]:port for all "
          "interfaces, or unix:/path/to.sock for co-located workers. Without "
          "--tls_cert_file the listener is plaintext and must be loopback or a unix socket "
          "(see --allow_insecure_remote).");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain of the server; with --tls_key_file enables TLS.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA bundle: enables mutual TLS (clients must present a certificate it signed).");
ABSL_FLAG(bool, allow_insecure_remote, false,
          "Allow a plaintext (no TLS) listener on a non-loopback address. Trusted networks "
          "only: bearer tokens and states then travel in clear.");
ABSL_FLAG(std::string, tenants_file, "",
          "Tenants file (bearer-token SHA-256 digests -> tenants, per-tenant quotas; format in "
          "server/auth/tenants.h). Empty = NO AUTHENTICATION: single-tenant local development "
          "mode, every caller is the default tenant.");
ABSL_FLAG(std::string, data_dir, "",
          "Directory where model registrations (geometry, format, layout) are persisted and "
          "reloaded at start-up. States (slots, checkpoints) are volatile and never persisted. "
          "Empty = nothing persisted.");
ABSL_FLAG(int64_t, slot_idle_timeout_ms, 600000,
          "Slot lease: an allocated slot with no call for this long is released (its handle "
          "goes stale), so a dead client's slots come back. 0 = never.");
ABSL_FLAG(int64_t, max_calibration_bytes, int64_t{1} << 30,
          "Most trajectory bytes one Calibrate call may stream (RESOURCE_EXHAUSTED past it).");
ABSL_FLAG(int64_t, max_work_heads, int64_t{1} << 24,
          "Per-request work bound: batch x tokens x value heads of one Update / Prefill "
          "(batch x layers x heads for a Prefill of states).");
ABSL_FLAG(int, max_message_bytes, 1 << 30,
          "Largest gRPC request/response in bytes (gRPC's default is 4 MiB; at most 2^31-1). "
          "Inline-tensor Updates carry B*(2*h_qk*d_k + h_v*d_v)*dtype_bytes + gates; a Prefill "
          "of T tokens T times that; a Prefill of states B*layers*h_v*d_k*d_v*4; an Export one "
          "packed slot. Qwen3.6-35B-A3B (30 GDN layers, 16/32 heads, 128x128), FP32: an Update "
          "is 32 KiB per slot in (8.4 MB at B=256, 134 MB at B=4096) and 16 KiB out; a Prefill "
          "of states 62.9 MB per slot, so the 1 GiB default holds B=4096 Updates and 16-slot "
          "state prefills. Co-located workers skip the bytes with registered buffers "
          "(RegisterBuffer) or attached mode.");
ABSL_FLAG(int, grpc_threads, 0,
          "gRPC sync-server threads kept ready between calls (0 = 64). Each running call or "
          "open stream holds one; more start for bursts and end when idle. Size it to the "
          "concurrent callers you expect (workers x streams) so no call waits for a thread "
          "to start.");
ABSL_FLAG(int, grpc_completion_queues, 0,
          "Completion queues the gRPC threads poll (0 = min(4, hardware threads)).");
ABSL_FLAG(bool, coalesce_updates, false,
          "Merge concurrent Update calls of one model, layer and dtype into one kernel launch "
          "(group commit: a lone call launches at once; calls arriving while a launch of their "
          "layer runs share the next one). Results are byte-identical to separate calls.");
ABSL_FLAG(int, coalesce_max_batch, 256,
          "--coalesce_updates: most slots in one merged launch (larger calls run alone).");
ABSL_FLAG(int64_t, coalesce_max_delay_us, 0,
          "--coalesce_updates: how long a launch may wait for more calls while fewer than "
          "--coalesce_max_batch slots are queued (0 = never: no added latency beyond the "
          "launch ahead).");
ABSL_FLAG(int64_t, staging_cache_bytes, int64_t{256} << 20,
          "Backend staging buffers (request tensors, outputs) kept for reuse between calls.");
ABSL_FLAG(bool, dataplane, true,
          "Serve the data plane for co-located workers (issue 10): OpenSession, RegisterBuffer "
          "(CPU: POSIX shared memory; CUDA: CUDA IPC handles + events), AttachSlots, and "
          "buffer references in Update / Prefill.");
ABSL_FLAG(bool, shared_pools, false,
          "CPU backend: allocate slot arenas in POSIX shared memory (/dev/shm must hold the "
          "state budget) so attached workers can map them (AttachSlots). CUDA arenas are always "
          "exportable through CUDA IPC.");
ABSL_FLAG(int64_t, session_lease_ms, 30000,
          "Default data-plane session lease: a session unused (no renewal, no call naming it "
          "or its buffers) this long is closed and its buffers and attached slots released.");
ABSL_FLAG(int64_t, submit_ring_wait_timeout_ms, 10000,
          "SubmitUpdates on CUDA: a worker's ring event that does not complete within this "
          "time aborts the stream's waiting updates (they write nothing) and ends the stream "
          "with DEADLINE_EXCEEDED.");
ABSL_FLAG(std::string, backend, "auto",
          "State backend: auto (CUDA when a GPU is usable, else CPU), cuda, or cpu.");
ABSL_FLAG(int64_t, state_memory_bytes, 0,
          "Budget for live slots (all models) in bytes. Each RegisterModel preallocates its "
          "slot arena from it. 0 = --memory_fraction of the backend's available memory.");
ABSL_FLAG(int64_t, checkpoint_memory_bytes, 0,
          "Separate budget for prefix-cache checkpoints in bytes (LRU-evicted when full). "
          "0 = --checkpoint_fraction of the backend's available memory.");
ABSL_FLAG(double, memory_fraction, 0.5,
          "Fraction of available backend memory used for slots when --state_memory_bytes=0.");
ABSL_FLAG(int64_t, host_checkpoint_bytes, 0,
          "Host-memory checkpoint tier per model, in bytes: checkpoints evicted from "
          "checkpoint memory move here (LRU) and are promoted back on a hit. 0 = off.");
ABSL_FLAG(bool, host_checkpoint_write_through, false,
          "With a host tier: every snapshot is also copied into it (one device-to-host copy "
          "per snapshot), so evicting a checkpoint from checkpoint memory copies nothing and "
          "a restore from the host tier is a single host-to-device copy even when checkpoint "
          "memory is full. The host tier's budget then also holds copies of checkpoints in "
          "checkpoint memory: worth it when --host_checkpoint_bytes is several times the "
          "checkpoint memory. false = a checkpoint moves to the host tier when evicted.");
ABSL_FLAG(std::string, disk_checkpoint_dir, "",
          "Directory of the disk checkpoint tier (one subdirectory per model): what the "
          "host tier (or checkpoint memory) evicts is written here, CRC-checked, and "
          "survives restarts for models registered again with the same layout. Empty = off.");
ABSL_FLAG(int64_t, disk_checkpoint_bytes, 0,
          "Byte budget of the disk checkpoint tier per model (LRU); required with "
          "--disk_checkpoint_dir.");
ABSL_FLAG(std::string, redis_checkpoint_address, "",
          "host:port of a Redis node used as a checkpoint tier below disk, shared by "
          "servers using the same node; unavailable Redis only turns hits into misses. "
          "Empty = off.");
ABSL_FLAG(std::string, checkpoint_format, "",
          "Format of the checkpoints in the host / disk / Redis tiers for models whose "
          "RegisterModel names no checkpoint_format (e.g. int4-hadamard): checkpoints are "
          "transcoded on leaving checkpoint memory and back on a hit. Empty = each model's "
          "slot format (the slot's bytes, unchanged).");
ABSL_FLAG(std::string, redis_cluster_nodes, "",
          "Comma-separated host:port seeds of a Redis Cluster used as the checkpoint tier "
          "below disk instead of one node (slots from CLUSTER SLOTS, MOVED / ASK followed; "
          "a node down only turns its keys' hits into misses). Empty = off; not with "
          "--redis_checkpoint_address.");
ABSL_FLAG(int64_t, redis_checkpoint_ttl_s, 3600, "TTL of checkpoints written to Redis, seconds.");
ABSL_FLAG(int32_t, redis_checkpoint_timeout_ms, 20,
          "Timeout of the Redis checkpoint tier's connects and small commands (EXISTS, "
          "STRLEN, EXPIRE, DEL), milliseconds, and the floor of a transfer's timeout: a SET / "
          "GET of n bytes may take this + n / --redis_checkpoint_min_mib_per_s. A call past "
          "its timeout is a miss (a dropped write) and counts toward the breaker.");
ABSL_FLAG(double, redis_checkpoint_min_mib_per_s, 64,
          "Slowest Redis transfer accepted, MiB/s: sets the SET / GET timeout of a "
          "checkpoint from its size (64 MiB/s: a 63 MB fp32 Qwen3.6-sized checkpoint gets "
          "about 1 s; loopback measured 140-500 MiB/s on a loaded 2-core machine).");
ABSL_FLAG(bool, redis_write_through, true,
          "With a Redis tier: every snapshot is also written to Redis in the background "
          "(a bounded queue; never delays or fails the snapshot beyond one device-to-host "
          "copy), so another server sharing Redis can restore a conversation while this one "
          "still holds it. On by default because sharing across servers is what the Redis "
          "tier is for; false = checkpoints reach Redis only when evicted from the tiers above.");
ABSL_FLAG(int64_t, redis_write_queue_bytes, int64_t{512} << 20,
          "Bytes of snapshot copies waiting for Redis per model (write-through); a snapshot "
          "that does not fit is not written through (counted in "
          "statecache_checkpoint_tier_write_through_dropped_total). Default 512 MiB: 8 fp32 or "
          "27 damp:16 Qwen3.6-sized checkpoints.");
ABSL_FLAG(double, checkpoint_fraction, 0.2,
          "Fraction of available backend memory used for checkpoints when "
          "--checkpoint_memory_bytes=0.");
ABSL_FLAG(int, metrics_port, 9464,
          "Port of the Prometheus /metrics endpoint; -1 disables it, 0 picks a free port.");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "Address the metrics endpoint binds (0.0.0.0 to let a remote Prometheus scrape).");
ABSL_FLAG(int64_t, lease_default_ms, 30000,
          "LookupPrefix lease duration when the request asks for 0 ms.");
ABSL_FLAG(int64_t, lease_max_ms, 600000, "Upper bound of a LookupPrefix lease.");
ABSL_FLAG(int, max_batch, 4096, "Most slots in one Update / Prefill / UpdateStream message.");
ABSL_FLAG(int64_t, max_prefill_tokens, 65536, "Most tokens (T) in one Prefill call.");
ABSL_FLAG(int64_t, max_aux_bytes, 64 << 20,
          "Most auxiliary bytes (all layers) stored with one checkpoint.");
ABSL_FLAG(int64_t, max_unpack_bytes, int64_t{256} << 20,
          "Most FP32 state bytes one Unpack response carries (layers x h_v x d_k x d_v x 4; "
          "RESOURCE_EXHAUSTED naming max_unpack_bytes beyond it).");
ABSL_FLAG(int64_t, shutdown_grace_ms, 10000,
          "On SIGTERM/SIGINT, how long in-flight calls may finish before they are cancelled.");
ABSL_FLAG(bool, log_cache_events, false,
          "Log one line per Snapshot / Restore / LookupPrefix (model and slot lifecycle events "
          "are always logged).");
ABSL_FLAG(std::string, report_geometry, "gdn:30:16:32:128:128",
          "Geometry arch:layers:h_qk:h_v:d_k:d_v for the start-up table of slots per format "
          "(default: Qwen3.6-35B-A3B's 30 GDN layers, 16 key / 32 value heads, 128 x 128).");

namespace statecache {
namespace {

// The start-up table: what the budgets buy per format for one geometry.
void PrintCapacityTable(const ModelGeometry& g, int64_t state_bytes, int64_t checkpoint_bytes) {
  std::string table = absl::StrFormat(
      "capacity for %s (state budget %d B, checkpoint budget %d B):\n"
      "  %-14s %10s %10s %14s %12s %12s\n",
      g.DebugString(), state_bytes, checkpoint_bytes, "format", "bits/value", "head B",
      "slot B", "slots", "checkpoints");
  for (StateFormat f : AllStateFormats()) {
    FormatSpec spec{f, IsMixedFormat(f) ? std::min(kDefaultKHi, g.d_k) : 0};
    absl::StatusOr<StateLayout> layout = StateLayout::Identity(g, spec);
    if (!layout.ok()) continue;
    const int64_t slot = layout->slot_bytes();
    absl::StrAppend(&table, absl::StrFormat("  %-14s %10.3f %10d %14d %12d %12d\n",
                                            FormatSpecName(spec),
                                            layout->head_layout().PayloadBitsPerValue(),
                                            layout->head_layout().head_bytes, slot,
                                            state_bytes / slot, checkpoint_bytes / slot));
  }
  std::fputs(table.c_str(), stderr);
}

int Main() {
  // Block the shutdown signals in every thread (gRPC's included) and wait for
  // them synchronously below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  StateCacheServer::Options options;
  options.sockets.listen = absl::GetFlag(FLAGS_listen);
  options.sockets.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.memory.backend = absl::GetFlag(FLAGS_backend);
  options.memory.cuda_launch = LaunchOptionsFromEnvironment();
  options.memory.state_memory_bytes = absl::GetFlag(FLAGS_state_memory_bytes);
  options.memory.checkpoint_memory_bytes = absl::GetFlag(FLAGS_checkpoint_memory_bytes);
  options.memory.memory_fraction = absl::GetFlag(FLAGS_memory_fraction);
  options.memory.checkpoint_fraction = absl::GetFlag(FLAGS_checkpoint_fraction);
  options.memory.tiers.host_checkpoint_bytes = absl::GetFlag(FLAGS_host_checkpoint_bytes);
  options.memory.tiers.host_write_through = absl::GetFlag(FLAGS_host_checkpoint_write_through);
  options.memory.tiers.disk_checkpoint_dir = absl::GetFlag(FLAGS_disk_checkpoint_dir);
  options.memory.tiers.disk_checkpoint_bytes = absl::GetFlag(FLAGS_disk_checkpoint_bytes);
  options.memory.tiers.redis_checkpoint_address = absl::GetFlag(FLAGS_redis_checkpoint_address);
  options.memory.tiers.redis_cluster_nodes = absl::GetFlag(FLAGS_redis_cluster_nodes);
  options.memory.tiers.redis_checkpoint_ttl_s = absl::GetFlag(FLAGS_redis_checkpoint_ttl_s);
  options.memory.tiers.redis_checkpoint_timeout_ms =
      absl::GetFlag(FLAGS_redis_checkpoint_timeout_ms);
  options.memory.tiers.redis_checkpoint_min_mib_per_s =
      absl::GetFlag(FLAGS_redis_checkpoint_min_mib_per_s);
  options.memory.tiers.redis_write_through = absl::GetFlag(FLAGS_redis_write_through);
  options.memory.tiers.redis_write_queue_bytes = absl::GetFlag(FLAGS_redis_write_queue_bytes);
  options.memory.tiers.checkpoint_format = absl::GetFlag(FLAGS_checkpoint_format);
  options.memory.lease_default = absl::Milliseconds(absl::GetFlag(FLAGS_lease_default_ms));
  options.memory.lease_max = absl::Milliseconds(absl::GetFlag(FLAGS_lease_max_ms));
  options.metrics.port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics.host = absl::GetFlag(FLAGS_metrics_host);
  options.metrics.version = BuildVersion();
  options.metrics.revision = BuildRevision();
  options.limits.max_batch = absl::GetFlag(FLAGS_max_batch);
  options.limits.max_prefill_tokens = absl::GetFlag(FLAGS_max_prefill_tokens);
  options.limits.max_aux_bytes = absl::GetFlag(FLAGS_max_aux_bytes);
  options.limits.log_cache_events = absl::GetFlag(FLAGS_log_cache_events);
  options.limits.max_work_heads = absl::GetFlag(FLAGS_max_work_heads);
  options.limits.max_calibration_bytes = absl::GetFlag(FLAGS_max_calibration_bytes);
  options.limits.max_unpack_bytes = absl::GetFlag(FLAGS_max_unpack_bytes);
  options.security.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.security.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.security.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  options.security.allow_insecure_remote = absl::GetFlag(FLAGS_allow_insecure_remote);
  options.security.tenants_file = absl::GetFlag(FLAGS_tenants_file);
  options.persistence.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.slot_idle_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_slot_idle_timeout_ms));
  if (absl::GetFlag(FLAGS_grpc_threads) < 0 || absl::GetFlag(FLAGS_grpc_completion_queues) < 0) {
    std::fprintf(stderr, "statecached: --grpc_threads / --grpc_completion_queues must be >= 0\n");
    return 2;
  }
  options.sockets.grpc_threads = absl::GetFlag(FLAGS_grpc_threads);
  options.sockets.grpc_completion_queues = absl::GetFlag(FLAGS_grpc_completion_queues);
  if (absl::GetFlag(FLAGS_coalesce_max_batch) < 1 || absl::GetFlag(FLAGS_coalesce_max_delay_us) < 0 ||
      absl::GetFlag(FLAGS_staging_cache_bytes) < 0) {
    std::fprintf(stderr,
                 "statecached: --coalesce_max_batch must be >= 1, --coalesce_max_delay_us and "
                 "--staging_cache_bytes >= 0\n");
    return 2;
  }
  options.compute.coalesce_updates = absl::GetFlag(FLAGS_coalesce_updates);
  options.compute.coalescer.max_batch = absl::GetFlag(FLAGS_coalesce_max_batch);
  options.compute.coalescer.max_delay =
      absl::Microseconds(absl::GetFlag(FLAGS_coalesce_max_delay_us));
  options.compute.staging_cache_bytes = absl::GetFlag(FLAGS_staging_cache_bytes);
  options.dataplane.enabled = absl::GetFlag(FLAGS_dataplane);
  options.dataplane.shared_pools = absl::GetFlag(FLAGS_shared_pools);
  options.dataplane.session_lease = absl::Milliseconds(absl::GetFlag(FLAGS_session_lease_ms));
  if (absl::GetFlag(FLAGS_submit_ring_wait_timeout_ms) <= 0) {
    std::fprintf(stderr, "statecached: --submit_ring_wait_timeout_ms must be > 0\n");
    return 2;
  }
  options.dataplane.ring_wait_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_submit_ring_wait_timeout_ms));
  // STATECACHE_SUBMIT_DEVICE_WAIT=event: SubmitUpdates waits for the workers'
  // ring events on the device (read once, here).
  const char* device_wait = std::getenv("STATECACHE_SUBMIT_DEVICE_WAIT");
  options.dataplane.device_event_wait =
      device_wait != nullptr && std::strcmp(device_wait, "event") == 0;
  options.dataplane.max_session_lease = options.memory.lease_max;

  absl::StatusOr<ModelGeometry> report =
      ParseGeometry(absl::GetFlag(FLAGS_report_geometry), "report_geometry");
  if (!report.ok()) {
    std::fprintf(stderr, "statecached: %s\n", report.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<StateCacheServer>> server =
      StateCacheServer::Create(std::move(options));
  if (!server.ok()) {
    std::fprintf(stderr, "statecached: %s\n", server.status().ToString().c_str());
    return 1;
  }
  PrintCapacityTable(*report, (*server)->registry().state_budget_bytes(),
                     (*server)->registry().checkpoint_budget_bytes());

  int sig = 0;
  sigwait(&signals, &sig);
  LogEvent("signal", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->Shutdown(absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  server->reset();
  return 0;
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "statecached: a gRPC service that owns the recurrent states of linear-attention LLMs "
      "(GDN / KDA) in compressed formats (DAMP etc.).\n"
      "Usage: statecached [--listen=127.0.0.1:50051] [--backend=auto|cuda|cpu] "
      "[--state_memory_bytes=N] [--checkpoint_memory_bytes=N] [--metrics_port=9464] ...");
  absl::FlagsUsageConfig usage_config;
  usage_config.version_string = [] { return statecache::VersionString("statecached"); };
  absl::SetFlagsUsageConfig(usage_config);
  absl::ParseCommandLine(argc, argv);
  // Debian's Abseil is built without NDEBUG, so every absl::Mutex lock also
  // runs the lock-order (deadlock) graph check: ~3% of the server's CPU under
  // many concurrent Updates. The tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return statecache::Main();
}
