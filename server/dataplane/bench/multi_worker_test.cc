// MultiWorker at a tiny geometry on the CPU backend: concurrent
// SubmitUpdates workers on distinct slots end bit-identical to a serial
// replay, with the step counts asked for.
#include "server/dataplane/bench/multi_worker.h"

#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"
#include "server/core/log.h"
#include "server/dataplane/bench/bench_common.h"

namespace statecache {
namespace bench {
namespace {

class MultiWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLoggingEnabled(false);
    geo_ = ModelGeometry{Arch::kGdn, /*layers=*/3, /*h_qk=*/1, /*h_v=*/2, 32, 32};
    // /tmp: a unix socket path must stay under 108 bytes (TEST_TMPDIR may not).
    ServerSpec ss;
    ss.listen = absl::StrCat("unix:/tmp/sc_mw_test_", getpid(), ".sock");
    ss.state_bytes = int64_t{64} << 20;
    absl::StatusOr<std::unique_ptr<ServerHandle>> s = ServerHandle::Start(ss);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    o_.target = server_->target();
    o_.geometry = geo_;
    o_.format = "damp";
    o_.batch = 3;
    o_.steps = 4;
    o_.warmup = 1;
  }

  ModelGeometry geo_;
  std::unique_ptr<ServerHandle> server_;
  MultiWorkerOptions o_;
};

TEST_F(MultiWorkerTest, ConcurrentWorkersEqualSerialReplay) {
  const int workers = 4;
  absl::StatusOr<MultiWorkerReport> r = RunMultiWorker(o_, workers);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->workers.size(), static_cast<size_t>(workers));
  for (const WorkerSteps& w : r->workers) {
    EXPECT_EQ(w.steps_run, o_.warmup + o_.steps);
    ASSERT_EQ(w.step_ms.size(), static_cast<size_t>(o_.steps));
    for (double ms : w.step_ms) EXPECT_GT(ms, 0);
  }
  EXPECT_EQ(r->o_compared, int64_t{workers} * geo_.layers * o_.batch * geo_.h_v * geo_.d_v);
  EXPECT_EQ(r->o_mismatches, 0);
  EXPECT_EQ(r->slots_compared, workers * o_.batch);
  EXPECT_EQ(r->slot_mismatches, 0);
  EXPECT_TRUE(r->workers_distinct);
  EXPECT_GT(r->wall_ms, 0);
}

TEST_F(MultiWorkerTest, OneWorkerAndSomeSlotsVerified) {
  o_.verify_slots = 2;
  o_.steps = 2;
  absl::StatusOr<MultiWorkerReport> r = RunMultiWorker(o_, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->workers.size(), 1u);
  EXPECT_EQ(r->workers[0].steps_run, 3);
  EXPECT_EQ(r->slots_compared, 2);
  EXPECT_EQ(r->slot_mismatches, 0);
  EXPECT_EQ(r->o_mismatches, 0);
  EXPECT_FALSE(r->workers_distinct);  // one worker: nothing to tell apart
}

TEST_F(MultiWorkerTest, LayerWaitsGiveTheSameResults) {
  o_.layer_waits = true;
  const int workers = 2;
  absl::StatusOr<MultiWorkerReport> r = RunMultiWorker(o_, workers);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->workers.size(), static_cast<size_t>(workers));
  for (const WorkerSteps& w : r->workers) EXPECT_EQ(w.steps_run, o_.warmup + o_.steps);
  EXPECT_EQ(r->o_compared, int64_t{workers} * geo_.layers * o_.batch * geo_.h_v * geo_.d_v);
  EXPECT_EQ(r->o_mismatches, 0);
  EXPECT_EQ(r->slot_mismatches, 0);
  EXPECT_TRUE(r->workers_distinct);
}

TEST_F(MultiWorkerTest, BadCountsNameTheField) {
  absl::StatusOr<MultiWorkerReport> r = RunMultiWorker(o_, 0);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("workers"), std::string::npos);
  o_.batch = 0;
  r = RunMultiWorker(o_, 2);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("batch"), std::string::npos);
}

TEST(PercentileTest, NearestRank) {
  EXPECT_EQ(Percentile({}, 50), 0);
  EXPECT_EQ(Percentile({3, 1, 2}, 50), 2);
  EXPECT_EQ(Percentile({1, 2, 3, 4}, 99), 4);
}

}  // namespace
}  // namespace bench
}  // namespace statecache
