// Test helpers: a real redis-server child process (Debian's redis-server
// package) on a loopback port, and a 3-node Redis Cluster of them. A missing
// binary fails the test (never skips it).
//
//   RedisServer redis(FreeRedisPort());
//   ASSERT_NO_FATAL_FAILURE(redis.Start());
//   RedisCluster cluster;
//   ASSERT_NO_FATAL_FAILURE(cluster.Start(3));
#ifndef STATECACHE_SERVER_POOL_TESTING_REDIS_SERVER_H_
#define STATECACHE_SERVER_POOL_TESTING_REDIS_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace statecache {

// A free loopback TCP port below 55000 whose cluster bus port (+10000) is
// free too.
int FreeRedisPort();

class RedisServer {
 public:
  // `cluster`: --cluster-enabled yes, its nodes file in the test's temp dir.
  explicit RedisServer(int port, bool cluster = false) : port_(port), cluster_(cluster) {}
  ~RedisServer() { Stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts it and waits until it accepts connections (gtest failure otherwise).
  void Start();
  // SIGKILL and reap; no-op when not running.
  void Stop();
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  const int port_;
  const bool cluster_;
  pid_t pid_ = -1;
};

class RedisCluster {
 public:
  // Starts `nodes` cluster-enabled servers and joins them with
  // `redis-cli --cluster create ... --cluster-replicas 0`, then waits until
  // every node reports cluster_state:ok.
  void Start(int nodes);
  RedisServer& node(int i) { return *nodes_[i]; }
  int size() const { return static_cast<int>(nodes_.size()); }
  // "host:port,host:port,..." of every node.
  std::string Seeds() const;

 private:
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_TESTING_REDIS_SERVER_H_
