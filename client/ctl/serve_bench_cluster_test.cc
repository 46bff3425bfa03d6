// Two statecached children sharing one real redis-server: a checkpoint
// snapshotted on A and evicted there is restored on B; serve-bench's
// two-instance rows count cross-instance restores only with the shared Redis;
// the Qwen3.6 subject's checkpoint sizes and counts.
#include "client/ctl/serve_bench_cluster.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/ctl/ctl_command.h"
#include "client/remote_store/demo_support.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

// A statecached child on `redis`; `eviction_only`: no write-through (Redis
// then only receives what checkpoint memory evicts), else the default flags.
ServerHandle Child(const std::string& redis, bool eviction_only) {
  ServerSetup s;
  s.state_memory_bytes = 8 << 20;
  s.checkpoint_memory_bytes = 8 << 20;
  s.extra_args = {absl::StrCat("--redis_checkpoint_address=", redis)};
  if (eviction_only) {
    s.extra_args.push_back("--redis_write_through=false");
    s.extra_args.push_back("--redis_checkpoint_timeout_ms=2000");
  }
  absl::StatusOr<ServerHandle> h = StartOrConnect(s);
  EXPECT_TRUE(h.ok()) << h.status();
  return std::move(*h);
}

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 7 + salt) % 256);
  return t;
}

TEST(RedisProcessTest, AnswersCommands) {
  absl::StatusOr<std::unique_ptr<RedisProcess>> redis = RedisProcess::Start("redis-server");
  ASSERT_TRUE(redis.ok()) << redis.status();
  EXPECT_EQ(*RedisCommand("127.0.0.1", (*redis)->port(), {"SET", "k", "v"}), "+OK");
  EXPECT_EQ(*RedisCommand("127.0.0.1", (*redis)->port(), {"FLUSHALL"}), "+OK");
  EXPECT_EQ(*RedisCommand("127.0.0.1", (*redis)->port(), {"DBSIZE"}), ":0");
  EXPECT_EQ(RedisCommand("127.0.0.1", (*redis)->port(), {"NOSUCHCOMMAND"}).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(RedisProcess::Start("/nonexistent/redis-server").status().code(),
            absl::StatusCode::kUnavailable);
}

// The server-level contracts serve-bench's Redis rows rest on: without
// write-through, a checkpoint evicted on A is restored on B.
TEST(SharedRedisTest, CheckpointEvictedOnARestoresOnB) {
  absl::StatusOr<std::unique_ptr<RedisProcess>> redis = RedisProcess::Start("redis-server");
  ASSERT_TRUE(redis.ok()) << redis.status();
  ServerHandle a = Child((*redis)->address(), /*eviction_only=*/true);
  ServerHandle b = Child((*redis)->address(), /*eviction_only=*/true);
  ASSERT_TRUE(a.client && b.client);
  const ModelGeometry g{Arch::kGdn, 2, 1, 2, 32, 32, 0.f};
  absl::StatusOr<StateLayout> layout = StateLayout::Identity(g, *ParseFormatSpec("bf16"));
  ASSERT_TRUE(layout.ok());
  Registration reg;
  reg.slots = 1;
  reg.checkpoints = 1;  // a second snapshot on A evicts the first to Redis
  for (ServerHandle* s : {&a, &b}) {
    absl::StatusOr<v1::ModelInfo> mi = RegisterLayout(s->client.get(), "shared", *layout, reg);
    ASSERT_TRUE(mi.ok()) << mi.status();
    ASSERT_EQ(mi->model_id(), "shared");
  }
  absl::StatusOr<std::vector<SlotHandle>> slot_a = a.client->AllocateSlots("shared", 1);
  absl::StatusOr<std::vector<SlotHandle>> slot_b = b.client->AllocateSlots("shared", 1);
  ASSERT_TRUE(slot_a.ok() && slot_b.ok());
  const std::vector<int32_t> first = Tokens(40, 1), second = Tokens(40, 2);
  const std::vector<std::string> aux = {"conv-0", "conv-1"};
  ASSERT_TRUE(a.client->Snapshot("shared", (*slot_a)[0], first, aux).ok());
  // Not evicted on A yet: B does not see it (Redis is a demotion tier).
  absl::StatusOr<PrefixLookup> early = b.client->LookupPrefix("shared", first);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_FALSE(early->hit);
  ASSERT_TRUE(a.client->Snapshot("shared", (*slot_a)[0], second, aux).ok());
  absl::StatusOr<PrefixLookup> hit = b.client->LookupPrefix("shared", first);
  ASSERT_TRUE(hit.ok()) << hit.status();
  ASSERT_TRUE(hit->hit);
  EXPECT_EQ(hit->key.num_tokens, 40);
  absl::StatusOr<RestoredCheckpoint> r =
      b.client->Restore("shared", (*slot_b)[0], hit->key, hit->lease_id);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->aux, aux);
  EXPECT_EQ(r->num_tokens, 40);
}

