// update_echo_bench (issue 33; tagged "benchmark"): unary Update latency at
// one client beside a bare gRPC echo of the same request and response bytes,
// in one run, at several request sizes.
//
// The echo is a second server in the same process built from the same gRPC
// and protobuf: it implements statecache.v1.StateCache/Update only, parses
// the request and answers with a canned response of the real one's bytes (no
// slot lookup, no validation, no backend). The difference is what statecache
// itself adds per call. For each size the request holds B slots of the
// workload geometry (tests/load/mixed_load.h: ~4.1 KiB in, 2 KiB out per
// slot), B chosen so the request is at least the size; the same serialized
// request goes to both servers, alternating blocks of calls so drift in the
// machine's load hits both.
//
//   bazel build //tests/load:update_echo_bench
//   bazel-bin/tests/load/update_echo_bench --backend=cpu --sizes=4096,65536,8388608
//
// Two lines per size:
//   ECHO size=... batch=... request_bytes=... response_bytes=... calls=...
//     update_p50_us=... update_p99_us=... echo_p50_us=... echo_p99_us=... ratio_p50=...
//   PHASES size=... calls=... checks_us=... slots_us=... stage_us=... backend_us=...
//     copy_out_us=... handler_us=... parse_us=... serialize_us=...
// PHASES: mean server time per timed Update by phase (server/core/
// update_phases.h: checks = shapes and values on the host, slots = slot
// acquisition, stage = packing inputs into the host staging block, backend =
// copy in + validation + kernel + copy out + wait (CPU: kernel in place),
// copy_out = o into the response, handler = all of ops::Update), and the
// protobuf parse of the request / serialization of the response measured
// here on the same messages (gRPC does both for the Update and the echo
// alike). update_p50 - handler is the RPC itself (transport, gRPC, protobuf).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/statecache_client.h"
#include "grpcpp/grpcpp.h"
#include "proto/statecache/v1/statecache.grpc.pb.h"
#include "server/core/log.h"
#include "server/core/update_phases.h"
#include "server/loopback.h"
#include "server/server.h"
#include "tests/load/mixed_load.h"
#include "tests/load/workload.h"

ABSL_FLAG(std::string, backend, "cpu", "Backend of the statecached under test: cpu, cuda, auto.");
ABSL_FLAG(std::string, sizes, "4096,65536,8388608", "Request sizes in bytes (comma-separated).");
ABSL_FLAG(double, seconds_per_size, 4, "Measurement time per size and server (about).");
ABSL_FLAG(int, min_calls, 20, "At least this many calls per size and server.");
ABSL_FLAG(bool, coalesce_updates, false, "Server under test: --coalesce_updates.");

namespace statecache {
namespace {

class EchoService final : public v1::StateCache::Service {
 public:
  void set_response(v1::UpdateResponse r) { response_ = std::move(r); }
  grpc::Status Update(grpc::ServerContext*, const v1::UpdateRequest* req,
                      v1::UpdateResponse* resp) override {
    *resp = response_;
    resp->set_sequence(req->sequence());
    return grpc::Status::OK;
  }

