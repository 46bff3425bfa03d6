#include "server/loopback.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace statecache {

StateCacheServer::Options LoopbackOptions(int64_t state_memory_bytes,
                                          int64_t checkpoint_memory_bytes, std::string backend) {
  StateCacheServer::Options o;
  o.sockets.listen = "127.0.0.1:0";
  o.memory.backend = std::move(backend);
  o.memory.state_memory_bytes = state_memory_bytes;
  o.memory.checkpoint_memory_bytes = checkpoint_memory_bytes;
  o.metrics.port = -1;
  return o;
}

std::string LoopbackTarget(const StateCacheServer& server) {
  return absl::StrCat("127.0.0.1:", server.port());
}

}  // namespace statecache
