#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "kernels/backend/interprocess.h"
#include "kernels/common/status_macros.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/shm/shm_interprocess.h"
#include "server/core/log.h"

namespace statecache {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const StateCacheServer::SecurityOptions& sec, const std::string& listen) {
  const bool tls = !sec.tls_cert_file.empty() || !sec.tls_key_file.empty();
  if (!tls) {
    if (!sec.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "tls_client_ca_file: mutual TLS needs tls_cert_file and tls_key_file");
    }
    if (!IsLoopbackAddress(listen) && !sec.allow_insecure_remote) {
      return absl::InvalidArgumentError(absl::StrCat(
          "listen: refusing a plaintext listener on non-loopback address '", listen,
          "'; give --tls_cert_file/--tls_key_file, or --allow_insecure_remote on a trusted "
          "network"));
    }
    return grpc::InsecureServerCredentials();
  }
  if (sec.tls_cert_file.empty() || sec.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert_file / tls_key_file: give both or neither");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadFile(sec.tls_cert_file, "tls_cert_file"));
  ASSIGN_OR_RETURN(pair.private_key, ReadFile(sec.tls_key_file, "tls_key_file"));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!sec.tls_client_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(sec.tls_client_ca_file, "tls_client_ca_file"));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// Registers the models saved in `store` again (a tenant's models only when
// the tenants file still names it); failures are logged, not fatal. Returns
// how many were registered.
absl::StatusOr<int> ReloadModels(ModelStore& store, TenantDirectory* tenants,
                                 StateCacheService& service) {
  ASSIGN_OR_RETURN(std::vector<ModelStore::Entry> saved, store.LoadAll());
  int reloaded = 0;
  for (const ModelStore::Entry& e : saved) {
    Tenant* tenant = &service.default_tenant();
    if (!e.tenant.empty()) tenant = tenants ? tenants->Find(e.tenant) : nullptr;
    absl::Status st = absl::NotFoundError(
        absl::StrCat("tenant '", e.tenant, "' is not in the tenants file"));
    v1::RegisterModelResponse ignored;
    if (tenant != nullptr) st = service.DoRegisterModel(*tenant, e.request, &ignored);
    if (st.ok()) {
      ++reloaded;
    } else {
      LogEvent("model_reload_failed", absl::StrCat("file=", e.path, " error=\"",
                                                   st.ToString(), "\""));
    }
  }
  return reloaded;
}

// Every model's pool and checkpoint stats at scrape time (model "tenant/id"
// for a tenant's models).
Metrics::StatsSource StatsSourceOf(ModelRegistry* registry) {
  return [registry] {
    std::vector<ModelStatsSnapshot> out;
    for (const auto& m : registry->List()) {
      ModelStatsSnapshot snap;
      snap.model_id = m->tenant.empty() ? m->id : absl::StrCat(m->tenant, "/", m->id);
      snap.format = FormatSpecName(m->layout.format());
      snap.registration = absl::ToUnixNanos(m->registered_at);
      snap.slots = m->slots->stats();
      if (m->checkpoints) snap.checkpoints = m->checkpoints->stats();
      out.push_back(std::move(snap));
    }
    return out;
  };
}

// gRPC's sync-server threads: completion queues and pollers per queue.
void SetSyncServerThreads(const StateCacheServer::SocketOptions& sockets,
                          grpc::ServerBuilder* builder) {
  const int threads = sockets.grpc_threads > 0
                          ? sockets.grpc_threads
                          : StateCacheServer::SocketOptions::kDefaultGrpcThreads;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int cqs = std::min(threads, sockets.grpc_completion_queues > 0
                                        ? sockets.grpc_completion_queues
                                        : std::min(4, hw));
  builder->SetSyncServerOption(grpc::ServerBuilder::NUM_CQS, cqs);
  builder->SetSyncServerOption(grpc::ServerBuilder::MIN_POLLERS, 1);
  builder->SetSyncServerOption(grpc::ServerBuilder::MAX_POLLERS,
                               std::max(1, (threads + cqs - 1) / cqs));
}