 private:
  v1::UpdateResponse response_;  // set between measurements, read by handlers
};

void SetTensor(v1::Tensor* t, std::vector<int64_t> shape, const std::vector<float>& v) {
  t->set_dtype(v1::DTYPE_FP32);
  for (int64_t d : shape) t->add_shape(d);
  t->set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
}

// The Update of `slots` (layer 0), inputs of the workload.
v1::UpdateRequest MakeRequest(const WorkloadSpec& spec, const std::vector<SlotHandle>& slots) {
  const ModelGeometry& g = spec.geometry;
  const int64_t b = static_cast<int64_t>(slots.size());
  std::vector<float> q, k, v, gates, beta;
  for (int64_t i = 0; i < b; ++i) {
    OpInputs in = MakeOpInputs(spec, i, 0, 0, 0, 1);
    q.insert(q.end(), in.q.begin(), in.q.end());
    k.insert(k.end(), in.k.begin(), in.k.end());
    v.insert(v.end(), in.v.begin(), in.v.end());
    gates.insert(gates.end(), in.g.begin(), in.g.end());
    beta.insert(beta.end(), in.beta.begin(), in.beta.end());
  }
  v1::UpdateRequest req;
  req.set_model_id(spec.model_id);
  req.set_layer(0);
  for (const SlotHandle& h : slots) {
    v1::SlotHandle* p = req.add_slots();
    p->set_id(h.id);
    p->set_generation(h.generation);
  }
  SetTensor(req.mutable_q(), {b, g.h_qk, g.d_k}, q);
  SetTensor(req.mutable_k(), {b, g.h_qk, g.d_k}, k);
  SetTensor(req.mutable_v(), {b, g.h_v, g.d_v}, v);
  SetTensor(req.mutable_g(), {b, g.h_v}, gates);
  SetTensor(req.mutable_beta(), {b, g.h_v}, beta);
  return req;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * v.size()));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

// One unary call; its latency in us, or -1 on error (printed).
double TimedCall(v1::StateCache::Stub& stub, const v1::UpdateRequest& req,
                 v1::UpdateResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  const absl::Time start = absl::Now();
  grpc::Status s = stub.Update(&ctx, req, resp);
  const double us = absl::ToDoubleMicroseconds(absl::Now() - start);
  if (!s.ok()) {
    std::fprintf(stderr, "update_echo_bench: Update: %s\n", s.error_message().c_str());
    return -1;
  }
  return us;
}

// The PHASES line of one size (see the top of this file).
void PrintPhases(int64_t size, const UpdatePhases& phases, const v1::UpdateRequest& req,
                 const v1::UpdateResponse& resp) {
  const std::string wire = req.SerializeAsString();
  constexpr int kReps = 5;
  absl::Time start = absl::Now();
  for (int i = 0; i < kReps; ++i) {
    v1::UpdateRequest parsed;
    if (!parsed.ParseFromString(wire)) std::fprintf(stderr, "update_echo_bench: parse failed\n");
  }
  const double parse_us = absl::ToDoubleMicroseconds(absl::Now() - start) / kReps;
  start = absl::Now();
  for (int i = 0; i < kReps; ++i) {
    std::string out;
    resp.SerializeToString(&out);
  }
  const double serialize_us = absl::ToDoubleMicroseconds(absl::Now() - start) / kReps;
  using P = UpdatePhases;
  std::printf(
      "PHASES size=%lld calls=%lld checks_us=%.1f slots_us=%.1f stage_us=%.1f backend_us=%.1f "
      "copy_out_us=%.1f handler_us=%.1f parse_us=%.1f serialize_us=%.1f\n",
      static_cast<long long>(size), static_cast<long long>(phases.Calls(P::kTotal)),
      phases.MeanMicros(P::kChecks), phases.MeanMicros(P::kSlots), phases.MeanMicros(P::kStage),
      phases.MeanMicros(P::kBackend), phases.MeanMicros(P::kCopyOut),
      phases.MeanMicros(P::kTotal), parse_us, serialize_us);
}

int Main() {
  SetLoggingEnabled(false);
  std::vector<int64_t> sizes;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      std::fprintf(stderr, "update_echo_bench: --sizes: '%s' is not a positive size\n",
                   std::string(part).c_str());
      return 2;
    }
    sizes.push_back(n);
  }
  WorkloadSpec spec = MixedLoadOptions::DefaultSpec();
  const ModelGeometry& g = spec.geometry;
  const int64_t per_slot = (2 * int64_t{g.h_qk} * g.d_k + int64_t{g.h_v} * g.d_v + 2 * g.h_v) * 4;
  int64_t max_batch = 1;
  for (int64_t s : sizes) max_batch = std::max(max_batch, (s + per_slot - 1) / per_slot);

  StateCacheServer::Options so = LoopbackOptions(int64_t{2} << 30, int64_t{64} << 20, absl::GetFlag(FLAGS_backend));
  so.compute.coalesce_updates = absl::GetFlag(FLAGS_coalesce_updates);
  auto phases = std::make_shared<UpdatePhases>();
  so.compute.update_phases = phases;
  absl::StatusOr<std::unique_ptr<StateCacheServer>> server = StateCacheServer::Create(std::move(so));
  if (!server.ok()) {
    std::fprintf(stderr, "update_echo_bench: %s\n", server.status().ToString().c_str());
    return 1;
  }
  EchoService echo;
  grpc::ServerBuilder eb;
  int echo_port = 0;
  eb.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &echo_port);
  eb.SetMaxReceiveMessageSize(1 << 30);
  eb.SetMaxSendMessageSize(1 << 30);
  eb.RegisterService(&echo);
  std::unique_ptr<grpc::Server> echo_server = eb.BuildAndStart();
  if (echo_server == nullptr) {
    std::fprintf(stderr, "update_echo_bench: cannot start the echo server\n");
    return 1;
  }

  const std::string target = LoopbackTarget(**server);
  absl::StatusOr<std::unique_ptr<StateCacheClient>> admin = StateCacheClient::Connect(target);
  spec.slots = max_batch;
  absl::Status st = admin.ok() ? RegisterWorkloadModel(**admin, spec) : admin.status();
  absl::StatusOr<std::vector<SlotHandle>> slots =
      st.ok() ? (*admin)->AllocateSlots(spec.model_id, static_cast<int>(max_batch))
              : absl::StatusOr<std::vector<SlotHandle>>(st);
  if (!slots.ok()) {
    std::fprintf(stderr, "update_echo_bench: %s\n", slots.status().ToString().c_str());
    return 1;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  // One channel per server, each used by this one thread (1 client).
  auto sc = v1::StateCache::NewStub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  auto ec = v1::StateCache::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", echo_port), grpc::InsecureChannelCredentials(), args));

  std::printf("backend=%s %s\n", (*server)->backend().name(),
              (*server)->backend().Describe().c_str());
  for (int64_t size : sizes) {
    const int64_t b = (size + per_slot - 1) / per_slot;
    std::vector<SlotHandle> mine(slots->begin(), slots->begin() + b);
    const v1::UpdateRequest req = MakeRequest(spec, mine);
    v1::UpdateResponse real;
    if (TimedCall(*sc, req, &real) < 0) return 1;  // also the warm-up
    echo.set_response(real);
    v1::UpdateResponse scratch;
    if (TimedCall(*ec, req, &scratch) < 0) return 1;
    phases->Reset();
    std::vector<double> update_us, echo_us;
    const absl::Time until = absl::Now() + absl::Seconds(2 * absl::GetFlag(FLAGS_seconds_per_size));
    const int min_calls = absl::GetFlag(FLAGS_min_calls);
    while (static_cast<int>(update_us.size()) < min_calls || absl::Now() < until) {
      for (int i = 0; i < 10; ++i) {
        const double u = TimedCall(*sc, req, &scratch);
        if (u < 0) return 1;
        update_us.push_back(u);
      }
      for (int i = 0; i < 10; ++i) {
        const double e = TimedCall(*ec, req, &scratch);
        if (e < 0) return 1;
        echo_us.push_back(e);
      }
    }
    const double up50 = Percentile(update_us, 50), ep50 = Percentile(echo_us, 50);
    std::printf(
        "ECHO size=%lld batch=%lld request_bytes=%zu response_bytes=%zu calls=%zu "
        "update_p50_us=%.1f update_p99_us=%.1f echo_p50_us=%.1f echo_p99_us=%.1f "
        "ratio_p50=%.2f\n",
        static_cast<long long>(size), static_cast<long long>(b), req.ByteSizeLong(),
        real.ByteSizeLong(), update_us.size(), up50, Percentile(update_us, 99), ep50,
        Percentile(echo_us, 99), ep50 > 0 ? up50 / ep50 : 0);
    PrintPhases(size, *phases, req, real);
    std::fflush(stdout);
  }
  echo_server->Shutdown();
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As statecached: no lock-order graph check per lock (Debian's Abseil).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return statecache::Main();
}