// With the default flags (write-through): a checkpoint A still holds is
// restored on B, and again on A's neighbour C (a hit leaves it in Redis).
TEST(SharedRedisTest, CheckpointStillHeldOnARestoresOnBAndC) {
  absl::StatusOr<std::unique_ptr<RedisProcess>> redis = RedisProcess::Start("redis-server");
  ASSERT_TRUE(redis.ok()) << redis.status();
  ServerHandle a = Child((*redis)->address(), /*eviction_only=*/false);
  ServerHandle b = Child((*redis)->address(), /*eviction_only=*/false);
  ServerHandle c = Child((*redis)->address(), /*eviction_only=*/false);
  ASSERT_TRUE(a.client && b.client && c.client);
  const ModelGeometry g{Arch::kGdn, 2, 1, 2, 32, 32, 0.f};
  absl::StatusOr<StateLayout> layout = StateLayout::Identity(g, *ParseFormatSpec("bf16"));
  ASSERT_TRUE(layout.ok());
  Registration reg;
  reg.slots = 1;
  reg.checkpoints = 4;  // nothing is evicted
  for (ServerHandle* s : {&a, &b, &c}) {
    ASSERT_TRUE(RegisterLayout(s->client.get(), "shared", *layout, reg).ok());
  }
  absl::StatusOr<std::vector<SlotHandle>> slot_a = a.client->AllocateSlots("shared", 1);
  ASSERT_TRUE(slot_a.ok());
  const std::vector<int32_t> first = Tokens(40, 1);
  const std::vector<std::string> aux = {"conv-0", "conv-1"};
  ASSERT_TRUE(a.client->Snapshot("shared", (*slot_a)[0], first, aux).ok());
  for (ServerHandle* s : {&b, &c}) {
    // The write-through runs in the background: the hit comes within 5 s.
    absl::StatusOr<PrefixLookup> hit;
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    do {
      hit = s->client->LookupPrefix("shared", first);
      ASSERT_TRUE(hit.ok()) << hit.status();
      if (!hit->hit) absl::SleepFor(absl::Milliseconds(20));
    } while (!hit->hit && absl::Now() < deadline);
    ASSERT_TRUE(hit->hit);
    EXPECT_EQ(hit->key.num_tokens, 40);
    absl::StatusOr<std::vector<SlotHandle>> slot = s->client->AllocateSlots("shared", 1);
    ASSERT_TRUE(slot.ok());
    absl::StatusOr<RestoredCheckpoint> r =
        s->client->Restore("shared", (*slot)[0], hit->key, hit->lease_id);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->aux, aux);
    EXPECT_EQ(r->num_tokens, 40);
  }
}

// Runs serve-bench, returning its status and stdout.
std::pair<absl::Status, std::string> ServeBench(const std::vector<std::string>& args) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buf, &size);
  CtlContext ctx("", absl::Seconds(5), out);
  absl::Status status = ServeBenchCommand().run(ctx, args);
  std::fclose(out);
  std::string text(buf, size);
  free(buf);
  return {status, text};
}

// Column `col` (0 = setup) of the Markdown serving row of setup / format.
std::string Cell(const std::string& text, const std::string& setup, const std::string& format,
                 int col) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<std::string> cells = absl::StrSplit(line, '|');
    // "| setup | format | ..." splits into "", " setup ", " format ", ...
    if (cells.size() < 15 || cells[1] != absl::StrCat(" ", setup, " ") ||
        cells[2] != absl::StrCat(" ", format, " ") || cells[3].find("B") == std::string::npos) {
      continue;
    }
    return std::string(absl::StripAsciiWhitespace(cells[col + 1]));
  }
  return "(no row)";
}

