// Redis Cluster routing (redis_router.h) against a real 3-node cluster:
// key slots, CLUSTER SLOTS discovery from one seed, keys spread over every
// node, ASK and MOVED redirects during a slot migration, a killed node.
#include <hiredis/hiredis.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/pool/redis_router.h"
#include "server/pool/redis_tier.h"
#include "server/pool/testing/redis_server.h"

namespace statecache {
namespace {

TEST(RedisKeySlotTest, MatchesRedisClusterSpec) {
  // CRC16-XMODEM("123456789") = 0x31C3 (the spec's check value); 0x31C3 % 16384.
  EXPECT_EQ(RedisKeySlot("123456789"), 0x31C3 % 16384);
  EXPECT_EQ(RedisKeySlot("foo"), 12182);  // redis-cli: CLUSTER KEYSLOT foo
  EXPECT_EQ(RedisKeySlot("{user1000}.following"), RedisKeySlot("{user1000}.followers"));
  EXPECT_EQ(RedisKeySlot("{user1000}.following"), RedisKeySlot("user1000"));
  EXPECT_EQ(RedisKeySlot("foo{}{bar}"), RedisKeySlot(std::string("foo{}{bar}")));
  EXPECT_NE(RedisKeySlot("foo{}{bar}"), RedisKeySlot("bar"));  // empty tag: whole key
  EXPECT_EQ(RedisKeySlot("foo{{bar}}zap"), RedisKeySlot("{bar"));
  EXPECT_EQ(RedisKeySlot("foo{bar}{zap}"), RedisKeySlot("bar"));
}

TEST(RedisAddressTest, ListParsesAndNamesTheField) {
  std::vector<RedisAddress> a;
  ASSERT_TRUE(ParseRedisAddressList("10.0.0.1:7000, redis-b:7001", "f", &a).ok());
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[1].host, "redis-b");
  EXPECT_EQ(a[1].port, 7001);
  absl::Status s = ParseRedisAddressList("10.0.0.1:7000,bad", "redis_cluster_nodes", &a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("redis_cluster_nodes"), std::string::npos) << s;
  EXPECT_FALSE(ParseRedisAddressList(" , ", "f", &a).ok());
}

// One command on a node, bypassing the router; the reply as text.
std::string Raw(int port, const std::vector<std::string>& argv) {
  redisContext* c = redisConnect("127.0.0.1", port);
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(args.size()), args.data(), lens.data()));
  std::string out = "(no reply)";
  if (r != nullptr) {
    if (r->type == REDIS_REPLY_INTEGER)
      out = std::to_string(r->integer);
    else if (r->type == REDIS_REPLY_NIL)
      out = "(nil)";
    else if (r->str != nullptr)
      out.assign(r->str, r->len);
    freeReplyObject(r);
  }
  redisFree(c);
  return out;
}

CheckpointBlob MakeBlob(uint64_t hash, int64_t n) {
  CheckpointBlob b;
  b.key.hash = hash;
  b.key.num_tokens = n;
  b.key.digest = "salt";
  for (int i = 0; i < 200; ++i) b.packed.push_back(static_cast<char>((i * 13 + hash) & 0xff));
  b.aux = {"aux"};
  return b;
}

class RedisClusterTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(cluster_.Start(3)); }

  // A tier that knows only node 0 and discovers the rest.
  std::unique_ptr<RedisTier> Tier() {
    RedisTierOptions o;
    o.cluster_seeds = {RedisAddress{"127.0.0.1", cluster_.node(0).port()}};
    o.ttl_s = 60;
    o.timeout_ms = 200;
    o.breaker_failures = 2;
    o.breaker_cooldown_ms = 200;
    auto t = RedisTier::Create("tags-cluster", o);
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(*t);
  }
  int PortOf(const std::string& address) {
    return std::stoi(address.substr(address.rfind(':') + 1));
  }

  RedisCluster cluster_;
};

