// Load tests: concurrent clients on loopback, each running the multi-turn
// workload; afterwards every conversation's outputs equal a serial replay
// bit for bit, no slot is left allocated and the pool invariants hold.
#include <memory>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/core/log.h"
#include "server/loopback.h"
#include "server/server.h"
#include "tests/load/load_runner.h"
#include "tests/load/mixed_load.h"

namespace statecache {
namespace {

std::unique_ptr<StateCacheServer> StartServer(bool coalesce = false) {
  SetLoggingEnabled(false);
  StateCacheServer::Options so = LoopbackOptions(64 << 20, 64 << 20);
  so.compute.coalesce_updates = coalesce;
  auto s = StateCacheServer::Create(std::move(so));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

LoadOptions Options(StateCacheServer* server) {
  LoadOptions o;
  o.target = LoopbackTarget(*server);
  o.clients = 6;
  o.conversations_per_client = 2;
  o.spec.turns = 3;
  o.spec.slots = 16;
  o.check_invariants = [server]() -> absl::Status {
    for (const auto& m : server->registry().List()) {
      absl::Status s = m->slots->CheckInvariants();
      if (s.ok() && m->checkpoints) s = m->checkpoints->CheckInvariants();
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  };
  return o;
}

TEST(LoadTest, ConcurrentStreamingClientsMatchSerialReplay) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  LoadOptions o = Options(server.get());
  absl::StatusOr<LoadReport> r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->Summary();
  EXPECT_EQ(r->replay_mismatches, 0);
  EXPECT_EQ(r->conversations, 12);
  // Every later turn resumed from its checkpoint (capacity suffices).
  EXPECT_EQ(r->stats.restores, 12 * 2);
  EXPECT_EQ(r->stats.recomputes, 0);
  EXPECT_EQ(r->stats.acknowledged_updates, 12 * 3 * 4 * 2);
  EXPECT_GT(r->stats.PercentileUs(99), 0);
}

TEST(LoadTest, UnaryClientsWithCheckpointEvictionStillMatchReplay) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  LoadOptions o = Options(server.get());
  o.spec.use_stream = false;
  o.spec.model_id = "load-unary";
  o.spec.checkpoints = 3;  // fewer than live conversations: LRU evictions, recomputes
  absl::StatusOr<LoadReport> r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->Summary();
  EXPECT_EQ(r->replay_mismatches, 0);
  EXPECT_EQ(r->stats.restores + r->stats.recomputes, 12 * 2);
  auto m = server->registry().Find("load-unary");
  ASSERT_TRUE(m.ok());
  EXPECT_GT((*m)->checkpoints->stats().evictions, 0);
}

// The issue 33 workload, small: unary and streaming workers on distinct
// slots; every slot's final bytes and every output equal a serial replay.
void RunMixed(bool coalesce) {
  auto server = StartServer(coalesce);
  ASSERT_NE(server, nullptr);
  MixedLoadOptions o;
  o.target = LoopbackTarget(*server);
  o.unary_clients = 6;
  o.stream_clients = 2;
  o.steps = 4;
  absl::StatusOr<MixedLoadReport> r = RunMixedLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->Summary();
  EXPECT_EQ(r->updates, 8 * 4 * 2);
  EXPECT_EQ(r->replayed, 8);
  EXPECT_EQ(r->state_mismatches, 0);
  EXPECT_EQ(r->output_mismatches, 0);
  EXPECT_EQ(r->slots_allocated_after, 0);
}

TEST(LoadTest, MixedWorkersMatchSerialReplay) { RunMixed(false); }
TEST(LoadTest, MixedWorkersCoalescedMatchSerialReplay) { RunMixed(true); }

}  // namespace
}  // namespace statecache
