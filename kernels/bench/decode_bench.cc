// Decode-update benchmark of the CUDA backend (issue 5).
//
// For B in --batches, 32 value heads, d_k = d_v = 128, GDN (16 key heads) and
// KDA (32): times one fused decode kernel per layer for each --formats entry,
// a slot copy of the same packed bytes (snapshot / restore), and a large
// device-to-device memcpy (the copy-bandwidth ceiling). Cold L2: the pool is
// --pool_mib MiB (several times the 60 MB L2) and every launch uses the next
// disjoint set of B slots. Timing: the --iters launches are captured in one
// CUDA graph and replayed (as serving engines replay decode steps, and as
// fla_bench.py times FLA), CUDA events around each replay, median of --reps
// replays (RESULT lines, mode=graph); the same launches enqueued one by one
// from the host are reported too (EAGER lines: at small B they include the
// host's launch cost). q, k, v are bf16 (as a model worker sends them), g and
// beta fp32, o fp32. Consecutive launches update disjoint slots, so they run
// with early heads (--early_heads=1, the default: each kernel stages its
// first heads while the previous one finishes, as DecodeUpdate's kernel does
// after its validation kernels; CudaEnqueueDecodeUnchecked); 0 waits first.
//
//   decode_bench --batches=1,8,32,64,128,256,512 --formats=fp32,damp,bf16
//
// The engine path (StreamOps, issue 25) beside the raw kernel, same slots
// and inputs: OP lines time EnqueueDecode (validation kernel + kernel, one
// record) in the same graph replay (ratio = OP / RESULT); OPSTEP lines a
// 30-call step of it in one graph, with the host time of the graph launch;
// OPCOPY / OPPACK / OPUNPACK / OPPREFILL the copy, pack, unpack and
// prefill (16 tokens) ops with their bytes.
//
// Output: one table row per (arch, format, B): microseconds per launch, bytes
// moved (state read + write, plus q/k/v/g/beta/o), effective bandwidth, % of
// the measured copy bandwidth, and speedup over our fp32 kernel.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/stream_ops.h"
#include "kernels/common/status_macros.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/internal/cuda_runtime.h"
#include "kernels/formats/format.h"
#include "kernels/formats/numeric.h"
#include "kernels/layout/state_layout.h"

