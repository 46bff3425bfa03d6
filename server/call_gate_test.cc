#include "server/call_gate.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

class CallGateTest : public ::testing::Test {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1000);
  CallGate gate_{[this] { return now_; }};
};

TEST_F(CallGateTest, AdmitsUntilTheDrainThenRefuses) {
  {
    CallGate::Ticket before(&gate_);
    EXPECT_TRUE(before.admitted());
    EXPECT_EQ(gate_.running(), 1);
    gate_.BeginDrain();
    CallGate::Ticket after(&gate_);
    EXPECT_FALSE(after.admitted());
    EXPECT_EQ(gate_.running(), 1);  // the refused call never counts
  }
  EXPECT_EQ(gate_.running(), 0);
  EXPECT_TRUE(gate_.draining());
}

TEST_F(CallGateTest, QuietNeedsNoRunningCallAndNoRecentArrival) {
  gate_.BeginDrain();
  const absl::Duration quiet = absl::Milliseconds(100);
  {
    CallGate::Ticket refused(&gate_);  // arrives at now_
    ASSERT_FALSE(refused.admitted());
  }
  // Deadline reached 50 ms after the last arrival: not quiet yet.
  now_ += absl::Milliseconds(50);
  EXPECT_FALSE(gate_.AwaitQuiet(quiet, now_));
  now_ += absl::Milliseconds(50);
  EXPECT_TRUE(gate_.AwaitQuiet(quiet, now_));
}

TEST_F(CallGateTest, ARunningCallHoldsTheQuietUntilItEnds) {
  auto ticket = std::make_unique<CallGate::Ticket>(&gate_);
  ASSERT_TRUE(ticket->admitted());
  now_ += absl::Seconds(10);
  gate_.BeginDrain();
  EXPECT_FALSE(gate_.AwaitQuiet(absl::Milliseconds(1), now_));
  ticket.reset();
  EXPECT_TRUE(gate_.AwaitQuiet(absl::Milliseconds(1), now_));
}

TEST_F(CallGateTest, IdleStreamsDoNotCountAndAreCancelled) {
  std::atomic<int> cancels{0};
  absl::Notification reading, release;
  bool open = false, got = true;
  std::thread stream([&] {
    CallGate::Ticket ticket(&gate_, [&] {
      ++cancels;
      release.Notify();  // what TryCancel does to a blocked Read
    });
    ASSERT_TRUE(ticket.admitted());
    open = ticket.Idle(
        [&] {
          reading.Notify();
          release.WaitForNotification();
          return false;
        },
        &got);
  });
  reading.WaitForNotification();
  EXPECT_EQ(gate_.running(), 0);  // waiting for a message is not running
  now_ += absl::Seconds(1);
  gate_.BeginDrain();
  EXPECT_TRUE(gate_.AwaitQuiet(absl::Milliseconds(100), now_));
  EXPECT_EQ(gate_.CancelIdleStreams(), 1);
  stream.join();
  EXPECT_EQ(cancels.load(), 1);
  EXPECT_FALSE(open);  // the drain began during the read
  EXPECT_FALSE(got);
  EXPECT_EQ(gate_.running(), 0);
}

TEST_F(CallGateTest, IdleReportsAMessageReadDuringTheDrain) {
  CallGate::Ticket ticket(&gate_);
  ASSERT_TRUE(ticket.admitted());
  bool got = false;
  EXPECT_TRUE(ticket.Idle([] { return true; }, &got));
  EXPECT_TRUE(got);
  EXPECT_FALSE(ticket.Idle(
      [this] {
        gate_.BeginDrain();
        return true;
      },
      &got));
  EXPECT_TRUE(got);  // read, and must be answered as not run
  bool ran = false;
  EXPECT_FALSE(ticket.Idle([&] { return ran = true; }, &got));
  EXPECT_FALSE(ran);  // draining already: no read at all
  EXPECT_FALSE(got);
  EXPECT_EQ(gate_.running(), 1);
}

}  // namespace
}  // namespace statecache
