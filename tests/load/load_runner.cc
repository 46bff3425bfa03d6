#include "tests/load/load_runner.h"

#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"

namespace statecache {

bool LoadReport::ok() const {
  return conversations_failed == 0 && stats.errors_by_code.empty() && replay_mismatches <= 0 &&
         slots_allocated_after == 0 && invariants.ok();
}

std::string LoadReport::Summary() const {
  std::string errors;
  for (const auto& [code, n] : stats.errors_by_code) absl::StrAppend(&errors, " ", code, "=", n);
  if (errors.empty()) errors = " none";
  return absl::StrFormat(
      "clients=%d conversations=%d failed=%d requests=%d seconds=%.3f throughput=%.1f req/s "
      "p50=%.0fus p99=%.0fus max=%.0fus acknowledged_updates=%d restores=%d recomputes=%d\n"
      "errors_by_code:%s\nreplayed=%d replay_mismatches=%d slots_allocated_after=%d invariants=%s\n"
      "result=%s\n",
      clients, conversations, conversations_failed, stats.requests, seconds, requests_per_second(),
      stats.PercentileUs(50), stats.PercentileUs(99), stats.PercentileUs(100),
      stats.acknowledged_updates, stats.restores, stats.recomputes, errors, replayed,
      replay_mismatches, slots_allocated_after, invariants.ToString(), ok() ? "OK" : "FAILED");
}

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options) {
  if (options.clients < 1 || options.conversations_per_client < 1) {
    return absl::InvalidArgumentError("clients / conversations_per_client: must be >= 1");
  }
  ASSIGN_OR_RETURN(auto admin, StateCacheClient::Connect(options.target, options.client));
  RETURN_IF_ERROR(admin->WaitForReady(absl::Seconds(10)));
  RETURN_IF_ERROR(RegisterWorkloadModel(*admin, options.spec));

  LoadReport report;
  report.clients = options.clients;
  report.conversations = int64_t{options.clients} * options.conversations_per_client;
  report.digests.assign(report.conversations, 0);
  std::vector<char> completed(report.conversations, 0);
  std::vector<WorkloadStats> stats(options.clients);
  std::vector<int64_t> failed(options.clients, 0);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int c = 0; c < options.clients; ++c) {
    threads.emplace_back([&, c] {
      absl::StatusOr<std::unique_ptr<StateCacheClient>> client =
          StateCacheClient::Connect(options.target, options.client);
      if (!client.ok()) {
        stats[c].Error(client.status());
        failed[c] = options.conversations_per_client;
        return;
      }
      for (int i = 0; i < options.conversations_per_client; ++i) {
        const int64_t conv = int64_t{c} * options.conversations_per_client + i;
        ConversationResult r = RunConversation(**client, options.spec, conv, &stats[c]);
        report.digests[conv] = r.digest;
        completed[conv] = r.status.ok();
        if (!r.status.ok()) ++failed[c];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (int c = 0; c < options.clients; ++c) {
    report.stats.Add(stats[c]);
    report.conversations_failed += failed[c];
  }

  if (options.replay) {
    // Serial replay on a fresh model of the same shape: one client, one
    // conversation at a time.
    WorkloadSpec serial = options.spec;
    serial.model_id = options.spec.model_id + "-replay";
    RETURN_IF_ERROR(RegisterWorkloadModel(*admin, serial));
    report.replay_mismatches = 0;
    WorkloadStats replay_stats;
    report.replayed = 0;
    for (int64_t conv = 0; conv < report.conversations; ++conv) {
      if (!completed[conv]) continue;  // only acknowledged, complete conversations
      ++report.replayed;
      ConversationResult r = RunConversation(*admin, serial, conv, &replay_stats);
      if (!r.status.ok()) return r.status;
      if (r.digest != report.digests[conv]) ++report.replay_mismatches;
    }
    RETURN_IF_ERROR(admin->DropModel(serial.model_id));
  }
  ASSIGN_OR_RETURN(v1::GetStatsResponse after, admin->GetStats(options.spec.model_id));
  report.slots_allocated_after = after.models(0).stats().slots_allocated();
  if (options.check_invariants) report.invariants = options.check_invariants();
  return report;
}

}  // namespace statecache
