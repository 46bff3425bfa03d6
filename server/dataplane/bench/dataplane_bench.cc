// dataplane_bench: per-decode-step latency of the four ways a worker reaches
// the fused update (issue 10), for one geometry (default Qwen3.6-35B-A3B: 30
// GDN layers, 16 key / 32 value heads, 128 x 128) at several batch sizes:
//
//   inproc    Backend::DecodeUpdate in this process on a private pool (floor)
//   attached  AttachedSession: the same call on statecached's pool, mapped
//             (CPU shared memory / CUDA IPC), under an attach lease
//   capi      attached mode through the C ABI of the Python binding
//             (client/python/native/dataplane_c_api.h: sc_attach,
//             sc_decode_update ordered after the legacy default stream)
//   inproc_unchecked  diagnostic, CUDA only: the decode kernels enqueued
//             without the binding's validation kernel and per-call host
//             sync (CudaEnqueueDecodeUnchecked), one sync per step; inproc
//             minus this is what the binding's validation + sync cost
//   attached_raw  diagnostic: Backend::DecodeUpdate called directly on the
//             mapped pool (no AttachedSession bookkeeping); attached minus
//             attached_raw is the per-call host cost of the lease checks,
//             attached_raw minus inproc that of the mapping itself
//   buffers   Update RPCs over a unix socket whose tensors are references into
//             registered buffers (CPU shm / CUDA IPC + events); o written there
//   stream    the same references submitted on one SubmitUpdates stream: per
//             layer Submit (records a ring event on the worker's stream, no
//             reply awaited) + StreamWait (CUDA: the worker's stream waits on
//             the device for the server's done word; CPU: the host polls it),
//             as a worker whose layer l+1 depends on layer l's o; the step
//             ends when the last reply is in. Also prints the server-side
//             means per submission: ring-event wait, backend call (kernel +
//             validation incl. its host sync), total
//   inline    Update RPCs over TCP loopback carrying the bytes
//
// One step = one update per layer. Every mode starts from zeroed slots and
// runs the same inputs, so with --verify the o of every mode's first step
// must equal the in-process one bit for bit (exit 1 otherwise).
//
// statecached runs in this process (--server=inproc, CPU only) or as child
// processes (--server=spawn --statecached=PATH; required for CUDA, where IPC
// handles cannot be opened by the exporting process).
//
//   dataplane_bench --backend=cpu --batches=1,32 --steps=5
//   dataplane_bench --backend=cuda --server=spawn --statecached=.device/statecached
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/dataplane_client.h"
#include "client/cpp/statecache_client.h"
#include "client/python/native/dataplane_c_api.h"
#include "kernels/backend/backend.h"
#include "kernels/common/status_macros.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"
#include "kernels/cuda_ipc/stream_wait.h"
#include "server/dataplane/bench/bench_common.h"
#include "server/server.h"

ABSL_FLAG(std::string, backend, "cpu", "cpu or cuda.");
ABSL_FLAG(std::string, geometry, "gdn:30:16:32:128:128", "arch:layers:h_qk:h_v:d_k:d_v");
ABSL_FLAG(std::string, format, "damp", "Storage format.");
ABSL_FLAG(std::string, batches, "1,32,256", "Batch sizes.");
ABSL_FLAG(std::string, modes,
          "inproc,inproc_unchecked,attached,attached_raw,capi,buffers,stream,inline",
          "Modes to run.");
ABSL_FLAG(int, steps, 5, "Timed decode steps per (mode, batch).");
ABSL_FLAG(int, warmup, 1, "Untimed decode steps first.");
ABSL_FLAG(std::string, server, "inproc", "inproc (CPU only) or spawn.");
ABSL_FLAG(std::string, statecached, "", "statecached binary for --server=spawn.");
ABSL_FLAG(bool, verify, true, "Check every mode's first-step o against inproc, bit for bit.");

