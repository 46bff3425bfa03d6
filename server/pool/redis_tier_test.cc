#include "server/pool/redis_tier.h"

#include <hiredis/hiredis.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/pool/redis_router.h"
#include "server/pool/testing/redis_server.h"

namespace statecache {
namespace {

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
    port_ = FreeRedisPort();
    server_ = std::make_unique<RedisServer>(port_);
    ASSERT_NO_FATAL_FAILURE(server_->Start());
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
  // Shared: taking leaves the blob for every server (a third one too).
  ASSERT_TRUE(writer->LongestHeld(cands, &best));
  EXPECT_EQ(best, b.key);
  auto third = Tier(port_);
  auto again = third->Take(b.key);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->packed, b.packed);
  EXPECT_TRUE(again->remote_written);
  PrefixKey absent = b.key;
  absent.num_tokens = 99;
  EXPECT_EQ(reader->Take(absent).status().code(), absl::StatusCode::kNotFound);
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

TEST_F(RedisTierTest, ReportsRemoteTierAndCountsWhatItWroteAndTook) {
  auto t = Tier(port_);
  EXPECT_EQ(t->tier(), StoreTier::kRemote);
  EXPECT_STREQ(StoreTierName(t->tier()), "remote");
  const CheckpointBlob a = MakeBlob(0x10, 8), b = MakeBlob(0x20, 16);
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE(t->Put(a, &evicted).ok());
  ASSERT_TRUE(t->Put(b, &evicted).ok());
  TierUse u = t->use();
  EXPECT_EQ(u.entries, 2);
  EXPECT_EQ(u.bytes, a.bytes() + b.bytes());
  EXPECT_EQ(u.capacity_bytes, 0);
  EXPECT_EQ(u.requests, 2);
  EXPECT_GT(u.request_micros, 0);
  EXPECT_EQ(u.errors, 0);
  ASSERT_TRUE(t->Take(a.key).ok());
  u = t->use();
  EXPECT_EQ(u.entries, 2);  // a Take leaves the blob in Redis
  EXPECT_EQ(u.bytes, a.bytes() + b.bytes());
  EXPECT_EQ(u.requests, 4);  // STRLEN, then GET + EXPIRE pipelined: two round trips
  server_->Stop();
  PrefixKey best;
  EXPECT_FALSE(t->LongestHeld({b.key}, &best));
  EXPECT_EQ(t->use().errors, 1);
}

// One raw command on the test's node; the reply as text ("(nil)" for nil,
// integers in decimal).
std::string Raw(int port, std::vector<std::string> argv) {
  redisContext* c = redisConnect("127.0.0.1", port);
  if (c == nullptr || c->err != 0) return "(connect failed)";
  std::vector<const char*> p;
  std::vector<size_t> n;
  for (const std::string& a : argv) {
    p.push_back(a.data());
    n.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), p.data(), n.data()));
  std::string out = "(error)";
  if (r != nullptr) {
    if (r->type == REDIS_REPLY_INTEGER) out = std::to_string(r->integer);
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) out.assign(r->str, r->len);
    if (r->type == REDIS_REPLY_NIL) out = "(nil)";
    freeReplyObject(r);
  }
  redisFree(c);
  return out;
}

TEST_F(RedisTierTest, TakeRefreshesTheTtl) {
  auto t = Tier(port_);  // ttl_s 60
  const CheckpointBlob b = MakeBlob(0x31, 8);
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE(t->Put(b, &evicted).ok());
  const std::string k = t->RedisKey(b.key);
  ASSERT_EQ(Raw(port_, {"EXPIRE", k, "5"}), "1");
  ASSERT_TRUE(t->Take(b.key).ok());
  EXPECT_GT(std::stoi(Raw(port_, {"TTL", k})), 50);
}

TEST_F(RedisTierTest, WrittenThroughBlobIsRefreshedNotResentUnlessExpired) {
  auto t = Tier(port_);
  CheckpointBlob b = MakeBlob(0x41, 16);
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE(t->Put(b, &evicted).ok());
  const std::string k = t->RedisKey(b.key);
  ASSERT_EQ(Raw(port_, {"EXPIRE", k, "5"}), "1");
  CheckpointBlob demoted = b;
  demoted.remote_written = true;
  demoted.packed[0] ^= 0x55;  // would show if the bytes were sent again
  ASSERT_TRUE(t->Put(demoted, &evicted).ok());
  EXPECT_EQ(t->resends_skipped(), 1);
  EXPECT_GT(std::stoi(Raw(port_, {"TTL", k})), 50);  // refreshed
  auto got = t->Take(b.key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->packed, b.packed);  // the first write's bytes
  EXPECT_EQ(t->use().entries, 1);
  // Expired meanwhile: the bytes are sent again.
  ASSERT_EQ(Raw(port_, {"DEL", k}), "1");
  ASSERT_TRUE(t->Put(demoted, &evicted).ok());
  EXPECT_EQ(t->resends_skipped(), 1);
  got = t->Take(b.key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->packed, demoted.packed);
  EXPECT_EQ(t->use().entries, 2);
}

TEST_F(RedisTierTest, LargeBlobRoundTripsWithDefaultTimeouts) {
  RedisTierOptions o;  // default timeout_ms / min_transfer_mib_per_s
  o.port = port_;
  auto t = RedisTier::Create("tags-v1", o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->TransferTimeoutMs(int64_t{32} << 20), 20 + 500);  // 32 MiB at 64 MiB/s
  EXPECT_EQ((*t)->TransferTimeoutMs(0), 20);
  CheckpointBlob b = MakeBlob(0x51, 4096);
  b.packed.resize(size_t{32} << 20);
  for (size_t i = 0; i < b.packed.size(); i += 4093) b.packed[i] = static_cast<char>(i >> 12);
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE((*t)->Put(b, &evicted).ok());
  EXPECT_EQ((*t)->use().entries, 1);  // the SET did not time out
  auto got = (*t)->Take(b.key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->packed == b.packed);
  EXPECT_EQ(got->aux, b.aux);
  EXPECT_EQ((*t)->errors(), 0);
}

TEST(RedisTierOptionsTest, BadOptionsNameTheField) {
  RedisTierOptions o;
  o.ttl_s = 0;
  auto t = RedisTier::Create("tags", o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("ttl_s"), std::string::npos) << t.status();
  o = RedisTierOptions();
  o.min_transfer_mib_per_s = 0;
  t = RedisTier::Create("tags", o);
  EXPECT_NE(t.status().message().find("min_transfer_mib_per_s"), std::string::npos) << t.status();
  o = RedisTierOptions();
  o.cluster_seeds = {RedisAddress{"", 7000}};
  t = RedisTier::Create("tags", o);
  EXPECT_NE(t.status().message().find("cluster seed"), std::string::npos) << t.status();
  EXPECT_EQ(RedisTier::ParseAddress("nocolon", &o).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(RedisTier::ParseAddress("h:0", &o).message().find("redis_checkpoint_address"),
            std::string::npos);
}

}  // namespace
}  // namespace statecache