TEST_F(RedisClusterTest, KeysSpreadOverEveryNodeAndRoundTrip) {
  auto writer = Tier();
  auto reader = Tier();
  std::vector<CheckpointBlob> blobs;
  std::set<std::string> nodes;
  std::vector<CheckpointBlob> evicted;
  for (int i = 0; i < 30; ++i) {
    blobs.push_back(MakeBlob(0x1000 + i, 8 * (i + 1)));
    ASSERT_TRUE(writer->Put(blobs.back(), &evicted).ok());
    const std::string node = writer->NodeOf(blobs.back().key);
    nodes.insert(node);
    // The key lives on the node the slot map names (asked directly).
    EXPECT_EQ(Raw(PortOf(node), {"EXISTS", writer->RedisKey(blobs.back().key)}), "1") << node;
  }
  EXPECT_EQ(nodes.size(), 3u);
  EXPECT_EQ(writer->errors(), 0);
  EXPECT_EQ(writer->use().entries, 30);
  // Candidates spread over the nodes: the longest held one wins.
  std::vector<PrefixKey> cands;
  for (int i = 0; i < 10; ++i) cands.push_back(blobs[i].key);
  PrefixKey missing = blobs[0].key;
  missing.num_tokens = 100000;
  cands.push_back(missing);
  PrefixKey best;
  ASSERT_TRUE(reader->LongestHeld(cands, &best));
  EXPECT_EQ(best, blobs[9].key);
  for (const CheckpointBlob& b : blobs) {
    auto got = reader->Take(b.key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->packed, b.packed);
    EXPECT_EQ(got->aux, b.aux);
  }
  // Taking leaves the keys for the other servers sharing the cluster.
  ASSERT_TRUE(writer->LongestHeld(cands, &best));
  EXPECT_EQ(best, blobs[9].key);
  for (const CheckpointBlob& b : blobs) {
    EXPECT_EQ(Raw(PortOf(writer->NodeOf(b.key)), {"EXISTS", writer->RedisKey(b.key)}), "1");
  }
  EXPECT_EQ(reader->errors(), 0);
}

TEST_F(RedisClusterTest, FollowsAskThenMovedWhileASlotMigrates) {
  auto tier = Tier();
  const CheckpointBlob b = MakeBlob(0xfeed, 64);
  const std::string key = tier->RedisKey(b.key);
  const std::string from = tier->NodeOf(b.key);  // loads the slot map
  ASSERT_FALSE(from.empty());
  int to_port = 0;
  for (int i = 0; i < 3; ++i) {
    if (cluster_.node(i).address() != from) to_port = cluster_.node(i).port();
  }
  const int from_port = PortOf(from);
  const std::string slot = std::to_string(RedisKeySlot(key));
  const std::string from_id = Raw(from_port, {"CLUSTER", "MYID"});
  const std::string to_id = Raw(to_port, {"CLUSTER", "MYID"});
  ASSERT_EQ(Raw(to_port, {"CLUSTER", "SETSLOT", slot, "IMPORTING", from_id}), "OK");
  ASSERT_EQ(Raw(from_port, {"CLUSTER", "SETSLOT", slot, "MIGRATING", to_id}), "OK");
  // The key is not on `from`: it answers ASK, and the write lands on `to`.
  std::vector<CheckpointBlob> evicted;
  ASSERT_TRUE(tier->Put(b, &evicted).ok());
  EXPECT_EQ(tier->use().entries, 1);
  EXPECT_EQ(Raw(to_port, {"CLUSTER", "COUNTKEYSINSLOT", slot}), "1");
  EXPECT_EQ(Raw(from_port, {"CLUSTER", "COUNTKEYSINSLOT", slot}), "0");
  // Finish the migration: `from` now answers MOVED.
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(Raw(cluster_.node(i).port(), {"CLUSTER", "SETSLOT", slot, "NODE", to_id}), "OK");
  }
  PrefixKey best;
  ASSERT_TRUE(tier->LongestHeld({b.key}, &best));
  EXPECT_EQ(best, b.key);
  EXPECT_EQ(PortOf(tier->NodeOf(b.key)), to_port);  // re-routed by the MOVED reply
  auto got = tier->Take(b.key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->packed, b.packed);
  EXPECT_EQ(tier->errors(), 0);
}

TEST_F(RedisClusterTest, KilledNodeTurnsItsKeysIntoMissesOthersStillHit) {
  auto tier = Tier();
  std::vector<CheckpointBlob> blobs;
  std::vector<CheckpointBlob> evicted;
  for (int i = 0; i < 24; ++i) {
    blobs.push_back(MakeBlob(0x5000 + i, i + 1));
    ASSERT_TRUE(tier->Put(blobs.back(), &evicted).ok());
  }
  const std::string dead = cluster_.node(2).address();
  cluster_.node(2).Stop();
  const auto start = std::chrono::steady_clock::now();
  int live_hits = 0, dead_keys = 0;
  for (const CheckpointBlob& b : blobs) {
    PrefixKey best;
    const bool on_dead = tier->NodeOf(b.key) == dead;
    const bool held = tier->LongestHeld({b.key}, &best);
    EXPECT_EQ(held, !on_dead) << tier->NodeOf(b.key);
    auto got = tier->Take(b.key);
    if (on_dead) {
      ++dead_keys;
      EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
      EXPECT_TRUE(tier->Put(b, &evicted).ok());  // dropped, never an error
    } else {
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->packed, b.packed);
      ++live_hits;
    }
  }
  EXPECT_GT(dead_keys, 0);
  EXPECT_GT(live_hits, 0);
  EXPECT_GE(tier->errors(), 1);
  // Refused connections and the breaker keep every call short.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace statecache
