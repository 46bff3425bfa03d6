// An in-process statecached on the loopback interface, for tests, benchmarks
// and tools that start their own server: listening on 127.0.0.1 with an
// ephemeral port (StateCacheServer::port() says which), no metrics endpoint,
// the given backend and memory budgets; the caller sets any other option.
//
//   StateCacheServer::Options so = LoopbackOptions(16 << 20, 16 << 20);
//   so.memory.tiers.host_checkpoint_bytes = 4 << 20;
//   ASSIGN_OR_RETURN(auto server, StateCacheServer::Create(std::move(so)));
//   auto client = StateCacheClient::Connect(LoopbackTarget(*server));
#ifndef STATECACHE_SERVER_LOOPBACK_H_
#define STATECACHE_SERVER_LOOPBACK_H_

#include <cstdint>
#include <string>

#include "server/server.h"

namespace statecache {

StateCacheServer::Options LoopbackOptions(int64_t state_memory_bytes,
                                          int64_t checkpoint_memory_bytes,
                                          std::string backend = "cpu");

// "127.0.0.1:<port>" of a server started with LoopbackOptions.
std::string LoopbackTarget(const StateCacheServer& server);

}  // namespace statecache

#endif  // STATECACHE_SERVER_LOOPBACK_H_