namespace statecache {
namespace {

using bench::Inputs;
using bench::MakeInputs;
using bench::ServerHandle;
using bench::ServerSpec;
using bench::StageInputs;

// Inputs copied into one backend's memory.
struct DeviceInputs {
  std::unique_ptr<BackendBuffer> q, k, v, g, beta, o;
  DecodeInputs Decode() const {
    DecodeInputs d;
    d.q = q->data();
    d.k = k->data();
    d.v = v->data();
    d.g = reinterpret_cast<const float*>(g->data());
    d.beta = reinterpret_cast<const float*>(beta->data());
    d.o = reinterpret_cast<float*>(o->data());
    return d;
  }
};

absl::StatusOr<DeviceInputs> Upload(Backend& be, const Inputs& in) {
  DeviceInputs d;
  auto put = [&](const std::vector<float>& x, std::unique_ptr<BackendBuffer>* out) -> absl::Status {
    ASSIGN_OR_RETURN(*out, be.Allocate(std::max<int64_t>(4 * x.size(), 256)));
    return be.CopyIn((*out)->data(), x.data(), 4 * x.size());
  };
  RETURN_IF_ERROR(put(in.q, &d.q));
  RETURN_IF_ERROR(put(in.k, &d.k));
  RETURN_IF_ERROR(put(in.v, &d.v));
  RETURN_IF_ERROR(put(in.g, &d.g));
  RETURN_IF_ERROR(put(in.beta, &d.beta));
  ASSIGN_OR_RETURN(d.o, be.Allocate(std::max<int64_t>(4 * in.o_count, 256)));
  return d;
}

struct Timing {
  std::vector<double> step_ms;
  std::vector<float> first_o;  // o of the last layer of the first step
  std::string extra;           // appended to the RESULT line
};

// Runs warmup + steps decode steps of `layer_fn(layer)` (then `step_end`,
// if given, inside the timed step); `read_o` fetches o.
absl::StatusOr<Timing> TimeSteps(int layers, const std::function<absl::Status(int)>& layer_fn,
                                 const std::function<absl::StatusOr<std::vector<float>>()>& read_o,
                                 const std::function<absl::Status()>& step_end = nullptr) {
  Timing t;
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  for (int s = 0; s < warmup + steps; ++s) {
    const absl::Time start = absl::Now();
    for (int l = 0; l < layers; ++l) RETURN_IF_ERROR(layer_fn(l));
    if (step_end) RETURN_IF_ERROR(step_end());
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (s == 0) {
      ASSIGN_OR_RETURN(t.first_o, read_o());
    }
    if (s >= warmup) t.step_ms.push_back(ms);
  }
  return t;
}

// A statecached on `listen`: in this process or a child (--server).
absl::StatusOr<std::unique_ptr<ServerHandle>> StartServer(const std::string& listen,
                                                          int64_t state_bytes) {
  ServerSpec spec;
  spec.listen = listen;
  spec.backend = absl::GetFlag(FLAGS_backend);
  spec.spawn = absl::GetFlag(FLAGS_server) != "inproc";
  spec.statecached = absl::GetFlag(FLAGS_statecached);
  spec.state_bytes = state_bytes;
  return ServerHandle::Start(spec);
}

absl::StatusOr<std::unique_ptr<StateCacheClient>> Connect(const ServerHandle& s,
                                                          const ModelGeometry& geo, int b) {
  ASSIGN_OR_RETURN(auto c, StateCacheClient::Connect(s.target()));
  RETURN_IF_ERROR(c->WaitForReady(absl::Seconds(60)));
  ModelRegistration r;
  r.model_id = "bench";
  r.geometry = geo;
  r.format = absl::GetFlag(FLAGS_format);
  r.slots = b;
  r.checkpoints = 0;
  (void)c->DropModel("bench", true);
  RETURN_IF_ERROR(c->RegisterModel(r).status());
  return c;
}

// unchecked: CUDA only, the decode kernels enqueued without the binding's
// validation and its per-call host synchronization, one sync per step.
absl::StatusOr<Timing> RunInproc(const ModelGeometry& geo, const StateLayout& layout,
                                 const Inputs& in, int b, bool unchecked = false) {
  ASSIGN_OR_RETURN(auto be, CreateBackend(absl::GetFlag(FLAGS_backend)));
  ASSIGN_OR_RETURN(auto prepared, be->Prepare(layout));
  ASSIGN_OR_RETURN(auto arena, be->Allocate(b * layout.slot_bytes()));
  PoolView view{arena->data(), b, geo.layers, geo.h_v, layout.head_layout().head_bytes};
  std::vector<int32_t> idx(b);
  for (int i = 0; i < b; ++i) idx[i] = i;
  ASSIGN_OR_RETURN(auto slots, be->Allocate(std::max(4 * b, 256)));
  RETURN_IF_ERROR(be->CopyIn(slots->data(), idx.data(), 4 * b));
  ASSIGN_OR_RETURN(DeviceInputs d, Upload(*be, in));
  DecodeInputs di = d.Decode();
  di.batch = b;
  di.slots = reinterpret_cast<const int32_t*>(slots->data());
  if (unchecked) {
    return TimeSteps(
        geo.layers,
        [&](int l) { return CudaEnqueueDecodeUnchecked(*be, *prepared, view, l, di); },
        [&]() -> absl::StatusOr<std::vector<float>> {
          std::vector<float> o(in.o_count);
          RETURN_IF_ERROR(be->CopyOut(o.data(), di.o, 4 * in.o_count));
          return o;
        },
        [&]() { return CudaSynchronize(*be); });
  }
  return TimeSteps(
      geo.layers, [&](int l) { return be->DecodeUpdate(*prepared, view, l, di); },
      [&]() -> absl::StatusOr<std::vector<float>> {
        std::vector<float> o(in.o_count);
        RETURN_IF_ERROR(be->CopyOut(o.data(), di.o, 4 * in.o_count));
        return o;
      });
}

absl::StatusOr<Timing> RunAttached(const ServerHandle& s, const ModelGeometry& geo,
                                   const Inputs& in, int b) {
  ASSIGN_OR_RETURN(auto client, Connect(s, geo, b));
  ASSIGN_OR_RETURN(std::vector<SlotHandle> h, client->AllocateSlots("bench", b));
  ASSIGN_OR_RETURN(auto session, DataPlaneSession::Open(client.get()));
  ASSIGN_OR_RETURN(auto attached, AttachedSession::Attach(session.get(), "bench", h));
  ASSIGN_OR_RETURN(DeviceInputs d, Upload(attached->backend(), in));
  const DecodeInputs di = d.Decode();
  auto t = TimeSteps(
      geo.layers, [&](int l) { return attached->DecodeUpdate(l, h, di); },
      [&]() -> absl::StatusOr<std::vector<float>> {
        std::vector<float> o(in.o_count);
        RETURN_IF_ERROR(attached->backend().CopyOut(o.data(), di.o, 4 * in.o_count));
        return o;
      });
  RETURN_IF_ERROR(attached->Detach());
  return t;
}

absl::StatusOr<Timing> RunAttachedRaw(const ServerHandle& s, const ModelGeometry& geo,
                                      const Inputs& in, int b) {
  ASSIGN_OR_RETURN(auto client, Connect(s, geo, b));
  ASSIGN_OR_RETURN(std::vector<SlotHandle> h, client->AllocateSlots("bench", b));
  ASSIGN_OR_RETURN(auto session, DataPlaneSession::Open(client.get()));
  ASSIGN_OR_RETURN(auto attached, AttachedSession::Attach(session.get(), "bench", h));
  Backend& be = attached->backend();
  std::vector<int32_t> idx(b);
  for (int i = 0; i < b; ++i) idx[i] = attached->IndexOf(h[i]);
  ASSIGN_OR_RETURN(auto slots, be.Allocate(std::max(4 * b, 256)));
  RETURN_IF_ERROR(be.CopyIn(slots->data(), idx.data(), 4 * b));
  ASSIGN_OR_RETURN(DeviceInputs d, Upload(be, in));
  DecodeInputs di = d.Decode();
  di.batch = b;
  di.slots = reinterpret_cast<const int32_t*>(slots->data());
  auto t = TimeSteps(
      geo.layers,
      [&](int l) { return be.DecodeUpdate(attached->prepared(), attached->pool(), l, di); },
      [&]() -> absl::StatusOr<std::vector<float>> {
        std::vector<float> o(in.o_count);
        RETURN_IF_ERROR(be.CopyOut(o.data(), di.o, 4 * in.o_count));
        return o;
      });
  RETURN_IF_ERROR(attached->Detach());
  return t;
}

absl::StatusOr<Timing> RunCapi(const ServerHandle& s, const ModelGeometry& geo,
                               const Inputs& in, int b) {
  ASSIGN_OR_RETURN(auto client, Connect(s, geo, b));
  ASSIGN_OR_RETURN(std::vector<SlotHandle> h, client->AllocateSlots("bench", b));
  std::vector<uint64_t> ids;
  std::vector<uint32_t> gens;
  for (const SlotHandle& x : h) {
    ids.push_back(x.id);
    gens.push_back(x.generation);
  }
  char err[1024] = {0};
  ScAttached* a = nullptr;
  if (int rc = sc_attach(s.target().c_str(), "", "bench", ids.data(), gens.data(), b, 0, &a, err,
                         sizeof(err));
      rc != 0) {
    return absl::Status(static_cast<absl::StatusCode>(rc), absl::StrCat("sc_attach: ", err));
  }
  std::unique_ptr<ScAttached, void (*)(ScAttached*)> owned(a, sc_close);
  // Inputs in this process's memory of the backend's kind (as a PyTorch
  // worker's tensors would be).
  ASSIGN_OR_RETURN(auto be, CreateBackend(absl::GetFlag(FLAGS_backend)));
  ASSIGN_OR_RETURN(DeviceInputs d, Upload(*be, in));
  const DecodeInputs di = d.Decode();
  return TimeSteps(
      geo.layers,
      [&](int l) -> absl::Status {
        if (int rc = sc_decode_update(a, l, ids.data(), gens.data(), b, SC_DTYPE_FP32, di.q, di.k,
                                      di.v, di.g, di.beta, di.o, 0, err, sizeof(err));
            rc != 0) {
          return absl::Status(static_cast<absl::StatusCode>(rc),
                              absl::StrCat("sc_decode_update: ", err));
        }
        return absl::OkStatus();
      },
      [&]() -> absl::StatusOr<std::vector<float>> {
        std::vector<float> o(in.o_count);
        RETURN_IF_ERROR(be->CopyOut(o.data(), di.o, 4 * in.o_count));
        return o;
      });
}

absl::StatusOr<Timing> RunBuffers(const ServerHandle& s, const ModelGeometry& geo,
                                  const Inputs& in, int b) {
  ASSIGN_OR_RETURN(auto client, Connect(s, geo, b));
  ASSIGN_OR_RETURN(std::vector<SlotHandle> h, client->AllocateSlots("bench", b));
  ASSIGN_OR_RETURN(auto session, DataPlaneSession::Open(client.get()));
  WorkerBuffer* out = nullptr;
  ASSIGN_OR_RETURN(RefUpdateCall c, StageInputs(session.get(), in, h, 4 * in.o_count, &out));
  std::vector<v1::UpdateRequest> reqs(geo.layers);
  for (int l = 0; l < geo.layers; ++l) {
    c.layer = l;
    ASSIGN_OR_RETURN(reqs[l], session->BuildUpdate("bench", c));
  }
  return TimeSteps(
      geo.layers,
      [&](int l) {
        v1::UpdateResponse resp;
        grpc::ClientContext ctx;
        client->PrepareContext(&ctx);
        return FromGrpcStatus(client->stub().Update(&ctx, reqs[l], &resp));
      },
      [&]() -> absl::StatusOr<std::vector<float>> {
        std::vector<float> o(in.o_count);
        RETURN_IF_ERROR(out->Read(0, o.data(), 4 * in.o_count));
        return o;
      });
}

absl::StatusOr<Timing> RunStream(const ServerHandle& s, const ModelGeometry& geo,
                                 const Inputs& in, int b) {
  ASSIGN_OR_RETURN(auto client, Connect(s, geo, b));
  ASSIGN_OR_RETURN(std::vector<SlotHandle> h, client->AllocateSlots("bench", b));
  ASSIGN_OR_RETURN(auto session, DataPlaneSession::Open(client.get()));
  WorkerBuffer* out = nullptr;
  ASSIGN_OR_RETURN(RefUpdateCall staged, StageInputs(session.get(), in, h, 4 * in.o_count, &out));
  ASSIGN_OR_RETURN(WorkerBuffer * done, session->CreateBuffer(256));
  ASSIGN_OR_RETURN(auto sub, UpdateSubmitter::Open(session.get(), "bench", {done, 0}));
  std::vector<RefUpdateCall> calls(geo.layers, staged);
  for (int l = 0; l < geo.layers; ++l) calls[l].layer = l;
  // The worker's stream: the legacy default stream (nullptr), where
  // WorkerBuffer::Write put the inputs.
  auto t = TimeSteps(
      geo.layers,
      [&](int l) -> absl::Status {
        ASSIGN_OR_RETURN(uint64_t seq, sub->Submit(calls[l], nullptr));
        return sub->StreamWait(seq, nullptr);
      },
      [&]() -> absl::StatusOr<std::vector<float>> {
        std::vector<float> o(in.o_count);
        RETURN_IF_ERROR(out->Read(0, o.data(), 4 * in.o_count));
        return o;
      },
      [&]() -> absl::Status {
        // The step ends with its last reply; any submission's error fails it.
        RETURN_IF_ERROR(sub->Wait(sub->last_seq()));
        return sub->TakeError();
      });
  RETURN_IF_ERROR(t.status());
  RETURN_IF_ERROR(sub->Finish());
  const UpdateSubmitter::ServerTimes st = sub->server_times();
  // CUDA: the server runs submissions on a DecodeQueue (backend_call_us =
  // its host enqueue time, server_us = read to completion, event_wait_us =
  // 0 behind the ring gate); server_wait says how its queue waits for the
  // ring events (STATECACHE_SUBMIT_DEVICE_WAIT, inherited by a spawned
  // statecached).
  const char* server_wait = std::getenv("STATECACHE_SUBMIT_DEVICE_WAIT");
  t->extra = absl::StrFormat(" server_us=%.1f backend_call_us=%.1f event_wait_us=%.1f%s",
                             st.server_us, st.kernel_us, st.wait_us,
                             absl::GetFlag(FLAGS_backend) == "cuda"
                                 ? absl::StrCat(" device_wait=\"", stream_wait::Mechanism(),
                                                "\" server_wait=\"",
                                                server_wait != nullptr &&
                                                        std::string(server_wait) == "event"
                                                    ? "event"
                                                    : "gate",
                                                "\"")
                                 : "");
  return t;
}

absl::StatusOr<Timing> RunInline(const ServerHandle& s, const ModelGeometry& geo,
                                 const Inputs& in, int b) {
  ASSIGN_OR_RETURN(auto client, Connect(s, geo, b));
  ASSIGN_OR_RETURN(std::vector<SlotHandle> h, client->AllocateSlots("bench", b));
  UpdateCall c;
  c.slots = h;
  c.q = HostTensor::Fp32(in.q);
  c.k = HostTensor::Fp32(in.k);
  c.v = HostTensor::Fp32(in.v);
  c.g = in.g;
  c.beta = in.beta;
  std::vector<float> last;
  return TimeSteps(
      geo.layers,
      [&](int l) -> absl::Status {
        c.layer = l;
        ASSIGN_OR_RETURN(last, client->Update("bench", c));
        return absl::OkStatus();
      },
      [&]() -> absl::StatusOr<std::vector<float>> { return last; });
}

int Main() {
  absl::StatusOr<ModelGeometry> geo = ParseGeometry(absl::GetFlag(FLAGS_geometry), "geometry");
  if (!geo.ok()) {
    std::fprintf(stderr, "%s\n", geo.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<FormatSpec> spec = ParseFormatSpec(absl::GetFlag(FLAGS_format));
  if (!spec.ok()) return 2;
  absl::StatusOr<StateLayout> layout = StateLayout::Identity(*geo, *spec);
  if (!layout.ok()) return 2;
  std::vector<int> batches;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    int b;
    if (absl::SimpleAtoi(s, &b)) batches.push_back(b);
  }
  std::vector<std::string> modes = absl::StrSplit(absl::GetFlag(FLAGS_modes), ',');
  const std::string tag = absl::StrCat(getpid());
  const int port = 40000 + getpid() % 20000;
  std::printf("# dataplane_bench backend=%s server=%s geometry=%s format=%s steps=%d\n",
              absl::GetFlag(FLAGS_backend).c_str(), absl::GetFlag(FLAGS_server).c_str(),
              geo->DebugString().c_str(), FormatSpecName(*spec).c_str(),
              absl::GetFlag(FLAGS_steps));
  int failures = 0;
  std::string table =
      "| B | mode | ms / step (mean) | median | min | vs inproc (mean) | vs inproc (median) | "
      "o bit-identical |\n|---|---|---|---|---|---|---|---|\n";
  for (int b : batches) {
    const Inputs in = MakeInputs(*geo, b, 1234 + b);
    const int64_t state_bytes = int64_t{b} * layout->slot_bytes() + (1 << 20);
    std::unique_ptr<ServerHandle> unix_server, tcp_server;
    // The unix-socket server starts before every mode, inproc included, so
    // that all modes run with statecached's process (and, on CUDA, its
    // context) alive on the device.
    if (std::any_of(modes.begin(), modes.end(), [](const std::string& m) {
          return m == "attached" || m == "attached_raw" || m == "capi" || m == "buffers" ||
                 m == "stream";
        })) {
      auto s = StartServer(absl::StrCat("unix:/tmp/sc_dp_bench_", tag, ".sock"),
                                   state_bytes);
      if (!s.ok()) { std::fprintf(stderr, "%s\n", s.status().ToString().c_str()); return 1; }
      unix_server = *std::move(s);
      auto c = StateCacheClient::Connect(unix_server->target());
      if (!c.ok() || !(*c)->WaitForReady(absl::Seconds(60)).ok()) {
        std::fprintf(stderr, "statecached did not come up\n");
        return 1;
      }
    }
    std::vector<float> reference;
    double floor_ms = 0, floor_median_ms = 0;
    for (const std::string& mode : modes) {
      absl::StatusOr<Timing> t = absl::UnknownError("unknown mode");
      if (mode == "inproc") {
        t = RunInproc(*geo, *layout, in, b);
      } else if (mode == "inproc_unchecked") {
        if (absl::GetFlag(FLAGS_backend) != "cuda") continue;  // a CUDA hook
        t = RunInproc(*geo, *layout, in, b, /*unchecked=*/true);
      } else if (mode == "attached" || mode == "attached_raw" || mode == "capi" ||
                 mode == "buffers" || mode == "stream") {
        if (unix_server == nullptr) {
          auto s = StartServer(absl::StrCat("unix:/tmp/sc_dp_bench_", tag, ".sock"),
                                       state_bytes);
          if (!s.ok()) { std::fprintf(stderr, "%s\n", s.status().ToString().c_str()); return 1; }
          unix_server = *std::move(s);
        }
        t = mode == "attached"       ? RunAttached(*unix_server, *geo, in, b)
            : mode == "attached_raw" ? RunAttachedRaw(*unix_server, *geo, in, b)
            : mode == "capi"         ? RunCapi(*unix_server, *geo, in, b)
            : mode == "buffers"      ? RunBuffers(*unix_server, *geo, in, b)
                                     : RunStream(*unix_server, *geo, in, b);
      } else if (mode == "inline") {
        if (tcp_server == nullptr) {
          auto s = StartServer(absl::StrCat("127.0.0.1:", port), state_bytes);
          if (!s.ok()) { std::fprintf(stderr, "%s\n", s.status().ToString().c_str()); return 1; }
          tcp_server = *std::move(s);
        }
        t = RunInline(*tcp_server, *geo, in, b);
      }
      if (!t.ok()) {
        std::printf("RESULT mode=%s B=%d error=\"%s\"\n", mode.c_str(), b,
                    t.status().ToString().c_str());
        ++failures;
        continue;
      }
      double sum = 0, mn = 1e30;
      for (double ms : t->step_ms) {
        sum += ms;
        mn = std::min(mn, ms);
      }
      const double mean = t->step_ms.empty() ? 0 : sum / t->step_ms.size();
      std::vector<double> sorted = t->step_ms;
      std::sort(sorted.begin(), sorted.end());
      const double median = sorted.empty() ? 0 : sorted[sorted.size() / 2];
      std::string same = "-";
      if (mode == "inproc") {
        reference = t->first_o;
        floor_ms = mean;
        floor_median_ms = median;
      } else if (absl::GetFlag(FLAGS_verify) && !reference.empty()) {
        const bool eq = t->first_o.size() == reference.size() &&
                        std::memcmp(t->first_o.data(), reference.data(),
                                    4 * reference.size()) == 0;
        same = eq ? "yes" : "NO";
        if (!eq) ++failures;
      }
      std::printf("RESULT mode=%s B=%d step_ms_mean=%.3f step_ms_median=%.3f step_ms_min=%.3f "
                  "per_layer_us=%.1f identical=%s%s\n",
                  mode.c_str(), b, mean, median, mn, 1000 * mean / geo->layers, same.c_str(),
                  t->extra.c_str());
      std::fflush(stdout);
      auto versus = [&](double x, double floor) {
        return floor > 0 && mode != "inproc"
                   ? absl::StrFormat("%+.1f%% (%+.3f ms)", 100 * (x / floor - 1), x - floor)
                   : std::string("-");
      };
      absl::StrAppend(&table, absl::StrFormat("| %d | %s | %.3f | %.3f | %.3f | %s | %s | %s |\n",
                                              b, mode, mean, median, mn, versus(mean, floor_ms),
                                              versus(median, floor_median_ms), same));
    }
  }
  std::printf("\n%s", table.c_str());
  if (failures > 0) std::printf("FAILURES: %d\n", failures);
  return failures > 0 ? 1 : 0;
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return statecache::Main();
}
