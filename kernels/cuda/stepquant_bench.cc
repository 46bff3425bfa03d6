// STEPQuant decode-kernel benchmark (issue 9), next to fp32 and damp, with
// the method of the "GPU kernels (issue 5)" tables (docs/BENCHMARKS.md): one
// decode step of one layer, B slots x 32 value heads, d_k = d_v = 128, GDN
// with 16 key heads and KDA with 32; q, k, v bf16, g and beta fp32, o fp32.
// Cold L2: every kernel's pool is --pool_mib MiB and each launch takes the
// next disjoint set of B slots. CUDA events around --iters back-to-back
// launches of the kernel alone (CudaEnqueueDecodeUnchecked), median of
// --reps repetitions.
//
// Kernels (--kernels, any subset):
//   fp32, damp               the uniform / DAMP kernels (damp: random key
//                            permutation, as decode_bench)
//   stepquant-6, stepquant-4 calibrated-looking STEPQuant layouts (below),
//                            the default decode kernel (the tiled kernel,
//                            StepTileDecodeKernel)
//   stepquant-6-tile, stepquant-4-tile  the tiled kernel explicitly
//                            (StepQuantVariant::kTile)
//   stepquant-6-uniform, stepquant-4-uniform  every row at 6 / 4 bits
//   stepquant-6-c2, stepquant-4-c2  fast kernel, one thread per column
//                            (StepQuantVariant::kC2)
//   stepquant-6-c3, stepquant-4-c3  fast kernel sized for 3 CTAs / SM
//                            (StepQuantVariant::kC3)
//   stepquant-6-h2, stepquant-4-h2  fast kernel with two row halves per
//                            column (256 threads; StepQuantVariant::kH2)
//   stepquant-6-slow, stepquant-4-slow  the one-CTA-per-head kernel
//                            (LaunchOptions::stepquant_fast = false)
// Each kernel runs on a backend of its own LaunchOptions: the environment's
// (LaunchOptionsFromEnvironment, read once) with the STEPQuant switches
// above.
// STEPQuant allocations follow the calibrated shipped models (kernels/
// stepquant/README.md): GDN whole heads, stepquant-6 10 / 12 / 10 heads at
// 8 / 6 / 4 bits, stepquant-4 6 / 2 / 24 heads at 8 / 4 / 3 bits; KDA rows
// per head: stepquant-6 1 pivot + 38 / 51 / 38 rows at 8 / 6 / 4 bits,
// stepquant-4 1 pivot + 3 / 27 / 30 / 67 rows at 8 / 6 / 4 / 3 bits; random
// key permutations and row impact.
//
// Output lines (kernels/bench/make_table.py reads them):
//   COPY_BW <bytes/s>                       1 GiB cudaMemcpy D2D, read + write
//   RESULT arch=gdn format=stepquant-4 B=256 us=... state_bytes=... bytes=...
// state_bytes = 2 x B x packed slot bytes (read + write).
//
//   stepquant_bench --batches=1,8,32,64,128,256,512 > stepquant_bench.log
//   python3 kernels/bench/make_table.py stepquant_bench.log
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/backend/backend.h"
#include "kernels/common/status_macros.h"
#include "kernels/common/tool_main.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/internal/cuda_runtime.h"
#include "kernels/cuda_ipc/cuda_status.h"
#include "kernels/formats/format.h"
#include "kernels/formats/numeric.h"
#include "kernels/layout/state_layout.h"

ABSL_FLAG(std::string, batches, "1,8,32,64,128,256,512", "batch sizes B");
ABSL_FLAG(std::string, arches, "gdn,kda", "gdn and/or kda");
ABSL_FLAG(std::string, kernels, "fp32,damp,stepquant-6,stepquant-4,stepquant-6-h2,stepquant-4-h2",
          "kernels to time (see the header)");
ABSL_FLAG(int, iters, 20, "launches per timed repetition");
ABSL_FLAG(int, reps, 5, "timed repetitions (median)");
ABSL_FLAG(int64_t, pool_mib, 3072, "pool size per kernel (cold L2)");

