#include "server/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "kernels/common/status_macros.h"
#include "server/log.h"

namespace statecache {

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
  std::unique_ptr<StateCacheServer> s(new StateCacheServer());
  if (options.backend != nullptr) {
    s->backend_ = std::move(options.backend);
  } else {
    ASSIGN_OR_RETURN(s->backend_, CreateBackend(mem.backend));
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
  ModelRegistry::Options ro;
  ro.state_budget_bytes = state_bytes;
  ro.checkpoint_budget_bytes = checkpoint_bytes;
  ro.default_lease = mem.lease_default;
  ro.max_lease = mem.lease_max;
  s->registry_ = std::make_unique<ModelRegistry>(s->backend_.get(), ro);

  ModelRegistry* registry = s->registry_.get();
  s->metrics_ = std::make_shared<Metrics>([registry] {
    std::vector<ModelStatsSnapshot> out;
    for (const auto& m : registry->List()) {
      ModelStatsSnapshot snap;
      snap.model_id = m->id;
      snap.format = FormatSpecName(m->layout.format());
      snap.registration = absl::ToUnixNanos(m->registered_at);
      snap.slots = m->slots->stats();
      if (m->checkpoints) snap.checkpoints = m->checkpoints->stats();
      out.push_back(std::move(snap));
    }
    return out;
  });
  if (options.metrics.port >= 0) {
    RETURN_IF_ERROR(
        s->metrics_->Start(absl::StrCat(options.metrics.host, ":", options.metrics.port)));
  }
  s->service_ = std::make_unique<StateCacheService>(s->backend_.get(), s->registry_.get(),
                                                    s->metrics_, options.limits);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.sockets.listen, grpc::InsecureServerCredentials(), &s->port_);
  builder.SetMaxReceiveMessageSize(options.sockets.max_message_bytes);
  builder.SetMaxSendMessageSize(options.sockets.max_message_bytes);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("listen: cannot serve gRPC on '", options.sockets.listen, "'"));
  }
  s->listen_address_ = options.sockets.listen;
  if (auto* health = s->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
    health->SetServingStatus("statecache.v1.StateCache", true);
  }
  LogEvent("server_started",
           absl::StrCat("listen=", options.sockets.listen, " port=", s->port_, " backend=",
                        s->backend_->name(), " (", s->backend_->Describe(), ")",
                        " state_memory_bytes=", state_bytes,
                        " checkpoint_memory_bytes=", checkpoint_bytes,
                        " metrics_port=", s->metrics_port(),
                        " max_message_bytes=", options.sockets.max_message_bytes));
  return s;
}

void StateCacheServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (server_ == nullptr) return;
  LogEvent("server_draining", absl::StrCat("grace=", absl::FormatDuration(grace)));
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::microseconds(absl::ToInt64Microseconds(grace));
  server_->Shutdown(deadline);
  server_->Wait();
  LogEvent("server_stopped");
}

StateCacheServer::~StateCacheServer() { Shutdown(absl::Seconds(5)); }

}  // namespace statecache
