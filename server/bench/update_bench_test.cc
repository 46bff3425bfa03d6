// Benchmark (tagged "benchmark", not run by default): per-layer decode update
// latency on loopback vs the in-process CPU backend, for one layer of the
// Qwen3.6-35B-A3B geometry (16 key / 32 value heads, 128 x 128, damp:16).
//
//   bazel test //server/bench:update_bench_test --test_output=all --test_tag_filters=benchmark
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/statecache_client.h"
#include "server/core/log.h"
#include "server/loopback.h"
#include "server/server.h"

namespace statecache {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(UpdateBench, LoopbackVsInProcess) {
  SetLoggingEnabled(false);
  const ModelGeometry geo{Arch::kGdn, /*layers=*/2, /*h_qk=*/16, /*h_v=*/32, 128, 128};
  StateCacheServer::Options options = LoopbackOptions(64 << 20, 1 << 20);
  auto server = StateCacheServer::Create(std::move(options)).value();
  auto client = StateCacheClient::Connect(LoopbackTarget(*server)).value();
  ModelRegistration r;
  r.model_id = "qwen-layer";
  r.geometry = geo;
  r.format = "damp:16";
  r.slots = 32;
  ASSERT_TRUE(client->RegisterModel(r).ok());
  auto model = server->registry().Find("qwen-layer").value();
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 0.1f);
  for (int batch : {1, 8, 32}) {
    auto slots = client->AllocateSlots("qwen-layer", batch).value();
    std::vector<float> q(batch * geo.h_qk * geo.d_k), k(q.size()), v(batch * geo.h_v * geo.d_v),
        g(batch * geo.h_v, -0.1f), beta(batch * geo.h_v, 0.5f);
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    UpdateCall call;
    call.slots = slots;
    call.q = HostTensor::Fp32(q);
    call.k = HostTensor::Fp32(k);
    call.v = HostTensor::Fp32(v);
    call.g = g;
    call.beta = beta;
    auto stream = client->OpenUpdateStream().value();
    std::vector<double> unary, streamed, kernel;
    // In-process kernel on the server's own pool (the floor).
    std::vector<int32_t> idx;
    {
      auto access = model->slots->Acquire(slots, "slots").value();
      idx = access.indices();
    }
    std::vector<float> o(batch * geo.h_v * geo.d_v);
    for (int i = 0; i < 30; ++i) {
      DecodeInputs in;
      in.batch = batch;
      in.slots = idx.data();
      in.q = q.data();
      in.k = k.data();
      in.v = v.data();
      in.g = g.data();
      in.beta = beta.data();
      in.o = o.data();
      absl::Time t0 = absl::Now();
      {
        auto access = model->slots->Acquire(slots, "slots").value();
        ASSERT_TRUE(server->backend().DecodeUpdate(*model->prepared, model->slots->view(), 0, in).ok());
      }
      kernel.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      t0 = absl::Now();
      ASSERT_TRUE(client->Update("qwen-layer", call).ok());
      unary.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      t0 = absl::Now();
      ASSERT_TRUE(stream->Update("qwen-layer", call).ok());
      streamed.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    }
    ASSERT_TRUE(stream->Finish().ok());
    std::printf("B=%-3d in-process %8.0f us   unary RPC %8.0f us   stream %8.0f us   (median of 30, "
                "one layer, 32 heads 128x128 damp:16, CPU backend)\n",
                batch, Median(kernel), Median(unary), Median(streamed));
    ASSERT_TRUE(client->ReleaseSlots("qwen-layer", slots).ok());
  }
}

}  // namespace
}  // namespace statecache
