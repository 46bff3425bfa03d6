#include "server/pool/testing/redis_server.h"

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>

#include "gtest/gtest.h"

namespace statecache {
namespace {

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

bool PortFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// The INFO/CLUSTER INFO text of a node, "" when unreachable.
std::string Query(int port, const char* command) {
  timeval tv{1, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  std::string out;
  if (c != nullptr && c->err == 0) {
    auto* r = static_cast<redisReply*>(redisCommand(c, command));
    if (r != nullptr && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)) {
      out.assign(r->str, r->len);
    }
    if (r != nullptr) freeReplyObject(r);
  }
  if (c != nullptr) redisFree(c);
  return out;
}

}  // namespace

int FreeRedisPort() {
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> port(20000, 54999);
  for (int i = 0; i < 1000; ++i) {
    const int p = port(rng);
    if (PortFree(p) && PortFree(p + 10000)) return p;
  }
  ADD_FAILURE() << "no free port pair";
  return 0;
}

void RedisServer::Start() {
  const std::string dir = TempDir();
  const std::string port = std::to_string(port_);
  const std::string nodes_file = "nodes-" + port + ".conf";
  if (cluster_) unlink((dir + "/" + nodes_file).c_str());
  pid_ = fork();
  if (pid_ == 0) {
    if (cluster_) {
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", dir.c_str(),
             "--cluster-enabled", "yes", "--cluster-config-file", nodes_file.c_str(),
             "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no",
             "--loglevel", "warning", static_cast<char*>(nullptr));
    } else {
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", dir.c_str(),
             "--loglevel", "warning", static_cast<char*>(nullptr));
    }
    _exit(127);
  }
  ASSERT_GT(pid_, 0);
  for (int i = 0; i < 200; ++i) {
    timeval tv{0, 100000};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    const bool up = c != nullptr && c->err == 0;
    if (c != nullptr) redisFree(c);
    if (up) return;
    int status = 0;
    ASSERT_EQ(waitpid(pid_, &status, WNOHANG), 0) << "redis-server exited (missing binary?)";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  FAIL() << "redis-server did not come up";
}

void RedisServer::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void RedisCluster::Start(int nodes) {
  std::string create = "redis-cli --cluster create";
  for (int i = 0; i < nodes; ++i) {
    nodes_.push_back(std::make_unique<RedisServer>(FreeRedisPort(), /*cluster=*/true));
    ASSERT_NO_FATAL_FAILURE(nodes_.back()->Start());
    create += " " + nodes_.back()->address();
  }
  create += " --cluster-replicas 0 --cluster-yes > " + TempDir() + "/cluster-create.log 2>&1";
  ASSERT_EQ(std::system(create.c_str()), 0) << create << " (see cluster-create.log)";
  for (int i = 0; i < 300; ++i) {
    bool ok = true;
    for (const auto& n : nodes_) {
      ok = ok && Query(n->port(), "CLUSTER INFO").find("cluster_state:ok") != std::string::npos;
    }
    if (ok) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  FAIL() << "cluster did not reach cluster_state:ok";
}

std::string RedisCluster::Seeds() const {
  std::string s;
  for (const auto& n : nodes_) s += (s.empty() ? "" : ",") + n->address();
  return s;
}

}  // namespace statecache
