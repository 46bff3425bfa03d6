#include "server/dataplane/bench/multi_worker.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/cpp/dataplane_client.h"
#include "client/cpp/statecache_client.h"
#include "kernels/common/status_macros.h"
#include "kernels/cuda_ipc/stream_wait.h"
#include "server/dataplane/bench/bench_common.h"

namespace statecache {
namespace bench {
namespace {

// One worker's connection, buffers and submitter (see multi_worker.h).
struct Worker {
  std::unique_ptr<StateCacheClient> client;
  std::unique_ptr<DataPlaneSession> session;
  std::vector<SlotHandle> slots;
  std::vector<RefUpdateCall> calls;  // one per layer
  WorkerBuffer* out = nullptr;       // o of every layer
  std::unique_ptr<UpdateSubmitter> submitter;
  void* stream = nullptr;            // CUDA stream (nullptr: legacy default / CPU)
  WorkerSteps steps;
  absl::Status status;
};

int64_t OBytes(const ModelGeometry& g, int batch) {
  return int64_t{batch} * g.h_v * g.d_v * 4;
}

absl::StatusOr<std::unique_ptr<StateCacheClient>> Connect(const std::string& target) {
  ASSIGN_OR_RETURN(std::unique_ptr<StateCacheClient> c, StateCacheClient::Connect(target));
  RETURN_IF_ERROR(c->WaitForReady(absl::Seconds(60)));
  return c;
}

// Per-layer calls of `base`: layer l's o at l x o_bytes of the same buffer.
std::vector<RefUpdateCall> LayerCalls(const RefUpdateCall& base, int layers, int64_t o_bytes) {
  std::vector<RefUpdateCall> calls(layers, base);
  for (int l = 0; l < layers; ++l) {
    calls[l].layer = l;
    calls[l].o.offset = base.o.offset + l * o_bytes;
  }
  return calls;
}

absl::Status SetUp(const MultiWorkerOptions& o, int w, Worker* wk) {
  const ModelGeometry& g = o.geometry;
  ASSIGN_OR_RETURN(wk->client, Connect(o.target));
  ASSIGN_OR_RETURN(wk->slots, wk->client->AllocateSlots(o.model_id, o.batch));
  ASSIGN_OR_RETURN(wk->session, DataPlaneSession::Open(wk->client.get()));
  const Inputs in = MakeInputs(g, o.batch, o.seed + w);
  const int64_t o_bytes = OBytes(g, o.batch);
  ASSIGN_OR_RETURN(RefUpdateCall base,
                   StageInputs(wk->session.get(), in, wk->slots, g.layers * o_bytes, &wk->out));
  wk->calls = LayerCalls(base, g.layers, o_bytes);
  // A read after the writes: the inputs are in place before any stream uses them.
  float probe = 0;
  RETURN_IF_ERROR(base.q.buffer->Read(0, &probe, 4));
  ASSIGN_OR_RETURN(WorkerBuffer * done, wk->session->CreateBuffer(256));
  ASSIGN_OR_RETURN(wk->submitter, UpdateSubmitter::Open(wk->session.get(), o.model_id, {done, 0}));
  if (o.cuda_streams) {
    if (int e = stream_wait::CreateWorkerStream(&wk->stream); e != 0) {
      return absl::InternalError(absl::StrCat("cuda stream of worker ", w, ": error ", e));
    }
  }
  return absl::OkStatus();
}

absl::Status RunSteps(const MultiWorkerOptions& o, Worker* wk) {
  UpdateSubmitter& sub = *wk->submitter;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    const absl::Time start = absl::Now();
    for (const RefUpdateCall& c : wk->calls) {
      ASSIGN_OR_RETURN(uint64_t seq, sub.Submit(c, wk->stream));
      if (o.layer_waits) RETURN_IF_ERROR(sub.StreamWait(seq, wk->stream));
    }
    RETURN_IF_ERROR(sub.Wait(sub.last_seq()));
    RETURN_IF_ERROR(sub.TakeError());
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (s >= o.warmup) wk->steps.step_ms.push_back(ms);
    ++wk->steps.steps_run;
  }
  return sub.Finish();
}

absl::StatusOr<std::string> Exported(StateCacheClient& c, const std::string& model,
                                     SlotHandle slot) {
  ASSIGN_OR_RETURN(ExportedState e, c.Export(model, slot));
  return std::move(e.packed);
}

// The serial replay of worker `w` (see multi_worker.h), counted into *r.
absl::Status Replay(const MultiWorkerOptions& o, int w, Worker& wk, StateCacheClient& c,
                    DataPlaneSession& session, MultiWorkerReport* r) {
  const ModelGeometry& g = o.geometry;
  const int64_t o_bytes = OBytes(g, o.batch);
  ASSIGN_OR_RETURN(std::vector<SlotHandle> slots, c.AllocateSlots(o.model_id, o.batch));
  WorkerBuffer* out = nullptr;
  ASSIGN_OR_RETURN(RefUpdateCall base, StageInputs(&session, MakeInputs(g, o.batch, o.seed + w),
                                                   slots, g.layers * o_bytes, &out));
  const std::vector<RefUpdateCall> calls = LayerCalls(base, g.layers, o_bytes);
  for (int s = 0; s < wk.steps.steps_run; ++s) {
    for (const RefUpdateCall& call : calls) RETURN_IF_ERROR(session.Update(o.model_id, call));
  }
  const int64_t n = g.layers * o_bytes / 4;
  std::vector<float> mine(n), theirs(n);
  RETURN_IF_ERROR(wk.out->Read(0, mine.data(), 4 * n));
  RETURN_IF_ERROR(out->Read(0, theirs.data(), 4 * n));
  for (int64_t i = 0; i < n; ++i) {
    r->o_mismatches += std::memcmp(&mine[i], &theirs[i], 4) != 0;
  }
  r->o_compared += n;
  const int check = o.verify_slots < 0 ? o.batch : std::min(o.batch, o.verify_slots);
  for (int i = 0; i < check; ++i) {
    ASSIGN_OR_RETURN(std::string a, Exported(c, o.model_id, wk.slots[i]));
    ASSIGN_OR_RETURN(std::string b, Exported(c, o.model_id, slots[i]));
    r->slot_mismatches += a != b;
    ++r->slots_compared;
  }
  RETURN_IF_ERROR(session.ReleaseBuffer(const_cast<WorkerBuffer*>(base.q.buffer)));
  RETURN_IF_ERROR(session.ReleaseBuffer(out));
  return c.ReleaseSlots(o.model_id, slots);
}

}  // namespace

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * v.size()));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

