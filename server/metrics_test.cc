#include "server/metrics.h"

#include <ctime>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "google/protobuf/descriptor.h"
#include "proto/statecache/v1/statecache.pb.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class MetricsTest : public ::testing::Test {
 protected:
  std::vector<ModelStatsSnapshot> models_;
  std::shared_ptr<Metrics> metrics_ =
      std::make_shared<Metrics>([this] { return models_; });
};

ModelStatsSnapshot Snapshot() {
  ModelStatsSnapshot s;
  s.model_id = "m";
  s.format = "damp:16";
  s.registration = 1;
  s.slots.capacity = 10;
  s.slots.allocated = 3;
  s.slots.capacity_bytes = 1000;
  s.slots.used_bytes = TierBytes{40, 140, 18, 2};
  s.slots.fp32_equivalent_bytes = 600;
  s.checkpoints.capacity = 4;
  s.checkpoints.checkpoints = 2;
  s.checkpoints.lookups_hit = 5;
  s.checkpoints.lookups_miss = 1;
  s.checkpoints.lookup_tokens_hit = 500;
  s.checkpoints.lookup_tokens_miss = 20;
  s.checkpoints.evictions = 7;
  s.checkpoints.bytes_restored = 123;
  s.checkpoints.tiers[1].enabled = true;
  s.checkpoints.tiers[1].bytes = 4096;
  s.checkpoints.tiers[1].capacity_bytes = 8192;
  s.checkpoints.tiers[1].promotions = 3;
  s.checkpoints.tiers[2].hits = 2;
  s.checkpoints.tiers[2].dropped_corrupt = 1;
  s.checkpoints.tiers[0].demotions = 6;
  s.checkpoints.tiers[3].enabled = true;
  s.checkpoints.tiers[3].entries = 2;
  s.checkpoints.tiers[3].hits = 4;
  s.checkpoints.tiers[3].requests = 10;
  s.checkpoints.tiers[3].request_micros = 2500000;
  s.checkpoints.tiers[3].errors = 3;
  return s;
}

TEST_F(MetricsTest, EveryFamilyHasHelpAndPoolSeriesMapOneToOne) {
  models_ = {Snapshot()};
  models_[0].checkpoints.transcodes_to_cold = 11;
  models_[0].checkpoints.transcodes_from_cold = 5;
  const std::string text = metrics_->Scrape();
  // Every family printed has a non-empty HELP line.
  std::regex type_re("# TYPE (\\S+) ");
  int families = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), type_re);
       it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1];
    EXPECT_THAT(text, HasSubstr("# HELP " + name + " ")) << name;
    std::smatch help;
    EXPECT_TRUE(std::regex_search(text, help, std::regex("# HELP " + name + " .{10,}")))
        << name << " has a short help string";
    ++families;
  }
  // 46 families; statecache_rpcs_total and statecache_kernel_duration_seconds
  // have no series before the first observation, nor
  // statecache_device_memory_free_bytes without a device: not printed.
  EXPECT_EQ(families, 43);
  const std::string l = "{format=\"damp:16\",model=\"m\"";
  EXPECT_THAT(text, HasSubstr("statecache_slots_used" + l + "} 3"));
  EXPECT_THAT(text, HasSubstr("statecache_slots_capacity" + l + "} 10"));
  EXPECT_THAT(text, HasSubstr("statecache_state_bytes" + l + ",tier=\"hi_rows\"} 40"));
  EXPECT_THAT(text, HasSubstr("statecache_state_bytes" + l + ",tier=\"lo_codes\"} 140"));
  EXPECT_THAT(text, HasSubstr("statecache_state_bytes" + l + ",tier=\"metadata\"} 18"));
  EXPECT_THAT(text, HasSubstr("statecache_state_fp32_equivalent_bytes" + l + "} 600"));
  EXPECT_THAT(text, HasSubstr("statecache_prefix_lookups_total" + l + ",result=\"hit\"} 5"));
  EXPECT_THAT(text, HasSubstr("statecache_prefix_lookup_tokens_total" + l + ",result=\"miss\"} 20"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_evictions_total" + l + "} 7"));
  EXPECT_THAT(text, HasSubstr("statecache_restore_bytes_total" + l + "} 123"));
  EXPECT_THAT(text, HasSubstr("statecache_rpc_duration_seconds_count{method=\"Update\"} 0"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_bytes" + l + ",store_tier=\"host\"} 4096"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_capacity_bytes" + l +
                              ",store_tier=\"host\"} 8192"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_promotions_total" + l +
                              ",store_tier=\"host\"} 3"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_hits_total" + l +
                              ",store_tier=\"disk\"} 2"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_corrupt_total" + l +
                              ",store_tier=\"disk\"} 1"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_demotions_total" + l +
                              ",store_tier=\"device\"} 6"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_checkpoints" + l +
                              ",store_tier=\"disk\"} 0"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_transcodes_to_cold_total" + l + "} 11"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_transcodes_from_cold_total" + l + "} 5"));
  // The remote tier has its own label value; latency is exported in seconds.
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_checkpoints" + l +
                              ",store_tier=\"remote\"} 2"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_hits_total" + l +
                              ",store_tier=\"remote\"} 4"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_requests_total" + l +
                              ",store_tier=\"remote\"} 10"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_request_seconds_total" + l +
                              ",store_tier=\"remote\"} 2.5"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_errors_total" + l +
                              ",store_tier=\"remote\"} 3"));
  EXPECT_THAT(text, HasSubstr("statecache_checkpoint_tier_errors_total" + l +
                              ",store_tier=\"disk\"} 0"));
}

