#include "server/pool/redis_tier.h"

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace statecache {
namespace {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A redis-server child on a loopback port in a temp dir; fails when missing.
class RedisServer {
 public:
  explicit RedisServer(int port) : port_(port) {}
  ~RedisServer() { Stop(); }
  void Start() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string dir = tmp != nullptr ? tmp : "/tmp";
    const std::string port = std::to_string(port_);
    pid_ = fork();
    if (pid_ == 0) {
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", dir.c_str(),
             static_cast<char*>(nullptr));
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
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  int port_;
  pid_t pid_ = -1;
};

CheckpointBlob MakeBlob(uint64_t hash, int64_t n) {
  CheckpointBlob b;
  b.key.hash = hash;
  b.key.num_tokens = n;
  b.key.digest = "salt";
  for (int i = 0; i < 300; ++i) b.packed.push_back(static_cast<char>((i * 7 + n) & 0xff));
  b.aux = {"aux-a", std::string("\0\1\2", 3)};
  return b;
}

std::unique_ptr<RedisTier> Tier(int port, int cooldown_ms = 300) {
  RedisTierOptions o;
  o.port = port;
  o.ttl_s = 60;
  o.timeout_ms = 50;
  o.breaker_failures = 2;
  o.breaker_cooldown_ms = cooldown_ms;
  auto t = RedisTier::Create("tags-v1", o);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = FreePort();
    server_ = std::make_unique<RedisServer>(port_);
    server_->Start();
  }
  int port_ = 0;
  std::unique_ptr<RedisServer> server_;
};

TEST_F(RedisTierTest, RoundTripAcrossTwoServers) {
  auto writer = Tier(port_);
  auto reader = Tier(port_);
  const CheckpointBlob b = MakeBlob(0xabc, 32);
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE(writer->Put(b, &evicted).ok());
  EXPECT_TRUE(evicted.empty());
  PrefixKey shorter = b.key;
  shorter.num_tokens = 16;
  PrefixKey longer = b.key;
  longer.num_tokens = 48;
  PrefixKey best;
  const std::vector<PrefixKey> cands = {shorter, b.key, longer};
  ASSERT_TRUE(reader->LongestHeld(cands, &best));
  EXPECT_EQ(best, b.key);
  auto got = reader->Take(b.key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->key, b.key);
  EXPECT_EQ(got->packed, b.packed);
  EXPECT_EQ(got->aux, b.aux);
  EXPECT_FALSE(writer->LongestHeld(cands, &best));
  EXPECT_EQ(reader->Take(b.key).status().code(), absl::StatusCode::kNotFound);
  // Other tags never see the blob.
  ASSERT_TRUE(writer->Put(b, &evicted).ok());
  RedisTierOptions o;
  o.port = port_;
  auto other = RedisTier::Create("tags-v2", o);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE((*other)->LongestHeld(cands, &best));
}

TEST_F(RedisTierTest, CorruptBlobIsMissAndDeleted) {
  auto t = Tier(port_);
  const CheckpointBlob b = MakeBlob(0x1234, 8);
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE(t->Put(b, &evicted).ok());
  redisContext* c = redisConnect("127.0.0.1", port_);
  ASSERT_TRUE(c != nullptr && c->err == 0);
  const std::string k = t->RedisKey(b.key);
  auto* r = static_cast<redisReply*>(redisCommand(c, "GET %b", k.data(), k.size()));
  ASSERT_EQ(r->type, REDIS_REPLY_STRING);
  std::string v(r->str, r->len);
  freeReplyObject(r);
  v[v.size() / 2] ^= 0x01;
  r = static_cast<redisReply*>(
      redisCommand(c, "SET %b %b", k.data(), k.size(), v.data(), v.size()));
  freeReplyObject(r);
  EXPECT_EQ(t->Take(b.key).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(t->use().dropped_corrupt, 1);
  r = static_cast<redisReply*>(redisCommand(c, "EXISTS %b", k.data(), k.size()));
  EXPECT_EQ(r->integer, 0);
  freeReplyObject(r);
  redisFree(c);
}

TEST_F(RedisTierTest, RedisDownIsMissThenRecovers) {
  auto t = Tier(port_, 300);
  const CheckpointBlob b = MakeBlob(0x77, 24);
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE(t->Put(b, &evicted).ok());
  server_->Stop();
  const auto start = std::chrono::steady_clock::now();
  PrefixKey best;
  const std::vector<PrefixKey> cands = {b.key};
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(t->LongestHeld(cands, &best));
    EXPECT_EQ(t->Take(b.key).status().code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(t->Put(b, &evicted).ok());
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_GE(t->errors(), 2);
  server_->Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // breaker cool-down
  ASSERT_TRUE(t->Put(b, &evicted).ok());
  ASSERT_TRUE(t->LongestHeld(cands, &best));
  EXPECT_EQ(best, b.key);
  auto got = t->Take(b.key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->packed, b.packed);
}

}  // namespace
}  // namespace statecache
