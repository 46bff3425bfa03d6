// statecached processes (CPU backend) sharing one redis-server as their
// remote checkpoint tier. Eviction path (--redis_write_through=false): a
// conversation snapshotted on A and evicted from A's checkpoint memory (it
// has room for one) lands in Redis; B finds it (tier REMOTE) and restores
// states byte-identical to A's export. Write-through (the default): every
// snapshot on A reaches Redis without any eviction, and B and C both restore
// it (a hit leaves it in Redis). A blob corrupted in Redis is never
// restored; with Redis killed, lookups miss and Updates and Snapshots keep
// working.
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/statecache_client.h"
#include "gtest/gtest.h"
#include "server/pool/testing/redis_server.h"
#include "tests/faults/server_process.h"
#include "tests/load/workload.h"

namespace statecache {
namespace {

constexpr char kModel[] = "remote-gdn";

WorkloadSpec Spec() {
  WorkloadSpec spec;
  spec.model_id = kModel;
  spec.format = "damp:8";
  return spec;
}

std::vector<int32_t> Tokens(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = 900 + i;
  return t;
}

std::vector<std::string> AuxOf(int n) { return {absl::StrCat("conv", n), absl::StrCat("CONV", n)}; }

// One decode step (every layer) of `slot` through the public client.
absl::Status Step(StateCacheClient& client, SlotHandle slot, int i) {
  const WorkloadSpec spec = Spec();
  for (int layer = 0; layer < spec.geometry.layers; ++layer) {
    const OpInputs in = MakeOpInputs(spec, /*conversation=*/3, /*turn=*/0, i, layer, 1);
    const UpdateCall call = DecodeCallOf(in, layer, slot);
    absl::Status s = client.Update(kModel, call).status();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// LookupPrefix of exactly the prefix of `n` tokens (no shorter candidate).
v1::LookupPrefixResponse Lookup(StateCacheClient& client, int n) {
  v1::LookupPrefixRequest req;
  req.set_model_id(kModel);
  const PrefixKey want = KeyOfTokens(Tokens(n));
  v1::PrefixKey* k = req.mutable_keys()->add_keys();
  k->set_hash(want.hash);
  k->set_num_tokens(want.num_tokens);
  v1::LookupPrefixResponse resp;
  grpc::ClientContext ctx;
  client.PrepareContext(&ctx);
  grpc::Status s = client.stub().LookupPrefix(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

v1::CheckpointTierStats RemoteStats(StateCacheClient& client) {
  auto stats = client.GetStats(kModel);
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (stats.ok() && stats->models_size() == 1) {
    for (const auto& t : stats->models(0).stats().checkpoint_tiers()) {
      if (t.tier() == v1::CHECKPOINT_TIER_REMOTE) return t;
    }
  }
  ADD_FAILURE() << "no remote tier in GetStats";
  return {};
}

// The Redis keys of this test's checkpoints, by num_tokens (key field 4 of
// sc:<tags>:<hash>:<num_tokens>:<kind>:<digest>).
std::vector<std::string> RedisKeysOf(int port, int num_tokens) {
  redisContext* c = redisConnect("127.0.0.1", port);
  std::vector<std::string> keys;
  auto* r = static_cast<redisReply*>(redisCommand(c, "KEYS sc:*"));
  for (size_t i = 0; r != nullptr && i < r->elements; ++i) {
    const std::string k(r->element[i]->str, r->element[i]->len);
    std::vector<std::string> parts = absl::StrSplit(k, ':');
    if (parts.size() == 6 && parts[3] == std::to_string(num_tokens)) keys.push_back(k);
  }
  if (r != nullptr) freeReplyObject(r);
  redisFree(c);
  return keys;
}

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    redis_ = std::make_unique<RedisServer>(FreeRedisPort());
    ASSERT_NO_FATAL_FAILURE(redis_->Start());
    const char* base = std::getenv("TEST_TMPDIR");
    tmp_ = absl::StrCat(base ? base : "/tmp", "/remote-", getpid());
    ASSERT_EQ(std::system(absl::StrCat("rm -rf '", tmp_, "' && mkdir -p '", tmp_, "'").c_str()), 0);
  }
  // The eviction-path servers a and b: one checkpoint each, no write-through.
  void StartEvictionPath() {
    StartServers({"a", "b"}, {"--redis_write_through=false", "--redis_checkpoint_timeout_ms=200"},
                 /*checkpoints=*/1);
  }
  // Servers `names` with `flags`, each registering the model with
  // `checkpoints` entries of checkpoint memory.
  void StartServers(std::vector<std::string> names, std::vector<std::string> flags,
                    int checkpoints) {
    for (const std::string& name : names) {
      std::vector<std::string> args = {"--backend=cpu", "--state_memory_bytes=16777216",
                                       "--checkpoint_memory_bytes=16777216",
                                       absl::StrCat("--data_dir=", tmp_, "/", name),
                                       "--redis_checkpoint_address=" + redis_->address()};
      args.insert(args.end(), flags.begin(), flags.end());
      servers_.push_back(
          std::make_unique<ServerProcess>(args, absl::StrCat(tmp_, "/", name, ".log")));
      ASSERT_GT(servers_.back()->port(), 0) << servers_.back()->log();
      auto client = StateCacheClient::Connect(servers_.back()->target());
      ASSERT_TRUE(client.ok()) << client.status();
      clients_.push_back(std::move(*client));
      ModelRegistration r;
      r.model_id = kModel;
      r.geometry = Spec().geometry;
      r.format = Spec().format;
      r.slots = 4;
      r.checkpoints = checkpoints;  // 1: every older snapshot is demoted to Redis
      ASSERT_TRUE(clients_.back()->RegisterModel(r).ok());
    }
  }
  StateCacheClient& a() { return *clients_[0]; }
  StateCacheClient& b() { return *clients_[1]; }
  StateCacheClient& c() { return *clients_[2]; }

  // Steps and snapshots one conversation on A after each of 4 steps; returns
  // A's export at each snapshot (index n - 1). 1..3 end in Redis.
  std::vector<std::string> ConversationOnA(SlotHandle slot) {
    std::vector<std::string> packed;
    for (int n = 1; n <= 4; ++n) {
      EXPECT_TRUE(Step(a(), slot, n).ok());
      auto key = a().Snapshot(kModel, slot, Tokens(n), AuxOf(n));
      EXPECT_TRUE(key.ok()) << key.status();
      auto e = a().Export(kModel, slot);
      EXPECT_TRUE(e.ok()) << e.status();
      packed.push_back(e.ok() ? e->packed : "");
    }
    return packed;
  }

  std::unique_ptr<RedisServer> redis_;
  std::string tmp_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::vector<std::unique_ptr<StateCacheClient>> clients_;
};

TEST_F(RemoteTierTest, SnapshotOnARestoresOnBByteIdentical) {
  ASSERT_NO_FATAL_FAILURE(StartEvictionPath());
  auto slots_a = a().AllocateSlots(kModel, 1);
  auto slots_b = b().AllocateSlots(kModel, 1);
  ASSERT_TRUE(slots_a.ok() && slots_b.ok());
  const std::vector<std::string> packed = ConversationOnA((*slots_a)[0]);
  ASSERT_EQ(RedisKeysOf(redis_->port(), 2).size(), 1u);
  v1::CheckpointTierStats on_a = RemoteStats(a());
  EXPECT_EQ(on_a.checkpoints(), 3);  // written by A, not taken
  EXPECT_GT(on_a.bytes(), 3 * static_cast<int64_t>(packed[0].size()));
  EXPECT_EQ(on_a.errors(), 0);

  for (int n : {2, 1}) {
    const v1::LookupPrefixResponse hit = Lookup(b(), n);
    // A hit leaves the blob for the other servers.
    EXPECT_EQ(RedisKeysOf(redis_->port(), n).size(), 1u) << "prefix " << n << " gone from Redis";
    ASSERT_TRUE(hit.hit()) << "prefix " << n;
    EXPECT_EQ(hit.tier(), v1::CHECKPOINT_TIER_REMOTE);
    EXPECT_EQ(hit.key().num_tokens(), n);
    auto restored =
        b().Restore(kModel, (*slots_b)[0], PrefixKey{hit.key().hash(), n}, hit.lease_id());
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(restored->aux, AuxOf(n));
    auto e = b().Export(kModel, (*slots_b)[0]);
    ASSERT_TRUE(e.ok());
    EXPECT_TRUE(e->packed == packed[n - 1]) << "prefix " << n << ": B restored other bytes";
    EXPECT_TRUE(Step(b(), (*slots_b)[0], 50 + n).ok());
  }
  // Restoring 1 evicted 2 from B's checkpoint memory into Redis: A finds it there.
  EXPECT_EQ(RedisKeysOf(redis_->port(), 2).size(), 1u);
  EXPECT_EQ(Lookup(a(), 2).tier(), v1::CHECKPOINT_TIER_REMOTE);
  const v1::CheckpointTierStats on_b = RemoteStats(b());
  EXPECT_EQ(on_b.hits(), 2);
  EXPECT_EQ(on_b.promotions(), 2);
  EXPECT_GT(on_b.requests(), 0);
  EXPECT_GT(on_b.request_micros(), 0);
  EXPECT_EQ(on_b.errors(), 0);
}

TEST_F(RemoteTierTest, CorruptBlobInRedisIsNeverRestored) {
  ASSERT_NO_FATAL_FAILURE(StartEvictionPath());
  auto slots_a = a().AllocateSlots(kModel, 1);
  ASSERT_TRUE(slots_a.ok());
  ConversationOnA((*slots_a)[0]);
  const std::vector<std::string> keys = RedisKeysOf(redis_->port(), 3);
  ASSERT_EQ(keys.size(), 1u);
  redisContext* c = redisConnect("127.0.0.1", redis_->port());
  auto* r = static_cast<redisReply*>(redisCommand(c, "GET %s", keys[0].c_str()));
  ASSERT_EQ(r->type, REDIS_REPLY_STRING);
  std::string v(r->str, r->len);
  freeReplyObject(r);
  v[v.size() / 2] ^= 0x40;  // a payload byte: only the CRC can tell
  r = static_cast<redisReply*>(redisCommand(c, "SET %s %b", keys[0].c_str(), v.data(), v.size()));
  freeReplyObject(r);
  redisFree(c);

  EXPECT_FALSE(Lookup(b(), 3).hit());  // deleted, the search finds nothing else
  EXPECT_TRUE(RedisKeysOf(redis_->port(), 3).empty());
  EXPECT_EQ(RemoteStats(b()).dropped_corrupt(), 1);
  auto slots_b = b().AllocateSlots(kModel, 1);
  ASSERT_TRUE(slots_b.ok());
  EXPECT_FALSE(b().Restore(kModel, (*slots_b)[0], KeyOfTokens(Tokens(3))).ok());
  // The intact neighbours still come back.
  EXPECT_EQ(Lookup(b(), 2).tier(), v1::CHECKPOINT_TIER_REMOTE);
}

TEST_F(RemoteTierTest, RedisKilledLookupsMissUpdatesKeepWorking) {
  ASSERT_NO_FATAL_FAILURE(StartEvictionPath());
  auto slots_a = a().AllocateSlots(kModel, 1);
  ASSERT_TRUE(slots_a.ok());
  ConversationOnA((*slots_a)[0]);
  redis_->Stop();
  const absl::Time start = absl::Now();
  for (int n = 1; n <= 3; ++n) EXPECT_FALSE(Lookup(b(), n).hit()) << "prefix " << n;
  // A keeps updating and snapshotting; each snapshot demotes the previous
  // one into the dead Redis (dropped).
  for (int n = 5; n <= 10; ++n) {
    ASSERT_TRUE(Step(a(), (*slots_a)[0], n).ok()) << "step " << n;
    auto snap = a().Snapshot(kModel, (*slots_a)[0], Tokens(n), AuxOf(n));
    ASSERT_TRUE(snap.ok()) << "snapshot " << n << ": " << snap.status();
  }
  const v1::LookupPrefixResponse device_hit = Lookup(a(), 10);  // device tier unaffected
  EXPECT_TRUE(device_hit.hit());
  EXPECT_EQ(device_hit.tier(), v1::CHECKPOINT_TIER_DEVICE);
  ASSERT_TRUE(a().ReleaseLease(kModel, device_hit.lease_id()).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_GE(RemoteStats(a()).errors(), 1);
  EXPECT_GE(RemoteStats(b()).errors(), 1);
  // Redis back: new demotions are found again.
  ASSERT_NO_FATAL_FAILURE(redis_->Start());
  absl::SleepFor(absl::Milliseconds(1200));  // breaker cool-down (1 s default)
  ASSERT_TRUE(Step(a(), (*slots_a)[0], 11).ok());
  auto snap = a().Snapshot(kModel, (*slots_a)[0], Tokens(11), AuxOf(11));  // demotes 10
  ASSERT_TRUE(snap.ok()) << snap.status() << "\n" << servers_[0]->log();
  const v1::LookupPrefixResponse hit = Lookup(b(), 10);
  EXPECT_TRUE(hit.hit());
  EXPECT_EQ(hit.tier(), v1::CHECKPOINT_TIER_REMOTE);
}

// Waits until `client`'s server wrote `n` snapshots through (false after 10 s).
bool WaitWrittenThrough(StateCacheClient& client, int64_t n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (RemoteStats(client).write_through_written() < n) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

TEST_F(RemoteTierTest, WriteThroughSharesASnapshotStillHeldOnA) {
  // Default Redis flags: write-through on, default timeouts.
  ASSERT_NO_FATAL_FAILURE(StartServers({"a", "b", "c"}, {}, /*checkpoints=*/8));
  auto slots_a = a().AllocateSlots(kModel, 1);
  ASSERT_TRUE(slots_a.ok());
  const std::vector<std::string> packed = ConversationOnA((*slots_a)[0]);
  ASSERT_TRUE(WaitWrittenThrough(a(), 4));
  // Nothing left A's checkpoint memory: A serves its own prefix from DEVICE.
  const v1::LookupPrefixResponse own = Lookup(a(), 4);
  ASSERT_TRUE(own.hit());
  EXPECT_EQ(own.tier(), v1::CHECKPOINT_TIER_DEVICE);
  ASSERT_TRUE(a().ReleaseLease(kModel, own.lease_id()).ok());
  auto stats_a = a().GetStats(kModel);
  ASSERT_TRUE(stats_a.ok());
  EXPECT_EQ(stats_a->models(0).stats().evictions(), 0);
  const v1::CheckpointTierStats on_a = RemoteStats(a());
  EXPECT_EQ(on_a.checkpoints(), 4);
  EXPECT_EQ(on_a.write_through_dropped(), 0);
  EXPECT_EQ(on_a.errors(), 0);
  // B, then C: each finds it in Redis and restores A's exact bytes.
  for (StateCacheClient* other : {&b(), &c()}) {
    const v1::LookupPrefixResponse hit = Lookup(*other, 4);
    ASSERT_TRUE(hit.hit());
    EXPECT_EQ(hit.tier(), v1::CHECKPOINT_TIER_REMOTE);
    auto slot = other->AllocateSlots(kModel, 1);
    ASSERT_TRUE(slot.ok());
    auto restored = other->Restore(kModel, (*slot)[0], PrefixKey{hit.key().hash(), 4},
                                   hit.lease_id());
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(restored->aux, AuxOf(4));
    auto e = other->Export(kModel, (*slot)[0]);
    ASSERT_TRUE(e.ok());
    EXPECT_TRUE(e->packed == packed[3]) << "restored other bytes than A's";
    EXPECT_TRUE(Step(*other, (*slot)[0], 60).ok());
    EXPECT_EQ(RedisKeysOf(redis_->port(), 4).size(), 1u);  // not consumed
  }
  EXPECT_EQ(RemoteStats(c()).promotions(), 1);
}

TEST_F(RemoteTierTest, WriteThroughWithRedisKilledLeavesSnapshotsAndUpdates) {
  ASSERT_NO_FATAL_FAILURE(StartServers({"a"}, {}, /*checkpoints=*/2));
  auto slots_a = a().AllocateSlots(kModel, 1);
  ASSERT_TRUE(slots_a.ok());
  redis_->Stop();
  const absl::Time start = absl::Now();
  for (int n = 1; n <= 10; ++n) {
    ASSERT_TRUE(Step(a(), (*slots_a)[0], n).ok()) << "step " << n;
    auto snap = a().Snapshot(kModel, (*slots_a)[0], Tokens(n), AuxOf(n));
    ASSERT_TRUE(snap.ok()) << "snapshot " << n << ": " << snap.status();
    const v1::LookupPrefixResponse hit = Lookup(a(), n);
    ASSERT_TRUE(hit.hit()) << n;
    EXPECT_EQ(hit.tier(), v1::CHECKPOINT_TIER_DEVICE);
    ASSERT_TRUE(a().ReleaseLease(kModel, hit.lease_id()).ok());
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_FALSE(Lookup(a(), 1).hit());  // evicted, Redis down: a miss
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (RemoteStats(a()).errors() < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(RemoteStats(a()).errors(), 1);
}

}  // namespace
}  // namespace statecache
