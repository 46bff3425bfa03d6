#include "tests/load/mixed_load.h"

#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

constexpr uint64_t kDigestSeed = 14695981039346656037ull;

struct ClientResult {
  absl::Status status;
  uint64_t digest = kDigestSeed;
  std::string state;  // exported packed bytes of the client's slot
  int64_t updates = 0;
};

// Runs client `c`'s Updates on `slot` (over `stream` when set) and exports
// the slot; latencies into stats.
ClientResult RunClient(StateCacheClient& client, UpdateStream* stream, const WorkloadSpec& spec,
                       int steps, int64_t c, SlotHandle slot, WorkloadStats* stats) {
  ClientResult r;
  for (int step = 0; step < steps && r.status.ok(); ++step) {
    for (int layer = 0; layer < spec.geometry.layers; ++layer) {
      const OpInputs in = MakeOpInputs(spec, c, 0, step, layer, 1);
      const UpdateCall call = DecodeCallOf(in, layer, slot);
      const absl::Time start = absl::Now();
      absl::StatusOr<std::vector<float>> o =
          stream != nullptr ? stream->Update(spec.model_id, call) : client.Update(spec.model_id, call);
      if (stats != nullptr) {
        stats->latencies_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
        ++stats->requests;
      }
      if (!o.ok()) {
        r.status = o.status();
        if (stats != nullptr) stats->Error(r.status);
        break;
      }
      ++r.updates;
      r.digest = DigestFloats(r.digest, *o);
    }
  }
  if (!r.status.ok()) return r;
  absl::StatusOr<ExportedState> e = client.Export(spec.model_id, slot);
  if (!e.ok()) {
    r.status = e.status();
    if (stats != nullptr) stats->Error(r.status);
    return r;
  }
  r.state = std::move(e->packed);
  return r;
}

}  // namespace

WorkloadSpec MixedLoadOptions::DefaultSpec() {
  WorkloadSpec s;
  s.model_id = "mixed";
  s.geometry = ModelGeometry{Arch::kGdn, /*layers=*/2, /*h_qk=*/2, /*h_v=*/4, 128, 128};
  s.format = "damp:16";
  s.checkpoints = 1;
  return s;
}

bool MixedLoadReport::ok() const {
  return stats.errors_by_code.empty() && state_mismatches <= 0 && output_mismatches <= 0 &&
         slots_allocated_after == 0;
}

std::string MixedLoadReport::Summary() const {
  std::string errors;
  for (const auto& [code, n] : stats.errors_by_code) absl::StrAppend(&errors, " ", code, "=", n);
  if (errors.empty()) errors = " none";
  return absl::StrFormat(
      "clients=%d updates=%d seconds=%.3f throughput=%.1f updates/s p50=%.0fus p99=%.0fus "
      "max=%.0fus\nerrors_by_code:%s\nreplayed=%d state_mismatches=%d output_mismatches=%d "
      "slots_allocated_after=%d\nresult=%s\n",
      clients, updates, seconds, updates_per_second(), stats.PercentileUs(50),
      stats.PercentileUs(99), stats.PercentileUs(100), errors, replayed, state_mismatches,
      output_mismatches, slots_allocated_after, ok() ? "OK" : "FAILED");
}

absl::StatusOr<MixedLoadReport> RunMixedLoad(const MixedLoadOptions& o) {
  const int clients = o.unary_clients + o.stream_clients;
  if (o.unary_clients < 0 || o.stream_clients < 0 || clients < 1 || o.steps < 1) {
    return absl::InvalidArgumentError(
        "unary_clients / stream_clients: >= 0 and at least one client; steps >= 1");
  }
  WorkloadSpec spec = o.spec;
  spec.slots = clients;
  ASSIGN_OR_RETURN(auto admin, StateCacheClient::Connect(o.target, o.client));
  RETURN_IF_ERROR(admin->WaitForReady(absl::Seconds(10)));
  RETURN_IF_ERROR(RegisterWorkloadModel(*admin, spec));
  ASSIGN_OR_RETURN(std::vector<SlotHandle> slots, admin->AllocateSlots(spec.model_id, clients));

  MixedLoadReport report;
  report.clients = clients;
  std::vector<ClientResult> results(clients);
  std::vector<WorkloadStats> stats(clients);
  std::vector<std::unique_ptr<StateCacheClient>> conns(clients);
  std::vector<std::unique_ptr<UpdateStream>> streams(clients);
  // Channels and streams first (connection set-up is not the load).
  for (int c = 0; c < clients; ++c) {
    ASSIGN_OR_RETURN(conns[c], StateCacheClient::Connect(o.target, o.client));
    RETURN_IF_ERROR(conns[c]->WaitForReady(absl::Seconds(10)));
    RETURN_IF_ERROR(conns[c]->Geometry(spec.model_id).status());  // cached by the client
    if (c >= o.unary_clients) {
      ASSIGN_OR_RETURN(streams[c], conns[c]->OpenUpdateStream());
    }
  }
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      results[c] = RunClient(*conns[c], streams[c].get(), spec, o.steps, c, slots[c], &stats[c]);
    });
  }
  for (std::thread& t : threads) t.join();
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (int c = 0; c < clients; ++c) {
    if (streams[c] != nullptr) {
      absl::Status fin = streams[c]->Finish();
      if (!fin.ok()) stats[c].Error(fin);
    }
    report.stats.Add(stats[c]);
    report.updates += results[c].updates;
  }
  RETURN_IF_ERROR(admin->ReleaseSlots(spec.model_id, slots));

  if (o.replay) {
    // One client, one slot per replayed client (a fresh zero state), in order.
    WorkloadSpec serial = spec;
    serial.model_id = spec.model_id + "-replay";
    serial.slots = 1;
    RETURN_IF_ERROR(RegisterWorkloadModel(*admin, serial));
    report.replayed = 0;
    report.state_mismatches = 0;
    report.output_mismatches = 0;
    for (int c = 0; c < clients; ++c) {
      if (!results[c].status.ok()) continue;
      ASSIGN_OR_RETURN(std::vector<SlotHandle> one, admin->AllocateSlots(serial.model_id, 1));
      ClientResult r = RunClient(*admin, nullptr, serial, o.steps, c, one[0], nullptr);
      RETURN_IF_ERROR(r.status);
      RETURN_IF_ERROR(admin->ReleaseSlots(serial.model_id, one));
      ++report.replayed;
      if (r.state != results[c].state) ++report.state_mismatches;
      if (r.digest != results[c].digest) ++report.output_mismatches;
    }
    RETURN_IF_ERROR(admin->DropModel(serial.model_id));
  }
  ASSIGN_OR_RETURN(v1::GetStatsResponse after, admin->GetStats(spec.model_id));
  report.slots_allocated_after = after.models(0).stats().slots_allocated();
  RETURN_IF_ERROR(admin->DropModel(spec.model_id));
  return report;
}

}  // namespace statecache