// The "security" start-up line: transport, authentication, idle timeout,
// persistence.
void LogSecurity(const StateCacheServer::Options& options, const TenantDirectory* tenants,
                 int models_reloaded) {
  const StateCacheServer::SecurityOptions& sec = options.security;
  LogEvent("security",
           absl::StrCat("transport=",
                        sec.tls_cert_file.empty() ? "plaintext"
                        : sec.tls_client_ca_file.empty() ? "tls" : "mutual-tls",
                        tenants ? absl::StrCat(" auth=bearer-token tenants=",
                                               tenants->TenantNames().size(),
                                               " tokens=", tenants->token_count())
                                : " auth=NONE (single-tenant development mode: every caller "
                                  "is the default tenant; give --tenants_file in production)",
                        " slot_idle_timeout=", absl::FormatDuration(options.slot_idle_timeout),
                        " data_dir=", options.persistence.data_dir.empty()
                                          ? "none" : options.persistence.data_dir,
                        " models_reloaded=", models_reloaded));
}

// The registry's options from the server's memory options and the budgets
// in bytes; kInvalidArgument naming the flag for a bad tier setting.
absl::StatusOr<ModelRegistry::Options> RegistryOptionsFrom(
    const StateCacheServer::MemoryOptions& mem, int64_t state_bytes, int64_t checkpoint_bytes) {
  ModelRegistry::Options ro;
  ro.state_budget_bytes = state_bytes;
  ro.checkpoint_budget_bytes = checkpoint_bytes;
  ro.default_lease = mem.lease_default;
  ro.max_lease = mem.lease_max;
  if (mem.tiers.host_checkpoint_bytes < 0 || mem.tiers.disk_checkpoint_bytes < 0) {
    return absl::InvalidArgumentError(
        "host_checkpoint_bytes and disk_checkpoint_bytes: must be >= 0");
  }
  if (!mem.tiers.disk_checkpoint_dir.empty() && mem.tiers.disk_checkpoint_bytes < 1) {
    return absl::InvalidArgumentError(
        "disk_checkpoint_bytes: must be >= 1 with --disk_checkpoint_dir");
  }
  if (!mem.tiers.redis_checkpoint_address.empty() && !mem.tiers.redis_cluster_nodes.empty()) {
    return absl::InvalidArgumentError(
        "redis_cluster_nodes: set either --redis_checkpoint_address or --redis_cluster_nodes");
  }
  if (mem.tiers.redis_write_queue_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "redis_write_queue_bytes: ", mem.tiers.redis_write_queue_bytes, " must be >= 1"));
  }
  if (!mem.tiers.checkpoint_format.empty()) {
    absl::StatusOr<FormatSpec> cf = ParseFormatSpec(mem.tiers.checkpoint_format);
    if (!cf.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint_format: ", cf.status().message()));
    }
  }
  ro.tiers = mem.tiers;
  return ro;
}

}  // namespace

bool IsLoopbackAddress(absl::string_view listen) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) return true;
  absl::string_view host = listen;
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    if (close == absl::string_view::npos) return false;
    host = host.substr(1, close - 1);
  } else {
    const size_t colon = host.rfind(':');
    if (colon != absl::string_view::npos) host = host.substr(0, colon);
  }
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8, digits and dots only.
  return absl::StartsWith(host, "127.") &&
         host.find_first_not_of("0123456789.") == absl::string_view::npos;
}

int64_t StateCacheServer::ReleaseIdleSlots(absl::Time cutoff) {
  int64_t total = 0;
  for (const auto& m : registry_->List()) {
    const int64_t n = m->slots->ReleaseIdle(cutoff);
    if (n > 0) {
      LogEvent("slots_lease_expired",
               absl::StrCat("model=", m->tenant.empty() ? "" : m->tenant + "/", m->id,
                            " count=", n, " used=", m->slots->stats().allocated, "/",
                            m->slots->capacity()));
    }
    total += n;
  }
  return total;
}

