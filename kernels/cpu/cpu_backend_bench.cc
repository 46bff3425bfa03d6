// CPU backend throughput: state values updated per second (per core and in
// total) for the fused decode step, per format. A benchmark, not a test:
//   bazel run -c opt //kernels/cpu:cpu_backend_bench -- [threads]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace statecache {
namespace {

void Bench(const char* format, int threads) {
  const ModelGeometry geo{Arch::kGdn, 1, 16, 32, 128, 128};
  const int batch = 16;
  auto backend = CpuBackend::Create({.threads = threads});
  StateLayout layout = *StateLayout::Identity(geo, *ParseFormatSpec(format));
  auto pool_buf = *backend->Allocate(layout.slot_bytes() * batch);
  auto model = *backend->Prepare(layout);
  PoolView pool{pool_buf->data(), batch, 1, geo.h_v, layout.head_layout().head_bytes};
  std::mt19937 rng(1);
  std::normal_distribution<float> n01(0.0f, 0.1f);
  std::vector<float> q(batch * geo.h_qk * geo.d_k), k(q.size()), v(batch * geo.h_v * geo.d_v),
      g(batch * geo.h_v, -0.05f), beta(batch * geo.h_v, 0.5f), o(v.size());
  for (auto* x : {&q, &k, &v}) for (float& e : *x) e = n01(rng);
  std::vector<int32_t> slots(batch);
  for (int i = 0; i < batch; ++i) slots[i] = i;
  DecodeInputs in{batch, slots.data(), DType::kFp32, q.data(), k.data(), v.data(), g.data(), beta.data(), o.data()};
  for (int i = 0; i < 3; ++i) (void)backend->DecodeUpdate(*model, pool, 0, in);
  const int iters = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    if (!backend->DecodeUpdate(*model, pool, 0, in).ok()) std::abort();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double values = double{batch} * geo.h_v * geo.d_k * geo.d_v * iters;
  std::printf("%-14s threads=%d  %8.1f us/step (B=%d, 32 heads)  %7.1f M values/s  %7.1f M values/s/core\n",
              format, threads, s / iters * 1e6, batch, values / s / 1e6, values / s / 1e6 / threads);
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  for (const char* f : {"fp32", "bf16", "damp", "damp-sr", "int8-hadamard", "int4", "nvfp4"}) {
    statecache::Bench(f, threads);
  }
  return 0;
}