TEST(ServeBenchClusterTest, CrossInstanceRestoresNeedTheSharedRedis) {
  absl::StatusOr<std::unique_ptr<RedisProcess>> redis = RedisProcess::Start("redis-server");
  ASSERT_TRUE(redis.ok()) << redis.status();
  // fp32 gdn-tiny checkpoints are 1 MiB: one per instance; round robin moves
  // every turn to the other instance.
  auto [status, text] = ServeBench(
      {"--formats=fp32", "--budget_mib=1", "--conversations=3", "--turns=3",
       "--prompt_bytes=24", "--reply_bytes=4", "--round_robin", "--repeats=1",
       "--setups=2,2+redis", "--route=round_robin", "--redis=" + (*redis)->address(),
       "--markdown"});
  ASSERT_TRUE(status.ok()) << status << "\n" << text;
  EXPECT_THAT(text, HasSubstr("round robin over 2 instances (no affinity)"));
  int64_t without = -1, with = -1, hits_without = -1, hits_with = -1;
  ASSERT_TRUE(absl::SimpleAtoi(Cell(text, "2", "fp32", 8), &without)) << text;
  ASSERT_TRUE(absl::SimpleAtoi(Cell(text, "2+redis", "fp32", 8), &with)) << text;
  EXPECT_EQ(without, 0) << text;
  EXPECT_GT(with, 0) << text;
  ASSERT_TRUE(absl::SimpleAtoi(Cell(text, "2", "fp32", 5), &hits_without)) << text;
  ASSERT_TRUE(absl::SimpleAtoi(Cell(text, "2+redis", "fp32", 5), &hits_with)) << text;
  EXPECT_GT(hits_with, hits_without) << text;
  EXPECT_EQ(Cell(text, "2", "fp32", 3), "1") << text;  // checkpoints per instance
}

TEST(ServeBenchClusterTest, Qwen36SubjectSizesTheCheckpoints) {
  // bf16 Qwen3.6 states: 30 MiB per checkpoint; 0.1 GiB holds 3.
  auto [status, text] = ServeBench(
      {"--formats=bf16", "--budget_gib=0.1", "--conversations=2", "--turns=2",
       "--prompt_bytes=16", "--reply_bytes=2", "--round_robin", "--repeats=1",
       "--state_geometry=qwen3.6", "--markdown"});
  ASSERT_TRUE(status.ok()) << status << "\n" << text;
  EXPECT_THAT(text, HasSubstr("Qwen3.6-35B-A3B geometry (30 layers x 16 key / 32 value heads"));
  EXPECT_THAT(text, HasSubstr("60.00 MiB of fp32 per sequence) + 1.41 MiB of conv windows"));
  EXPECT_THAT(text, HasSubstr("| 1 | bf16 | 30.00 MiB | 3 | 2/2 (100%) | 2 | 0 |"));
}

TEST(ServeBenchClusterTest, RunsOnGivenServers) {
  ServerSetup setup;
  absl::StatusOr<ServerHandle> a = StartOrConnect(setup);
  absl::StatusOr<ServerHandle> b = StartOrConnect(setup);
  ASSERT_TRUE(a.ok() && b.ok());
  auto [status, text] = ServeBench(
      {"--servers=" + a->child->address() + "," + b->child->address(), "--formats=bf16",
       "--conversations=2", "--turns=2", "--prompt_bytes=16", "--reply_bytes=2", "--round_robin",
       "--repeats=1", "--join_after=0", "--markdown"});
  ASSERT_TRUE(status.ok()) << status << "\n" << text;
  EXPECT_THAT(text, HasSubstr("setup 2 given  hash ring over 2 instances;"));
  EXPECT_EQ(Cell(text, "2 given", "bf16", 4), "2/2 (100%)") << text;  // affinity, no join
  // Everything serve-bench registered is dropped again.
  absl::StatusOr<std::vector<v1::ModelInfo>> left = a->client->ListModels();
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
}

TEST(ServeBenchClusterTest, BadClusterFlagsNameTheFlag) {
  for (const auto& [arg, field] : std::vector<std::pair<std::string, std::string>>{
           {"--setups=2+disk", "--setups"},
           {"--route=random", "--route"},
           {"--state_geometry=llama", "--state_geometry"},
           {"--redis=nohost", "--redis"},
           {"--join_after=-2", "--join_after"}}) {
    auto [status, text] = ServeBench({arg});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << arg;
    EXPECT_THAT(status.message(), HasSubstr(field)) << arg;
  }
  auto [both, text] = ServeBench({"--budget_mib=1", "--budget_gib=1"});
  EXPECT_THAT(both.message(), HasSubstr("--budget_gib"));
  // Checked before anything runs (no server answers at this address).
  auto [given, given_text] = ServeBench({"--server=unix:/nonexistent.sock", "--setups=1,2"});
  EXPECT_EQ(given.code(), absl::StatusCode::kInvalidArgument) << given;
  EXPECT_THAT(given.message(), HasSubstr("'2' starts its own statecacheds"));
  EXPECT_EQ(given_text, "");
  auto [servers, servers_text] = ServeBench({"--servers=unix:/a.sock,unix:/b.sock", "--setups=2"});
  EXPECT_THAT(servers.message(), HasSubstr("--setups: not with --servers"));
}

}  // namespace
}  // namespace statecache