absl::StatusOr<std::unique_ptr<StateCacheServer>> StateCacheServer::Create(Options options) {
  const MemoryOptions& mem = options.memory;
  if (mem.state_memory_bytes < 0 || mem.checkpoint_memory_bytes < 0) {
    return absl::InvalidArgumentError("state_memory_bytes / checkpoint_memory_bytes: negative");
  }
  if (!(mem.memory_fraction > 0 && mem.memory_fraction <= 1) ||
      !(mem.checkpoint_fraction >= 0 && mem.checkpoint_fraction <= 1)) {
    return absl::InvalidArgumentError(
        "memory_fraction must be in (0, 1] and checkpoint_fraction in [0, 1]");
  }
  if (options.sockets.max_message_bytes < 1024) {
    return absl::InvalidArgumentError("max_message_bytes: must be >= 1024");
  }
  if (options.limits.max_unpack_bytes < 1) {
    return absl::InvalidArgumentError("max_unpack_bytes: must be >= 1");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeCredentials(options.security, options.sockets.listen));
  if (options.slot_idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("slot_idle_timeout: negative");
  }
  if (options.drain_quiet_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("drain_quiet_period: negative");
  }
  std::unique_ptr<StateCacheServer> s(new StateCacheServer());
  if (!options.security.tenants_file.empty()) {
    ASSIGN_OR_RETURN(s->tenants_, TenantDirectory::Load(options.security.tenants_file));
  }
  if (options.backend != nullptr) {
    s->backend_ = std::move(options.backend);
  } else {
    ASSIGN_OR_RETURN(s->backend_, CreateBackend(mem.backend, mem.cuda_launch));
  }
  int64_t state_bytes = mem.state_memory_bytes;
  int64_t checkpoint_bytes = mem.checkpoint_memory_bytes;
  if (state_bytes == 0 || checkpoint_bytes == 0) {
    ASSIGN_OR_RETURN(int64_t available, s->backend_->AvailableBytes());
    if (state_bytes == 0) state_bytes = static_cast<int64_t>(available * mem.memory_fraction);
    if (checkpoint_bytes == 0) {
      checkpoint_bytes = static_cast<int64_t>(available * mem.checkpoint_fraction);
    }
  }
  ASSIGN_OR_RETURN(ModelRegistry::Options ro,
                   RegistryOptionsFrom(mem, state_bytes, checkpoint_bytes));
  ro.clock = options.clock;
  // Shared pools are for backends whose memory is shared host memory (the
  // CPU's); device arenas are exported by their own handles.
  const Interprocess* ipc = s->backend_->interprocess();
  if (options.dataplane.enabled && options.dataplane.shared_pools && ipc != nullptr &&
      ipc->host_accessible()) {
    ro.slot_arena_allocator = SharedArenaAllocator();
  }
  s->registry_ = std::make_unique<ModelRegistry>(s->backend_.get(), ro);

  ModelRegistry* registry = s->registry_.get();
  Metrics::Options mo;
  mo.version = options.metrics.version;
  mo.revision = options.metrics.revision;
  mo.backend = s->backend_->name();
  if (mo.backend == "cuda") {
    Backend* backend = s->backend_.get();
    mo.device_free_bytes = [backend] { return backend->AvailableBytes(); };
  }
  mo.stats = StatsSourceOf(registry);
  s->metrics_ = std::make_shared<Metrics>(std::move(mo));
  if (options.metrics.port >= 0) {
    RETURN_IF_ERROR(
        s->metrics_->Start(absl::StrCat(options.metrics.host, ":", options.metrics.port)));
  }
  s->service_ = std::make_unique<StateCacheService>(s->backend_.get(), s->registry_.get(),
                                                    s->metrics_, options.limits,
                                                    options.compute);
  s->service_->set_tenants(s->tenants_.get());
  if (options.dataplane.enabled) {
    DataPlane::Options dpo;
    dpo.default_lease = options.dataplane.session_lease;
    dpo.max_lease = options.dataplane.max_session_lease;
    dpo.ring_wait_timeout = options.dataplane.ring_wait_timeout;
    dpo.device_event_wait = options.dataplane.device_event_wait;
    s->dataplane_ = std::make_unique<DataPlane>(s->backend_.get(), s->registry_.get(), dpo);
    s->service_->set_dataplane(s->dataplane_.get());
  }
  if (!options.persistence.data_dir.empty()) {
    ASSIGN_OR_RETURN(s->model_store_, ModelStore::Open(options.persistence.data_dir));
    ASSIGN_OR_RETURN(s->models_reloaded_,
                     ReloadModels(*s->model_store_, s->tenants_.get(), *s->service_));
    s->service_->set_model_store(s->model_store_.get());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.sockets.listen, credentials, &s->port_);
  builder.SetMaxReceiveMessageSize(options.sockets.max_message_bytes);
  builder.SetMaxSendMessageSize(options.sockets.max_message_bytes);
  SetSyncServerThreads(options.sockets, &builder);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("listen: cannot serve gRPC on '", options.sockets.listen, "'"));
  }
  s->listen_address_ = options.sockets.listen;
  s->drain_quiet_period_ = options.drain_quiet_period;
  if (auto* health = s->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
    health->SetServingStatus("statecache.v1.StateCache", true);
  }
  LogEvent("server_started",
           absl::StrCat("listen=", options.sockets.listen, " port=", s->port_, " backend=",
                        s->backend_->name(), " (", s->backend_->Describe(), ")",
                        " state_memory_bytes=", state_bytes,
                        " checkpoint_memory_bytes=", checkpoint_bytes,
                        " host_checkpoint_bytes=", mem.tiers.host_checkpoint_bytes,
                        " disk_checkpoint_dir=",
                        mem.tiers.disk_checkpoint_dir.empty() ? "none"
                                                              : mem.tiers.disk_checkpoint_dir,
                        " disk_checkpoint_bytes=", mem.tiers.disk_checkpoint_bytes,
                        " checkpoint_format=",
                        mem.tiers.checkpoint_format.empty() ? "slot" : mem.tiers.checkpoint_format,
                        // metrics_port stays numeric (log readers parse it);
                        // metrics= says what it means.
                        " metrics_port=", options.metrics.port < 0 ? -1 : s->metrics_port(),
                        " metrics=",
                        options.metrics.port < 0
                            ? std::string("disabled")
                            : absl::StrCat("http://", options.metrics.host, ":",
                                           s->metrics_port(), "/metrics"),
                        " max_message_bytes=", options.sockets.max_message_bytes));
  LogSecurity(options, s->tenants_.get(), s->models_reloaded_);
  if (options.slot_idle_timeout > absl::ZeroDuration()) {
    const absl::Duration idle = options.slot_idle_timeout;
    const absl::Duration period =
        std::max(absl::Milliseconds(10), std::min(idle / 4, absl::Seconds(5)));
    StateCacheServer* self = s.get();
    s->sweeper_ = std::make_unique<std::thread>([self, idle, period] {
      absl::MutexLock lock(&self->sweeper_mu_);
      while (!self->sweeper_mu_.AwaitWithTimeout(absl::Condition(&self->stop_sweeper_), period)) {
        self->sweeper_mu_.Unlock();
        self->ReleaseIdleSlots(absl::Now() - idle);
        self->sweeper_mu_.Lock();
      }
    });
  }
  return s;
}

void StateCacheServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (sweeper_ != nullptr) {
    {
      absl::MutexLock lock(&sweeper_mu_);
      stop_sweeper_ = true;
    }
    sweeper_->join();
    sweeper_.reset();
  }
  if (server_ == nullptr) return;
  LogEvent("server_draining", absl::StrCat("grace=", absl::FormatDuration(grace)));
  const absl::Time deadline = absl::Now() + grace;
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  CallGate& gate = service_->call_gate();
  gate.BeginDrain();
  const bool quiet = gate.AwaitQuiet(drain_quiet_period_, deadline);
  const int idle_streams = gate.CancelIdleStreams();
  LogEvent("server_drained", absl::StrCat("quiet=", quiet ? "yes" : "no", " running=",
                                          gate.running(), " idle_streams_cancelled=",
                                          idle_streams));
  server_->Shutdown(absl::ToChronoTime(std::max(deadline, absl::Now())));
  server_->Wait();
  LogEvent("server_stopped");
}

StateCacheServer::~StateCacheServer() { Shutdown(absl::Seconds(5)); }

}  // namespace statecache