absl::StatusOr<MultiWorkerReport> RunMultiWorker(const MultiWorkerOptions& o, int workers) {
  if (workers < 1) return absl::InvalidArgumentError("workers: must be >= 1");
  if (o.batch < 1) return absl::InvalidArgumentError("batch: must be >= 1");
  ASSIGN_OR_RETURN(std::unique_ptr<StateCacheClient> admin, Connect(o.target));
  ModelRegistration reg;
  reg.model_id = o.model_id;
  reg.geometry = o.geometry;
  reg.format = o.format;
  reg.slots = int64_t{workers + 1} * o.batch;
  reg.checkpoints = 0;
  (void)admin->DropModel(o.model_id, /*force=*/true);
  RETURN_IF_ERROR(admin->RegisterModel(reg).status());

  std::vector<Worker> ws(workers);
  for (int w = 0; w < workers; ++w) {
    absl::Status st = SetUp(o, w, &ws[w]);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("worker ", w, ": ", st.message()));
  }
  absl::Notification start;
  std::vector<std::thread> threads;
  for (Worker& wk : ws) {
    threads.emplace_back([&o, &wk, &start] {
      start.WaitForNotification();
      wk.status = RunSteps(o, &wk);
    });
  }
  const absl::Time t0 = absl::Now();
  start.Notify();
  for (std::thread& t : threads) t.join();
  MultiWorkerReport r;
  r.wall_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  for (int w = 0; w < workers; ++w) {
    const absl::Status& st = ws[w].status;
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("worker ", w, ": ", st.message()));
    r.workers.push_back(ws[w].steps);
  }
  if (o.verify) {
    ASSIGN_OR_RETURN(std::unique_ptr<DataPlaneSession> session,
                     DataPlaneSession::Open(admin.get()));
    for (int w = 0; w < workers; ++w) {
      absl::Status st = Replay(o, w, ws[w], *admin, *session, &r);
      if (!st.ok()) {
        return absl::Status(st.code(), absl::StrCat("replay of worker ", w, ": ", st.message()));
      }
    }
    if (workers >= 2) {
      ASSIGN_OR_RETURN(std::string a, Exported(*admin, o.model_id, ws[0].slots[0]));
      ASSIGN_OR_RETURN(std::string b, Exported(*admin, o.model_id, ws[1].slots[0]));
      r.workers_distinct = a != b;
    }
  }
  for (Worker& wk : ws) {
    if (int e = stream_wait::DestroyWorkerStream(wk.stream); e != 0) {
      return absl::InternalError(absl::StrCat("cuda stream: error ", e));
    }
    wk.submitter.reset();
    wk.session.reset();
  }
  RETURN_IF_ERROR(admin->DropModel(o.model_id, /*force=*/true));
  return r;
}

}  // namespace bench
}  // namespace statecache