namespace statecache {
namespace {

namespace ci = cuda_internal;

// A kernel under test: its layout and the launch switches of its backend.
struct BenchKernel {
  std::string name;
  StateLayout layout;
  LaunchOptions options;
};

ModelGeometry BenchGeometry(Arch arch) {
  return ModelGeometry{arch, 1, arch == Arch::kKda ? 32 : 16, 32, 128, 128};
}

std::vector<int32_t> RandomPerms(const ModelGeometry& g, std::mt19937& rng) {
  std::vector<int32_t> perm(int64_t{g.h_v} * g.d_k);
  for (int h = 0; h < g.h_v; ++h) {
    auto first = perm.begin() + int64_t{h} * g.d_k;
    for (int i = 0; i < g.d_k; ++i) first[i] = i;
    std::shuffle(first, first + g.d_k, rng);
  }
  return perm;
}

// Rows per width (index = bits, 16 = pivot) of one head of the
// calibrated-looking allocation, or the GDN head width.
std::vector<int8_t> HeadRowBits(Arch arch, StateFormat f, int h) {
  std::vector<std::pair<int, int>> counts;  // (bits, rows), widest first
  if (arch == Arch::kGdn) {
    // 32 heads: stepquant-6 10 x 8, 12 x 6, 10 x 4; stepquant-4 6 x 8, 2 x 4, 24 x 3.
    int b;
    if (f == StateFormat::kStepQuant6) {
      b = h < 10 ? 8 : h < 22 ? 6 : 4;
    } else {
      b = h < 6 ? 8 : h < 8 ? 4 : 3;
    }
    counts = {{b, 128}};
  } else if (f == StateFormat::kStepQuant6) {
    counts = {{16, 1}, {8, 38}, {6, 51}, {4, 38}};
  } else {
    counts = {{16, 1}, {8, 3}, {6, 27}, {4, 30}, {3, 67}};
  }
  std::vector<int8_t> bits;
  for (const auto& [b, n] : counts) bits.insert(bits.end(), n, static_cast<int8_t>(b));
  return bits;
}

absl::StatusOr<BenchKernel> MakeBenchKernel(const std::string& name, Arch arch,
                                            const LaunchOptions& base, std::mt19937& rng) {
  const ModelGeometry g = BenchGeometry(arch);
  BenchKernel k{name, StateLayout::Identity(g, {StateFormat::kFp32, 0}).value(), base};
  k.options.stepquant_fast = true;
  k.options.stepquant_variant = StepQuantVariant::kTile;
  if (name == "fp32") return k;
  if (name == "damp") {
    ASSIGN_OR_RETURN(k.layout, StateLayout::Create(g, {StateFormat::kDamp, kDefaultKHi},
                                                   RandomPerms(g, rng), {}, {}));
    return k;
  }
  const bool six = absl::StartsWith(name, "stepquant-6");
  const StateFormat f = six ? StateFormat::kStepQuant6 : StateFormat::kStepQuant4;
  const std::string suffix = name.substr(std::string("stepquant-6").size());
  if (suffix == "-uniform") {
    ASSIGN_OR_RETURN(k.layout, StateLayout::Identity(g, {f, 0}));
    return k;
  }
  if (!absl::StartsWith(name, "stepquant-") ||
      (!suffix.empty() && suffix != "-c2" && suffix != "-c3" && suffix != "-h2" &&
       suffix != "-tile" && suffix != "-slow")) {
    return absl::InvalidArgumentError(absl::StrCat("kernels: unknown kernel '", name, "'"));
  }
  if (suffix == "-c2") k.options.stepquant_variant = StepQuantVariant::kC2;
  if (suffix == "-c3") k.options.stepquant_variant = StepQuantVariant::kC3;
  if (suffix == "-h2") k.options.stepquant_variant = StepQuantVariant::kH2;
  if (suffix == "-slow") k.options.stepquant_fast = false;
  std::vector<int8_t> bits;
  std::vector<float> impact;
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  for (int h = 0; h < g.h_v; ++h) {
    const std::vector<int8_t> b = HeadRowBits(arch, f, h);
    bits.insert(bits.end(), b.begin(), b.end());
    for (int r = 0; r < g.d_k; ++r) impact.push_back(u(rng));
  }
  ASSIGN_OR_RETURN(k.layout, StateLayout::CreateStepQuant(g, {f, 0}, RandomPerms(g, rng),
                                                          std::move(bits), std::move(impact)));
  return k;
}

template <typename T>
absl::StatusOr<std::unique_ptr<BackendBuffer>> Upload(Backend& be, const std::vector<T>& v) {
  ASSIGN_OR_RETURN(auto buf, be.Allocate(static_cast<int64_t>(std::max<size_t>(1, v.size()) * sizeof(T))));
  RETURN_IF_ERROR(be.CopyIn(buf->data(), v.data(), v.size() * sizeof(T)));
  return buf;
}

// Median over `reps` of the per-launch time (us) of `iters` launches of
// launch(i); launch numbers keep increasing across calls (fresh slot sets).
class EventTimer {
 public:
  explicit EventTimer(void* stream) : stream_(stream) {}
  ~EventTimer() {
    if (start_ != nullptr) ci::EventDestroy(start_);
    if (stop_ != nullptr) ci::EventDestroy(stop_);
  }
  template <typename Fn>
  absl::StatusOr<double> Median(int iters, int reps, Fn launch) {
    if (start_ == nullptr) {
      RETURN_IF_ERROR(CudaStatus(ci::EventCreate(&start_), "event"));
      RETURN_IF_ERROR(CudaStatus(ci::EventCreate(&stop_), "event"));
    }
    for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(launch(counter_++));
    std::vector<double> us;
    for (int r = 0; r < reps; ++r) {
      RETURN_IF_ERROR(CudaStatus(ci::EventRecord(start_, stream_), "record"));
      for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(launch(counter_++));
      RETURN_IF_ERROR(CudaStatus(ci::EventRecord(stop_, stream_), "record"));
      RETURN_IF_ERROR(CudaStatus(ci::EventSynchronize(stop_), "sync"));
      float ms = 0;
      RETURN_IF_ERROR(CudaStatus(ci::EventElapsedMs(start_, stop_, &ms), "elapsed"));
      us.push_back(1000.0 * ms / iters);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }

 private:
  void* stream_;
  void* start_ = nullptr;
  void* stop_ = nullptr;
  int64_t counter_ = 0;
};

// Times one kernel at every B; prints RESULT lines.
absl::Status RunKernel(Backend& be, void* stream, EventTimer& timer, const BenchKernel& k,
                       const std::string& arch_name, const std::vector<int>& batches,
                       std::mt19937& rng) {
  const ModelGeometry& g = k.layout.geometry();
  ASSIGN_OR_RETURN(auto model, be.Prepare(k.layout));
  const int64_t slot_bytes = k.layout.slot_bytes();
  const int max_b = *std::max_element(batches.begin(), batches.end());
  const int64_t slots = std::max<int64_t>(2 * max_b, absl::GetFlag(FLAGS_pool_mib) * (1 << 20) / slot_bytes);
  ASSIGN_OR_RETURN(auto pool_buf, be.Allocate(slots * slot_bytes));
  const PoolView pool{pool_buf->data(), slots, g.layers, g.h_v, k.layout.head_layout().head_bytes};
  {
    // Pack 8 random states, then copy them over the whole pool.
    constexpr int kSeeds = 8;
    std::normal_distribution<float> normal(0.0f, 0.3f);
    std::vector<float> states(int64_t{kSeeds} * g.h_v * g.d_k * g.d_v);
    for (float& x : states) x = normal(rng);
    std::vector<int32_t> seeds(kSeeds);
    for (int i = 0; i < kSeeds; ++i) seeds[i] = i;
    ASSIGN_OR_RETURN(auto d_states, Upload(be, states));
    ASSIGN_OR_RETURN(auto d_seeds, Upload(be, seeds));
    RETURN_IF_ERROR(be.PackStates(*model, pool, reinterpret_cast<int32_t*>(d_seeds->data()), kSeeds,
                                  reinterpret_cast<float*>(d_states->data())));
    // Doubling copies: slots [0, m) -> [m, 2m) (CopySlots wants distinct
    // sources and distinct destinations).
    for (int64_t m = kSeeds; m < slots; m *= 2) {
      std::vector<int32_t> src, dst;
      for (int64_t s = 0; s < m && m + s < slots; ++s) {
        src.push_back(static_cast<int32_t>(s));
        dst.push_back(static_cast<int32_t>(m + s));
      }
      ASSIGN_OR_RETURN(auto d_src, Upload(be, src));
      ASSIGN_OR_RETURN(auto d_dst, Upload(be, dst));
      RETURN_IF_ERROR(be.CopySlots(pool, reinterpret_cast<int32_t*>(d_src->data()), pool,
                                   reinterpret_cast<int32_t*>(d_dst->data()),
                                   static_cast<int>(dst.size())));
    }
  }
  for (int batch : batches) {
    const int64_t sets = slots / batch;
    std::vector<int32_t> order(sets * batch);
    for (int64_t i = 0; i < sets * batch; ++i) order[i] = static_cast<int32_t>(i);
    ASSIGN_OR_RETURN(auto d_order, Upload(be, order));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    auto bf16 = [&](int64_t n, float scale) {
      std::vector<uint16_t> v(n);
      for (uint16_t& x : v) x = FloatToBf16Bits(scale * normal(rng));
      return v;
    };
    const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(g.d_k));
    ASSIGN_OR_RETURN(auto q, Upload(be, bf16(int64_t{batch} * g.h_qk * g.d_k, inv_sqrt)));
    ASSIGN_OR_RETURN(auto kk, Upload(be, bf16(int64_t{batch} * g.h_qk * g.d_k, inv_sqrt)));
    ASSIGN_OR_RETURN(auto v, Upload(be, bf16(int64_t{batch} * g.h_v * g.d_v, 1.0f)));
    std::vector<float> gate(int64_t{batch} * g.h_v * g.GateWidth()), beta(int64_t{batch} * g.h_v);
    for (float& x : gate) x = -0.3f * uni(rng);
    for (float& x : beta) x = 0.2f + 0.6f * uni(rng);
    ASSIGN_OR_RETURN(auto d_gate, Upload(be, gate));
    ASSIGN_OR_RETURN(auto d_beta, Upload(be, beta));
    ASSIGN_OR_RETURN(auto d_o, be.Allocate(int64_t{batch} * g.h_v * g.d_v * 4));
    DecodeInputs in{batch, reinterpret_cast<int32_t*>(d_order->data()), DType::kBf16, q->data(),
                    kk->data(), v->data(), reinterpret_cast<float*>(d_gate->data()),
                    reinterpret_cast<float*>(d_beta->data()), reinterpret_cast<float*>(d_o->data())};
    RETURN_IF_ERROR(be.DecodeUpdate(*model, pool, 0, in));  // validated once
    ASSIGN_OR_RETURN(const double us, timer.Median(absl::GetFlag(FLAGS_iters), absl::GetFlag(FLAGS_reps),
                                                   [&](int64_t i) {
                                                     DecodeInputs it = in;
                                                     it.slots += (i % sets) * batch;
                                                     return CudaEnqueueDecodeUnchecked(be, *model, pool, 0, it);
                                                   }));
    const double state_bytes = 2.0 * batch * slot_bytes;
    const double io_bytes = batch * (2.0 * 2 * g.h_qk * g.d_k + 2.0 * g.h_v * g.d_v +
                                     4.0 * g.h_v * g.GateWidth() + 4.0 * g.h_v + 4.0 * g.h_v * g.d_v);
    std::printf("RESULT arch=%s format=%s B=%d us=%.2f state_bytes=%.0f bytes=%.0f\n",
                arch_name.c_str(), k.name.c_str(), batch, us, state_bytes, state_bytes + io_bytes);
  }
  return absl::OkStatus();
}

absl::Status Run() {
  std::vector<int> batches;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    int x = 0;
    if (!absl::SimpleAtoi(b, &x) || x < 1) return absl::InvalidArgumentError("batches: not a list of B >= 1");
    batches.push_back(x);
  }
  const LaunchOptions env_options = LaunchOptionsFromEnvironment();  // the process edge
  absl::StatusOr<std::unique_ptr<Backend>> be_or = CreateCudaBackend(env_options);
  if (!be_or.ok()) {
    std::printf("no GPU: %s\n", be_or.status().ToString().c_str());
    return absl::OkStatus();
  }
  Backend& be = **be_or;
  void* stream = be.native_stream();
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  std::printf("device: %s\n", be.Describe().c_str());
  EventTimer timer(stream);
  {
    const int64_t bytes = int64_t{1} << 30;
    ASSIGN_OR_RETURN(auto a, be.Allocate(bytes));
    ASSIGN_OR_RETURN(auto b, be.Allocate(bytes));
    ASSIGN_OR_RETURN(const double us, timer.Median(5, absl::GetFlag(FLAGS_reps), [&](int64_t) {
      return CudaStatus(ci::CopyDeviceToDeviceAsync(b->data(), a->data(), bytes, stream), "copy");
    }));
    std::printf("COPY_BW %.6e\n", 2.0 * bytes / (us * 1e-6));
  }
  std::mt19937 rng(7);
  for (absl::string_view arch_name : absl::StrSplit(absl::GetFlag(FLAGS_arches), ',')) {
    ASSIGN_OR_RETURN(const Arch arch, ParseArch(arch_name));
    for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_kernels), ',')) {
      ASSIGN_OR_RETURN(const BenchKernel k,
                       MakeBenchKernel(std::string(name), arch, env_options, rng));
      ASSIGN_OR_RETURN(std::unique_ptr<Backend> kernel_be, CreateCudaBackend(k.options));
      void* kernel_stream = kernel_be->native_stream();
      EventTimer kernel_timer(kernel_stream);
      if (IsStepQuantFormat(k.layout.format().format)) {
        std::printf("layout %s %s: %.4f bits/value payload, slot %lld bytes\n",
                    std::string(arch_name).c_str(), k.name.c_str(), k.layout.PayloadBitsPerValue(),
                    static_cast<long long>(k.layout.slot_bytes()));
      }
      RETURN_IF_ERROR(RunKernel(*kernel_be, kernel_stream, kernel_timer, k,
                                std::string(arch_name), batches, rng));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) { return statecache::ToolMain(argc, argv, statecache::Run); }
