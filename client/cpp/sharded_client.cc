#include "client/cpp/sharded_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/routing/resolve.h"
#include "kernels/common/status_macros.h"

namespace statecache {

absl::StatusOr<std::unique_ptr<ShardedStateCacheClient>> ShardedStateCacheClient::Create(
    std::vector<std::string> endpoints, Options options) {
  HashRing::Options ring_options;
  ring_options.virtual_nodes = options.virtual_nodes;
  ASSIGN_OR_RETURN(HashRing ring, HashRing::Create(std::move(endpoints), ring_options));
  for (const auto& kv : options.targets) {
    if (kv.second.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("targets: empty target for endpoint ", kv.first));
    }
  }
  return std::unique_ptr<ShardedStateCacheClient>(
      new ShardedStateCacheClient(std::move(ring), std::move(options)));
}

absl::StatusOr<std::unique_ptr<ShardedStateCacheClient>> ShardedStateCacheClient::FromDns(
    absl::string_view host, int port, Options options) {
  ASSIGN_OR_RETURN(std::vector<std::string> endpoints, ResolveEndpoints(host, port));
  return Create(std::move(endpoints), std::move(options));
}

std::string ShardedStateCacheClient::EndpointFor(absl::string_view conversation_id) const {
  absl::MutexLock lock(&mu_);
  return ring_.Route(conversation_id);
}

absl::StatusOr<std::shared_ptr<StateCacheClient>> ShardedStateCacheClient::ForConversation(
    absl::string_view conversation_id) {
  absl::MutexLock lock(&mu_);
  return ClientLocked(ring_.Route(conversation_id));
}

absl::StatusOr<std::shared_ptr<StateCacheClient>> ShardedStateCacheClient::ForEndpoint(
    absl::string_view endpoint) {
  absl::MutexLock lock(&mu_);
  for (const std::string& e : ring_.endpoints()) {
    if (e == endpoint) return ClientLocked(e);
  }
  return absl::NotFoundError(absl::StrCat("endpoint: ", endpoint, " is not in the ring"));
}

absl::Status ShardedStateCacheClient::AddEndpoint(absl::string_view endpoint) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(HashRing ring, ring_.WithEndpoint(endpoint));
  ring_ = std::move(ring);
  return absl::OkStatus();
}

absl::Status ShardedStateCacheClient::RemoveEndpoint(absl::string_view endpoint) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(HashRing ring, ring_.WithoutEndpoint(endpoint));
  ring_ = std::move(ring);
  return absl::OkStatus();
}

std::vector<std::string> ShardedStateCacheClient::endpoints() const {
  absl::MutexLock lock(&mu_);
  return ring_.endpoints();
}

std::string ShardedStateCacheClient::TargetOf(absl::string_view endpoint) const {
  auto it = options_.targets.find(endpoint);
  return it == options_.targets.end() ? std::string(endpoint) : it->second;
}

absl::StatusOr<std::shared_ptr<StateCacheClient>> ShardedStateCacheClient::ClientLocked(
    const std::string& endpoint) {
  auto it = clients_.find(endpoint);
  if (it != clients_.end()) return it->second;
  ASSIGN_OR_RETURN(std::unique_ptr<StateCacheClient> client,
                   StateCacheClient::Connect(TargetOf(endpoint), options_.client));
  std::shared_ptr<StateCacheClient> shared = std::move(client);
  clients_.emplace(endpoint, shared);
  return shared;
}

}  // namespace statecache
