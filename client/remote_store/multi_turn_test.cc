// The multi-turn workload: conversation cutting, schedules, and served runs
// on a statecached child (CPU backend) checked against the in-process FP32
// reference, with exact hit / restore / recompute accounting.
#include "client/remote_store/multi_turn.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "client/model/corpus.h"
#include "client/remote_store/child_server.h"
#include "kernels/io/test_data.h"

namespace statecache {
namespace {

using ::absl::StatusCode;
using ::testing::HasSubstr;

std::vector<Document> Docs() {
  std::vector<Document> docs;
  for (const char* dom : {"a", "a", "b"}) {
    Document d;
    d.domain = dom;
    for (int i = 0; i < 200; ++i) d.bytes.push_back((i * 7 + docs.size() * 31) % 256);
    docs.push_back(d);
  }
  return docs;
}

TEST(MakeConversationsTest, CutsTurnsFromDomainInterleavedDocuments) {
  WorkloadOptions o;
  o.conversations = 3;
  o.turns = 2;
  o.prompt_bytes = 10;
  o.reply_bytes = 3;
  auto convs = MakeConversations(Docs(), o);
  ASSERT_TRUE(convs.ok()) << convs.status();
  ASSERT_EQ(convs->size(), 3u);
  // a#0, b#0, a#1.
  EXPECT_EQ((*convs)[0].name, "a#0");
  EXPECT_EQ((*convs)[1].name, "b#0");
  EXPECT_EQ((*convs)[2].name, "a#1");
  const std::vector<Document> docs = Docs();
  const std::vector<int32_t> want(docs[2].bytes.begin(), docs[2].bytes.begin() + 26);
  EXPECT_EQ((*convs)[1].Tokens(), want);
  EXPECT_EQ((*convs)[1].turns[1].prompt,
            std::vector<int32_t>(docs[2].bytes.begin() + 13, docs[2].bytes.begin() + 23));
  EXPECT_EQ((*convs)[1].turns[1].reply.size(), 3u);
}

TEST(MakeConversationsTest, Errors) {
  WorkloadOptions o;
  o.conversations = 0;
  EXPECT_EQ(MakeConversations(Docs(), o).status().code(), StatusCode::kInvalidArgument);
  o.conversations = 4;
  auto many = MakeConversations(Docs(), o);
  EXPECT_EQ(many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(many.status().message()), HasSubstr("conversations"));
  o.conversations = 1;
  o.turns = 2;
  o.prompt_bytes = 100;
  o.reply_bytes = 0;
  EXPECT_EQ(MakeConversations(Docs(), o).status().code(), StatusCode::kInvalidArgument);
  o.reply_bytes = 1;
  auto shortdoc = MakeConversations(Docs(), o);  // needs 203 bytes, has 200
  EXPECT_EQ(shortdoc.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shortdoc.status().message()), HasSubstr("203"));
}

TEST(MakeScheduleTest, RoundRobinAndShuffledKeepTurnOrder) {
  WorkloadOptions o;
  o.conversations = 3;
  o.turns = 3;
  o.prompt_bytes = 5;
  o.reply_bytes = 2;
  auto convs = MakeConversations(Docs(), o);
  ASSERT_TRUE(convs.ok());
  const auto rr = MakeSchedule(*convs, o);
  const std::vector<std::pair<int, int>> want = {{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1},
                                                 {2, 1}, {0, 2}, {1, 2}, {2, 2}};
  EXPECT_EQ(rr, want);
  o.shuffle = true;
  const auto sh = MakeSchedule(*convs, o);
  EXPECT_EQ(sh, MakeSchedule(*convs, o));  // deterministic
  EXPECT_NE(sh, rr);
  ASSERT_EQ(sh.size(), 9u);
  std::vector<int> next(3, 0);
  for (const auto& [c, t] : sh) EXPECT_EQ(t, next[c]++);
  o.seed = 2;
  EXPECT_NE(MakeSchedule(*convs, o), sh);
}

TEST(PercentileTest, Interpolates) {
  EXPECT_EQ(Percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(Percentile({3, 1, 2}, 50), 2);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 0), 1);
}

class ServedWorkloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = SharedDataPath("models/gdn-tiny");
    ASSERT_TRUE(dir.ok()) << dir.status();
    auto model = LanguageModel::Load(*dir, {});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto corpus = SharedDataPath("corpus/heldout.jsonl");
    ASSERT_TRUE(corpus.ok());
    auto docs = ReadCorpus(*corpus);
    ASSERT_TRUE(docs.ok());
    WorkloadOptions o;
    o.conversations = 2;
    o.turns = 3;
    o.prompt_bytes = 24;
    o.reply_bytes = 4;
    convs_ = *MakeConversations(*docs, o);
    schedule_ = MakeSchedule(convs_, o);  // round robin
    auto bin = FindStatecached("");
    ASSERT_TRUE(bin.ok()) << bin.status();
    ChildServer::Options so;
    so.binary = *bin;
    so.args = {"--backend=cpu", "--state_memory_bytes=16777216",
               "--checkpoint_memory_bytes=16777216"};
    auto server = ChildServer::Start(so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    client_ = std::move(*StateCacheClient::Connect(server_->address()));
  }

  void Register(const std::string& id, const std::string& format, int checkpoints) {
    ModelRegistration r;
    r.model_id = id;
    r.geometry = model_->config().Geometry();
    r.format = format;
    r.slots = 2;
    r.checkpoints = checkpoints;
    auto info = client_->RegisterModel(r);
    ASSERT_TRUE(info.ok()) << info.status();
  }

  std::unique_ptr<LanguageModel> model_;
  std::vector<Conversation> convs_;
  std::vector<std::pair<int, int>> schedule_;
  std::unique_ptr<ChildServer> server_;
  std::unique_ptr<StateCacheClient> client_;
};

TEST_F(ServedWorkloadTest, AmpleCheckpointsRestoreEveryLaterTurnAndMatchFp32) {
  Register("fp32", "fp32", 16);
  auto run = RunRemoteWorkload(*model_, client_.get(), "fp32", convs_, schedule_, {});
  ASSERT_TRUE(run.ok()) << run.status();
  auto ref = RunFp32Reference(*model_, convs_, schedule_);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(run->turns.size(), 6u);
  for (const TurnStats& t : run->turns) {
    SCOPED_TRACE(t.turn);
    EXPECT_EQ(t.context_tokens, t.turn * 28);
    EXPECT_EQ(t.restored_tokens, t.context_tokens);  // turn 0: 0 (miss)
    EXPECT_EQ(t.recomputed_tokens, 0);
    EXPECT_EQ(t.prefilled_tokens, 24);
    EXPECT_GT(t.ttft_ms, 0);
    EXPECT_GE(t.turn_ms, t.ttft_ms);
  }
  // 2 conversations x 3 turns x 4 reply bytes x 4 layers UpdateStream calls.
  EXPECT_EQ(run->update_micros.size(), 2u * 3 * 4 * 4);
  auto acc = CompareRuns(*run, *ref);
  ASSERT_TRUE(acc.ok()) << acc.status();
  EXPECT_EQ(acc->predicted, 2 * (3 * 28 - 1));
  EXPECT_EQ(acc->reply_predicted, 2 * 3 * 4);
  // FP32 states on the server vs in process: equal up to summation order.
  EXPECT_NEAR(acc->bits_per_byte, acc->reference_bits_per_byte, 1e-4);
  EXPECT_GT(acc->reference_bits_per_byte, 0.5);
  EXPECT_LT(acc->reference_bits_per_byte, 4);
  EXPECT_GE(acc->agreement, 0.99);
  auto stats = client_->GetStats("fp32");
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->models(0).stats().restores(), 4);
  EXPECT_EQ(stats->models(0).stats().snapshots(), 6);

  // Self-comparison is exact; comparing with a different workload fails.
  auto self = CompareRuns(*ref, *ref);
  EXPECT_EQ(self->agreement, 1.0);
  EXPECT_EQ(self->bits_per_byte, self->reference_bits_per_byte);
  WorkloadResult other = *ref;
  other.scores[0].scored[0] = 0;
  EXPECT_EQ(CompareRuns(other, *ref).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ServedWorkloadTest, EvictedCheckpointsAreRecomputed) {
  // One checkpoint: in round robin, conversation 0's checkpoint is evicted by
  // conversation 1's before it is needed again.
  Register("one", "bf16", 1);
  Register("many", "bf16", 16);
  auto starved = RunRemoteWorkload(*model_, client_.get(), "one", convs_, schedule_, {});
  ASSERT_TRUE(starved.ok()) << starved.status();
  auto fed = RunRemoteWorkload(*model_, client_.get(), "many", convs_, schedule_, {});
  ASSERT_TRUE(fed.ok());
  for (const TurnStats& t : starved->turns) {
    EXPECT_EQ(t.restored_tokens, 0);
    EXPECT_EQ(t.recomputed_tokens, t.context_tokens);
    EXPECT_EQ(t.prefilled_tokens, t.context_tokens + 24);
  }
  auto stats = client_->GetStats("one");
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->models(0).stats().restores(), 0);
  EXPECT_EQ(stats->models(0).stats().evictions(), 5);
  // Recomputing from scratch stores the state once per turn instead of a
  // chain of restores; both are close to FP32.
  auto ref = RunFp32Reference(*model_, convs_, schedule_);
  auto a = CompareRuns(*starved, *ref);
  auto b = CompareRuns(*fed, *ref);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NEAR(a->bits_per_byte, a->reference_bits_per_byte, 0.02);
  EXPECT_NEAR(b->bits_per_byte, b->reference_bits_per_byte, 0.02);
}

}  // namespace
}  // namespace statecache