TEST_F(MetricsTest, CountersFollowCumulativeStatsAndRestartOnReregistration) {
  models_ = {Snapshot()};
  (void)metrics_->Scrape();
  models_[0].checkpoints.evictions = 9;
  const std::string l = "{format=\"damp:16\",model=\"m\"}";
  EXPECT_THAT(metrics_->Scrape(), HasSubstr("statecache_checkpoint_evictions_total" + l + " 9"));
  // Re-registered model: stats restart at zero and so do its series.
  models_[0].registration = 2;
  models_[0].checkpoints.evictions = 1;
  EXPECT_THAT(metrics_->Scrape(), HasSubstr("statecache_checkpoint_evictions_total" + l + " 1"));
  // Dropped model: series disappear.
  models_.clear();
  EXPECT_THAT(metrics_->Scrape(), Not(HasSubstr("model=\"m\"")));
}

TEST_F(MetricsTest, RpcBatchAndKernelObservations) {
  metrics_->ObserveRpc("Update", 0, 0.001);
  metrics_->ObserveRpc("Update", 3, 0.002);
  metrics_->ObserveUpdateBatch(32);
  metrics_->ObserveKernel("decode_update", 0.0005);
  const std::string text = metrics_->Scrape();
  EXPECT_THAT(text, HasSubstr("statecache_rpc_duration_seconds_count{method=\"Update\"} 2"));
  EXPECT_THAT(text, HasSubstr("statecache_rpcs_total{code=\"OK\",method=\"Update\"} 1"));
  EXPECT_THAT(text, HasSubstr("statecache_rpcs_total{code=\"INVALID_ARGUMENT\",method=\"Update\"} 1"));
  EXPECT_THAT(text, HasSubstr("statecache_update_batch_size_count 1"));
  EXPECT_THAT(text, HasSubstr("statecache_kernel_duration_seconds_count{op=\"decode_update\"} 1"));
}

// Every RPC of the proto's service has a latency series from the start, and
// nothing else does (issue 26 item 4: 8 of 23 RPCs had none).
TEST_F(MetricsTest, EveryRpcOfTheServiceHasALatencySeries) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "statecache.v1.StateCache");
  ASSERT_NE(service, nullptr);
  std::set<std::string> want;
  for (int i = 0; i < service->method_count(); ++i) want.insert(service->method(i)->name());
  ASSERT_GE(want.size(), 23u);
  for (const std::string& m : want) metrics_->ObserveRpc(m, 0, 0.001);
  const std::string text = metrics_->Scrape();
  std::set<std::string> scraped;
  std::regex count_re("statecache_rpc_duration_seconds_count\\{method=\"([A-Za-z]+)\"\\} 1\n");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), count_re);
       it != std::sregex_iterator(); ++it) {
    scraped.insert((*it)[1]);
  }
  EXPECT_EQ(scraped, want);
}

TEST(MetricsBuildTest, BuildInfoProcessAndDeviceSeries) {
  Metrics::Options o;
  o.version = "1.2.3";
  o.revision = "abc";
  o.backend = "cuda";
  o.device_free_bytes = []() -> absl::StatusOr<int64_t> { return int64_t{123456789}; };
  auto metrics = std::make_shared<Metrics>(o);
  const std::string text = metrics->Scrape();
  EXPECT_THAT(text, HasSubstr(
      "statecache_build_info{backend=\"cuda\",revision=\"abc\",version=\"1.2.3\"} 1"));
  EXPECT_THAT(text, HasSubstr("statecache_device_memory_free_bytes{backend=\"cuda\"} 123456789"));
  // At least two clock ticks (10 ms each) of CPU time, so that utime +
  // stime in /proc/self/stat cannot read 0 however fast the tests before ran.
  const std::clock_t spin_until = std::clock() + CLOCKS_PER_SEC / 50;
  volatile uint64_t spin = 0;
  while (std::clock() < spin_until) spin = spin + 1;
  const ProcessStats p = ReadProcessStats("/proc/self");
  EXPECT_GT(p.resident_bytes, 1 << 20);
  EXPECT_GE(p.open_fds, 3);
  EXPECT_GT(p.cpu_seconds, 0);
  const double now = static_cast<double>(absl::ToUnixSeconds(absl::Now()));
  EXPECT_GT(p.start_time_seconds, now - 3600);
  EXPECT_LE(p.start_time_seconds, now + 1);
  EXPECT_THAT(text, HasSubstr("# TYPE process_cpu_seconds_total counter"));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex("\nprocess_resident_memory_bytes (\\S+)\n")));
  EXPECT_GT(std::stod(m[1]), 1 << 20);
  ASSERT_TRUE(std::regex_search(text, m, std::regex("\nprocess_open_fds (\\S+)\n")));
  EXPECT_GE(std::stod(m[1]), 3);
}

TEST(MetricsBuildTest, CpuBackendHasNoDeviceSeries) {
  Metrics::Options o;
  o.backend = "cpu";
  auto metrics = std::make_shared<Metrics>(o);
  EXPECT_THAT(metrics->Scrape(), Not(HasSubstr("statecache_device_memory_free_bytes{")));
}

TEST_F(MetricsTest, ServesOverHttp) {
  ASSERT_TRUE(metrics_->Start("127.0.0.1:0").ok());
  EXPECT_GT(metrics_->port(), 0);
  EXPECT_EQ(metrics_->Start("127.0.0.1:0").code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace statecache