namespace statecache {
namespace {

namespace ci = cuda_internal;

struct Flags {
  std::vector<int> batches = {1, 8, 32, 64, 128, 256, 512};
  std::vector<std::string> formats = {"fp32", "damp", "bf16", "damp-sr", "int8-hadamard"};
  std::vector<std::string> arches = {"gdn", "kda"};
  int iters = 20;
  int reps = 5;
  int64_t pool_mib = 3072;
  bool early_heads = true;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(argv[i], absl::MaxSplits('=', 1));
    if (kv.first == "--batches") {
      f.batches.clear();
      for (absl::string_view s : absl::StrSplit(kv.second, ',')) {
        int b;
        if (absl::SimpleAtoi(s, &b)) f.batches.push_back(b);
      }
    } else if (kv.first == "--formats") {
      f.formats = absl::StrSplit(kv.second, ',');
    } else if (kv.first == "--arches") {
      f.arches = absl::StrSplit(kv.second, ',');
    } else if (kv.first == "--iters") {
      f.iters = std::atoi(kv.second.c_str());
    } else if (kv.first == "--reps") {
      f.reps = std::atoi(kv.second.c_str());
    } else if (kv.first == "--pool_mib") {
      f.pool_mib = std::atoll(kv.second.c_str());
    } else if (kv.first == "--early_heads") {
      f.early_heads = kv.second != "0";
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      std::exit(2);
    }
  }
  return f;
}

#define CHECK_OK(expr)                                                      \
  do {                                                                      \
    const absl::Status s_ = (expr);                                         \
    if (!s_.ok()) {                                                         \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, s_.ToString().c_str()); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)
#define CHECK_CUDA(expr)                                                              \
  do {                                                                                \
    const int rc_ = (expr);                                                           \
    if (rc_ != 0) {                                                                   \
      std::fprintf(stderr, "%s:%d: cuda: %s\n", __FILE__, __LINE__, ci::ErrorString(rc_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

class Timer {
 public:
  explicit Timer(void* stream) : stream_(stream) {
    CHECK_CUDA(ci::EventCreate(&start_));
    CHECK_CUDA(ci::EventCreate(&stop_));
  }
  ~Timer() {
    ci::EventDestroy(start_);
    ci::EventDestroy(stop_);
  }
  // Median over reps of (time of `iters` calls of fn(i)) / iters, in us.
  template <typename Fn>
  double MedianUs(int iters, int reps, Fn fn) {
    for (int i = 0; i < 3; ++i) fn(i);  // warm up
    int next = 3;
    return MedianOfReps(iters, reps, [&] {
      for (int i = 0; i < iters; ++i) fn(next++);
    });
  }

  // The same measurement with the `iters` calls captured once in a CUDA
  // graph and the graph replayed (the host's launch cost drops out).
  template <typename Fn>
  double MedianGraphUs(int iters, int reps, Fn fn) {
    for (int i = 0; i < 3; ++i) fn(i);  // warm up (and configure the kernels)
    CHECK_CUDA(ci::StreamSynchronize(stream_));
    void* exec = nullptr;
    CHECK_CUDA(ci::GraphCaptureBegin(stream_));
    for (int i = 0; i < iters; ++i) fn(3 + i);
    CHECK_CUDA(ci::GraphCaptureEnd(stream_, &exec));
    CHECK_CUDA(ci::GraphLaunch(exec, stream_));  // warm up the graph
    const double us =
        MedianOfReps(iters, reps, [&] { CHECK_CUDA(ci::GraphLaunch(exec, stream_)); });
    CHECK_CUDA(ci::GraphExecDestroy(exec));
    return us;
  }

 private:
  // Median over reps of the time of one run() (which enqueues `iters`
  // calls), divided by iters, in us.
  template <typename Run>
  double MedianOfReps(int iters, int reps, Run run) {
    std::vector<double> us;
    for (int r = 0; r < reps; ++r) {
      CHECK_CUDA(ci::EventRecord(start_, stream_));
      run();
      CHECK_CUDA(ci::EventRecord(stop_, stream_));
      CHECK_CUDA(ci::EventSynchronize(stop_));
      float ms = 0;
      CHECK_CUDA(ci::EventElapsedMs(start_, stop_, &ms));
      us.push_back(1000.0 * ms / iters);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }

 private:
  void* stream_;
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

template <typename T>
std::unique_ptr<BackendBuffer> Upload(Backend& be, const std::vector<T>& v) {
  auto buf = be.Allocate(static_cast<int64_t>(v.size() * sizeof(T))).value();
  CHECK_OK(be.CopyIn(buf->data(), v.data(), v.size() * sizeof(T)));
  return buf;
}

StateLayout BenchLayout(Arch arch, const FormatSpec& spec, std::mt19937& rng) {
  ModelGeometry g;
  g.arch = arch;
  g.layers = 1;
  g.h_v = 32;
  g.h_qk = arch == Arch::kKda ? 32 : 16;
  g.d_k = 128;
  g.d_v = 128;
  if (!IsMixedFormat(spec.format)) return StateLayout::Identity(g, spec).value();
  // Mixed formats are always calibrated: a real key permutation (and value
  // maps for damp-sr), so the kernel pays the gathers.
  std::vector<int32_t> perm(g.h_v * g.d_k);
  for (int h = 0; h < g.h_v; ++h) {
    for (int i = 0; i < g.d_k; ++i) perm[h * g.d_k + i] = i;
    std::shuffle(perm.begin() + h * g.d_k, perm.begin() + (h + 1) * g.d_k, rng);
  }
  std::vector<int32_t> order;
  std::vector<float> scale;
  if (spec.format == StateFormat::kDampSr) {
    order.resize(g.h_v * g.d_v);
    scale.resize(g.h_v * g.d_v);
    for (int h = 0; h < g.h_v; ++h) {
      for (int j = 0; j < g.d_v; ++j) order[h * g.d_v + j] = j;
      std::shuffle(order.begin() + h * g.d_v, order.begin() + (h + 1) * g.d_v, rng);
    }
    std::uniform_real_distribution<float> u(0.5f, 2.0f);
    for (float& s : scale) s = u(rng);
  }
  return StateLayout::Create(g, spec, perm, order, scale).value();
}

struct Row {
  std::string arch, format;
  int batch;
  double us, bytes, state_bytes;
};

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  // The process edge: the launch switches of docs/BENCHMARKS.md's A/B runs
  // (STATECACHE_CUDA_PDL / _PIPELINE / _STAGES, launch_options.h).
  absl::StatusOr<std::unique_ptr<Backend>> be_or = CreateCudaBackend(LaunchOptionsFromEnvironment());
  if (!be_or.ok()) {
    std::printf("no GPU: %s\n", be_or.status().ToString().c_str());
    return 0;
  }
  Backend& be = **be_or;
  void* stream = be.native_stream();
  std::printf("device: %s\n", be.Describe().c_str());
  Timer timer(stream);

  // Copy-bandwidth ceiling: 1 GiB device-to-device memcpy (read + write).
  const int64_t copy_bytes = int64_t{1} << 30;
  {
    auto a = be.Allocate(copy_bytes).value();
    auto b = be.Allocate(copy_bytes).value();
    const double us = timer.MedianUs(5, flags.reps, [&](int) {
      CHECK_CUDA(ci::CopyDeviceToDeviceAsync(b->data(), a->data(), copy_bytes, stream));
    });
    const double bw = 2.0 * copy_bytes / (us * 1e-6);
    std::printf("copy: cudaMemcpy D2D 1 GiB: %.1f us, %.3f TB/s (read+write)\n", us, bw / 1e12);
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    std::printf("COPY_BW %.6e\n", bw);
  }

  std::vector<Row> rows;
  std::mt19937 rng(42);
  for (const std::string& arch_name : flags.arches) {
    const Arch arch = ParseArch(arch_name).value();
    for (const std::string& fmt : flags.formats) {
      const FormatSpec spec = ParseFormatSpec(fmt).value();
      const StateLayout layout = BenchLayout(arch, spec, rng);
      const ModelGeometry& geo = layout.geometry();
      auto model = be.Prepare(layout).value();
      const int64_t slot_bytes = layout.slot_bytes();
      const int max_b = *std::max_element(flags.batches.begin(), flags.batches.end());
      const int64_t num_slots =
          std::max<int64_t>(2 * max_b, flags.pool_mib * (int64_t{1} << 20) / slot_bytes);
      auto pool_buf = be.Allocate(num_slots * slot_bytes).value();
      const PoolView pool{pool_buf->data(), num_slots, geo.layers, geo.h_v,
                          layout.head_layout().head_bytes};
      // Fill: pack 16 random states, then replicate them over the pool.
      {
        const int seed_slots = 16;
        std::normal_distribution<float> normal(0.0f, 0.3f);
        std::vector<float> states(int64_t{seed_slots} * geo.h_v * geo.d_k * geo.d_v);
        for (float& x : states) x = normal(rng);
        auto d_states = Upload(be, states);
        std::vector<int32_t> seeds(seed_slots);
        for (int i = 0; i < seed_slots; ++i) seeds[i] = i;
        auto d_seeds = Upload(be, seeds);
        CHECK_OK(be.PackStates(*model, pool, reinterpret_cast<int32_t*>(d_seeds->data()),
                               seed_slots, reinterpret_cast<float*>(d_states->data())));
        // Copies of the seed slots, seed_slots at a time (sources distinct).
        for (int64_t base = seed_slots; base < num_slots; base += seed_slots) {
          const int n = static_cast<int>(std::min<int64_t>(seed_slots, num_slots - base));
          std::vector<int32_t> dst(n);
          for (int i = 0; i < n; ++i) dst[i] = static_cast<int32_t>(base + i);
          auto d_dst = Upload(be, dst);
          CHECK_OK(be.CopySlots(pool, reinterpret_cast<int32_t*>(d_seeds->data()), pool,
                                reinterpret_cast<int32_t*>(d_dst->data()), n));
        }
      }
      for (int batch : flags.batches) {
        const int sets = static_cast<int>(num_slots / batch);
        std::vector<int32_t> slot_sets(int64_t{sets} * batch);
        for (int64_t i = 0; i < int64_t{sets} * batch; ++i) slot_sets[i] = static_cast<int32_t>(i);
        auto d_sets = Upload(be, slot_sets);
        // Inputs (bf16 q, k, v), fixed across launches.
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::uniform_real_distribution<float> uni(0.0f, 1.0f);
        auto bf16 = [&](int64_t n, float scale) {
          std::vector<uint16_t> v(n);
          for (auto& x : v) x = FloatToBf16Bits(scale * normal(rng));
          return v;
        };
        const float inv = 1.0f / std::sqrt(static_cast<float>(geo.d_k));
        auto q = Upload(be, bf16(int64_t{batch} * geo.h_qk * geo.d_k, inv));
        auto k = Upload(be, bf16(int64_t{batch} * geo.h_qk * geo.d_k, inv));
        auto v = Upload(be, bf16(int64_t{batch} * geo.h_v * geo.d_v, 1.0f));
        std::vector<float> g(int64_t{batch} * geo.h_v * geo.GateWidth()), beta(batch * geo.h_v);
        for (float& x : g) x = -0.3f * uni(rng);
        for (float& x : beta) x = 0.2f + 0.6f * uni(rng);
        auto d_g = Upload(be, g);
        auto d_beta = Upload(be, beta);
        auto d_o = be.Allocate(int64_t{batch} * geo.h_v * geo.d_v * 4).value();
        DecodeInputs in;
        in.batch = batch;
        in.dtype = DType::kBf16;
        in.q = q->data();
        in.k = k->data();
        in.v = v->data();
        in.g = reinterpret_cast<float*>(d_g->data());
        in.beta = reinterpret_cast<float*>(d_beta->data());
        in.o = reinterpret_cast<float*>(d_o->data());
        // One validated call first (also checks the inputs).
        in.slots = reinterpret_cast<int32_t*>(d_sets->data());
        CHECK_OK(be.DecodeUpdate(*model, pool, 0, in));
        const auto launch = [&](int i) {
          DecodeInputs it = in;
          it.slots = reinterpret_cast<int32_t*>(d_sets->data()) + int64_t{i % sets} * batch;
          CHECK_OK(CudaEnqueueDecodeUnchecked(be, *model, pool, 0, it, flags.early_heads));
        };
        const double us = timer.MedianGraphUs(flags.iters, flags.reps, launch);
        const double eager_us = timer.MedianUs(flags.iters, flags.reps, launch);
        std::printf("EAGER arch=%s format=%s B=%d us=%.2f\n", arch_name.c_str(), fmt.c_str(), batch,
                    eager_us);
        // The full binding (validation kernels + one 44-byte read-back + the
        // kernel + stream sync), host wall clock, median of 15 calls.
        {
          std::vector<double> wall;
          for (int r = 0; r < 15; ++r) {
            DecodeInputs it = in;
            it.slots = reinterpret_cast<int32_t*>(d_sets->data()) + int64_t{r % sets} * batch;
            const auto t0 = std::chrono::steady_clock::now();
            CHECK_OK(be.DecodeUpdate(*model, pool, 0, it));
            wall.push_back(std::chrono::duration<double, std::micro>(
                               std::chrono::steady_clock::now() - t0)
                               .count());
          }
          std::sort(wall.begin(), wall.end());
          std::printf("BINDING arch=%s format=%s B=%d us=%.1f\n", arch_name.c_str(), fmt.c_str(),
                      batch, wall[wall.size() / 2]);
        }
        // The engine path: EnqueueDecode with its validation kernel and record.
        StreamOps& ops = be.stream_ops();
        auto rec_buf = be.Allocate(ops.RecordBytes(num_slots)).value();
        const OpRecord rec{rec_buf->data(), ops.RecordBytes(num_slots)};
        CHECK_OK(ops.InitRecord(rec, stream));
        const auto op_launch = [&](int i) {
          DecodeInputs it = in;
          it.slots = reinterpret_cast<int32_t*>(d_sets->data()) + int64_t{i % sets} * batch;
          CHECK_OK(ops.EnqueueDecode(*model, pool, 0, it, rec, stream));
        };
        const double op_us = timer.MedianGraphUs(flags.iters, flags.reps, op_launch);
        CHECK_OK(ops.CheckRecord(rec, stream, true));
        std::printf("OP arch=%s format=%s B=%d us=%.2f kernel_us=%.2f ratio=%.3f\n",
                    arch_name.c_str(), fmt.c_str(), batch, op_us, us, op_us / us);
        {
          // One decode step of 30 layers as one graph: replay time and the
          // host's time to launch it.
          constexpr int kLayers = 30;
          CHECK_CUDA(ci::StreamSynchronize(stream));
          void* exec = nullptr;
          CHECK_CUDA(ci::GraphCaptureBegin(stream));
          for (int l = 0; l < kLayers; ++l) op_launch(l);
          CHECK_CUDA(ci::GraphCaptureEnd(stream, &exec));
          CHECK_CUDA(ci::GraphLaunch(exec, stream));
          CHECK_CUDA(ci::StreamSynchronize(stream));
          std::vector<double> host_us;
          const double step_us = timer.MedianUs(1, flags.reps, [&](int) {
            const auto t0 = std::chrono::steady_clock::now();
            CHECK_CUDA(ci::GraphLaunch(exec, stream));
            host_us.push_back(std::chrono::duration<double, std::micro>(
                                  std::chrono::steady_clock::now() - t0).count());
          });
          std::sort(host_us.begin(), host_us.end());
          CHECK_CUDA(ci::GraphExecDestroy(exec));
          CHECK_OK(ops.CheckRecord(rec, stream, true));
          std::printf("OPSTEP arch=%s format=%s B=%d layers=%d step_us=%.1f kernels_us=%.1f "
                      "launch_host_us=%.1f\n",
                      arch_name.c_str(), fmt.c_str(), batch, kLayers, step_us, kLayers * us,
                      host_us[host_us.size() / 2]);
        }
        if (arch == Arch::kGdn && batch >= 64) {
          const double bytes = 2.0 * batch * slot_bytes;
          const double cus = timer.MedianGraphUs(flags.iters, flags.reps, [&](int i) {
            const int a = i % sets, b2 = (i + sets / 2) % sets;
            const int32_t* src = reinterpret_cast<int32_t*>(d_sets->data()) + int64_t{a} * batch;
            const int32_t* dst = reinterpret_cast<int32_t*>(d_sets->data()) + int64_t{b2} * batch;
            CHECK_OK(ops.EnqueueCopySlots(pool, src, dst, batch, rec, stream));
          });
          std::printf("OPCOPY format=%s B=%d us=%.2f bytes=%.0f\n", fmt.c_str(), batch, cus, bytes);
          // Pack and unpack of B slots: packed bytes plus FP32 states.
          const int64_t values = int64_t{batch} * geo.HeadsPerSlot() * geo.d_k * geo.d_v;
          auto st = be.Allocate(values * 4).value();
          float* stp = reinterpret_cast<float*>(st->data());
          const int32_t* s0 = reinterpret_cast<int32_t*>(d_sets->data());
          CHECK_OK(ops.EnqueueUnpack(*model, pool, s0, batch, stp, rec, stream));
          const double pk = timer.MedianGraphUs(4, flags.reps, [&](int) {
            CHECK_OK(ops.EnqueuePack(*model, pool, s0, batch, stp, rec, stream));
          });
          const double uk = timer.MedianGraphUs(4, flags.reps, [&](int) {
            CHECK_OK(ops.EnqueueUnpack(*model, pool, s0, batch, stp, rec, stream));
          });
          CHECK_OK(ops.CheckRecord(rec, stream, true));
          const double pbytes = batch * slot_bytes + values * 4.0;
          std::printf("OPPACK format=%s B=%d us=%.2f bytes=%.0f\n", fmt.c_str(), batch, pk, pbytes);
          std::printf("OPUNPACK format=%s B=%d us=%.2f bytes=%.0f\n", fmt.c_str(), batch, uk,
                      pbytes);
          // Prefill of a chunk of kPrefillTokens tokens per item (bf16
          // inputs, o written): the layer's packed heads read + written
          // once, plus the inputs and o.
          constexpr int kPrefillTokens = 16;
          const int64_t rows = int64_t{batch} * kPrefillTokens;
          auto pq = Upload(be, bf16(rows * geo.h_qk * geo.d_k, inv));
          auto pk2 = Upload(be, bf16(rows * geo.h_qk * geo.d_k, inv));
          auto pv = Upload(be, bf16(rows * geo.h_v * geo.d_v, 1.0f));
          std::vector<float> pg(rows * geo.h_v * geo.GateWidth()), pb(rows * geo.h_v);
          for (float& x : pg) x = -0.3f * uni(rng);
          for (float& x : pb) x = 0.2f + 0.6f * uni(rng);
          auto d_pg = Upload(be, pg);
          auto d_pb = Upload(be, pb);
          auto d_po = be.Allocate(rows * geo.h_v * geo.d_v * 4).value();
          PrefillInputs pin;
          pin.batch = batch;
          pin.tokens = kPrefillTokens;
          pin.dtype = DType::kBf16;
          pin.q = pq->data();
          pin.k = pk2->data();
          pin.v = pv->data();
          pin.g = reinterpret_cast<float*>(d_pg->data());
          pin.beta = reinterpret_cast<float*>(d_pb->data());
          pin.o = reinterpret_cast<float*>(d_po->data());
          const double pf = timer.MedianGraphUs(4, flags.reps, [&](int i) {
            PrefillInputs it = pin;
            it.slots = reinterpret_cast<int32_t*>(d_sets->data()) + int64_t{i % sets} * batch;
            CHECK_OK(ops.EnqueuePrefill(*model, pool, 0, it, rec, stream));
          });
          CHECK_OK(ops.CheckRecord(rec, stream, true));
          const double fbytes =
              2.0 * batch * geo.h_v * layout.head_layout().head_bytes +
              rows * (2.0 * 2 * geo.h_qk * geo.d_k + 2.0 * geo.h_v * geo.d_v +
                      4.0 * geo.h_v * geo.GateWidth() + 4.0 * geo.h_v + 4.0 * geo.h_v * geo.d_v);
          std::printf("OPPREFILL format=%s B=%d T=%d us=%.2f bytes=%.0f\n", fmt.c_str(), batch,
                      kPrefillTokens, pf, fbytes);
        }
        const double state_bytes = 2.0 * batch * slot_bytes;
        const double io_bytes = batch * (2.0 * 2 * geo.h_qk * geo.d_k + 2.0 * geo.h_v * geo.d_v +
                                         4.0 * geo.h_v * geo.GateWidth() + 4.0 * geo.h_v +
                                         4.0 * geo.h_v * geo.d_v);
        rows.push_back({arch_name, fmt, batch, us, state_bytes + io_bytes, state_bytes});
        std::printf("RESULT arch=%s format=%s B=%d us=%.2f state_bytes=%.0f bytes=%.0f mode=graph\n",
                    arch_name.c_str(), fmt.c_str(), batch, us, state_bytes,
                    state_bytes + io_bytes);
        // Snapshot / restore of the same slots at copy speed (GDN only: the
        // bytes do not depend on the arch).
        if (arch == Arch::kGdn) {
          const double cus = timer.MedianGraphUs(flags.iters, flags.reps, [&](int i) {
            const int a = i % sets, b2 = (i + sets / 2) % sets;
            const int32_t* src = reinterpret_cast<int32_t*>(d_sets->data()) + int64_t{a} * batch;
            const int32_t* dst = reinterpret_cast<int32_t*>(d_sets->data()) + int64_t{b2} * batch;
            CHECK_OK(CudaEnqueueCopySlotsUnchecked(be, pool, src, pool, dst, batch));
          });
          std::printf("SNAPSHOT format=%s B=%d us=%.2f bytes=%.0f\n", fmt.c_str(), batch, cus,
                      state_bytes);
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) { return statecache::Main(argc, argv); }
