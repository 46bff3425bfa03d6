// SIGTERM during load, against the real statecached binary: clients run the
// multi-turn workload and register models while the server gets SIGTERM.
// The server must drain and exit 0; calls fail only with UNAVAILABLE (the
// call did not run; never CANCELLED, which would leave the client unsure); every acknowledged registration is there after a restart on the
// same --data_dir; and every conversation that completed before the signal
// has exactly the outputs of a serial replay on the restarted server (no
// acknowledged write was lost or corrupted).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/statecache_client.h"
#include "gtest/gtest.h"
#include "tests/faults/server_process.h"
#include "tests/load/workload.h"

namespace statecache {
namespace {

// The flags of every server of this test (--listen, --metrics_port and
// --log_cache_events come from ServerProcess).
std::vector<std::string> Flags(const std::string& data_dir) {
  return {"--backend=cpu",
          "--state_memory_bytes=67108864",
          "--checkpoint_memory_bytes=67108864",
          "--shutdown_grace_ms=10000",
          "--data_dir=" + data_dir};
}

TEST(SigtermTest, DrainsLosesNoAcknowledgedWriteAndReloadsModels) {
  const std::string tmp = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string data_dir = absl::StrCat(tmp, "/data-", getpid());
  WorkloadSpec spec;
  spec.model_id = "sigterm-gdn";
  spec.use_stream = false;
  spec.slots = 32;
  spec.checkpoints = 32;

  std::map<int64_t, uint64_t> completed;  // conversation -> digest
  std::vector<std::string> acked_models;
  std::map<std::string, int> errors;
  std::mutex mu;
  {
    ServerProcess server(Flags(data_dir), tmp + "/server1.log");
    ASSERT_GT(server.port(), 0) << server.log();
    auto admin = StateCacheClient::Connect(server.target()).value();
    ASSERT_TRUE(RegisterWorkloadModel(*admin, spec).ok());

    std::atomic<bool> signalled{false};
    std::vector<std::thread> threads;
    for (int c = 0; c < 4; ++c) {
      threads.emplace_back([&, c] {
        auto client = StateCacheClient::Connect(server.target()).value();
        for (int64_t conv = c * 1000;; ++conv) {
          WorkloadStats stats;
          ConversationResult r = RunConversation(*client, spec, conv, &stats);
          std::lock_guard<std::mutex> lock(mu);
          for (const auto& [code, n] : stats.errors_by_code) errors[code] += n;
          if (r.status.ok()) {
            completed[conv] = r.digest;
          } else {
            break;  // the server is going away
          }
        }
      });
    }
    threads.emplace_back([&] {
      auto client = StateCacheClient::Connect(server.target()).value();
      for (int i = 0;; ++i) {
        ModelRegistration r;
        r.model_id = absl::StrCat("reg-", i);
        r.geometry = spec.geometry;
        r.format = i % 2 ? "fp16" : "damp:8";
        r.slots = 1;
        r.checkpoints = 1;
        absl::Status s = client->RegisterModel(r).status();
        std::lock_guard<std::mutex> lock(mu);
        if (s.ok()) {
          acked_models.push_back(r.model_id);
        } else {
          ++errors[absl::StatusCodeToString(s.code())];
          break;
        }
        if (i > 400) break;
      }
    });
    absl::SleepFor(absl::Milliseconds(800));
    server.Signal(SIGTERM);
    signalled = true;
    for (auto& t : threads) t.join();
    EXPECT_EQ(server.Wait(absl::Seconds(30)), 0) << server.log();
    const std::string log = server.log();
    EXPECT_NE(log.find("signal SIGTERM"), std::string::npos) << log;
    EXPECT_NE(log.find("server_draining"), std::string::npos);
    EXPECT_NE(log.find("server_stopped"), std::string::npos);
  }
  ASSERT_GT(completed.size(), 0u);
  ASSERT_GT(acked_models.size(), 0u);
  for (const auto& [code, n] : errors) {
    EXPECT_EQ(code, "UNAVAILABLE") << " x" << n;
  }
  std::printf("completed conversations=%zu acknowledged registrations=%zu errors:",
              completed.size(), acked_models.size());
  for (const auto& [code, n] : errors) std::printf(" %s=%d", code.c_str(), n);
  std::printf("\n");

  ServerProcess restarted(Flags(data_dir), tmp + "/server2.log");
  ASSERT_GT(restarted.port(), 0) << restarted.log();
  auto client = StateCacheClient::Connect(restarted.target()).value();
  for (const std::string& id : acked_models) {
    EXPECT_TRUE(client->DescribeModel(id).ok()) << "acknowledged model lost: " << id;
  }
  auto workload_model = client->DescribeModel(spec.model_id);
  ASSERT_TRUE(workload_model.ok());
  EXPECT_EQ(workload_model->stats().slots_allocated(), 0);  // states are volatile
  WorkloadSpec replay = spec;
  replay.model_id = "sigterm-replay";
  ASSERT_TRUE(RegisterWorkloadModel(*client, replay).ok());
  int mismatches = 0;
  for (const auto& [conv, digest] : completed) {
    WorkloadStats stats;
    ConversationResult r = RunConversation(*client, replay, conv, &stats);
    ASSERT_TRUE(r.status.ok()) << r.status;
    mismatches += r.digest != digest;
  }
  EXPECT_EQ(mismatches, 0);
  restarted.Signal(SIGTERM);
  EXPECT_EQ(restarted.Wait(absl::Seconds(30)), 0);
}

}  // namespace
}  // namespace statecache
