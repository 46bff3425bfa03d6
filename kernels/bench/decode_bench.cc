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

// What every measurement of the run shares.
struct Bench {
  const Flags& flags;
  Backend& be;
  void* stream;
  Timer& timer;
  std::mt19937& rng;
  std::vector<Row>& rows;
};

// One (arch, format) case: its layout, prepared model and filled pool.
struct Case {
  const std::string& arch_name;
  const std::string& fmt;
  Arch arch;
  const StateLayout& layout;
  const ModelGeometry& geo;
  PreparedModel& model;
  int64_t slot_bytes;
  int64_t num_slots;
  PoolView pool;
};

// One batch size of a case: `sets` disjoint slot sets of `batch` slots, the
// fixed inputs (bf16 q, k, v; fp32 g, beta, o) and the distributions their
// values came from (the prefill inputs draw from the same ones, in order).
struct BatchInputs {
  int batch = 0;
  int sets = 0;
  float inv = 0;  // 1 / sqrt(d_k): the scale of q and k
  std::normal_distribution<float> normal{0.0f, 1.0f};
  std::uniform_real_distribution<float> uni{0.0f, 1.0f};
  std::unique_ptr<BackendBuffer> d_sets, q, k, v, d_g, d_beta, d_o;
  DecodeInputs in;

  // Slot set i mod sets.
  int32_t* Slots(int i) const {
    return reinterpret_cast<int32_t*>(d_sets->data()) + int64_t{i % sets} * batch;
  }
};

// The engine path's StreamOps and its op record (one per batch size).
struct EngineRecord {
  StreamOps& ops;
  std::unique_ptr<BackendBuffer> buf;
  OpRecord rec;
};

// Copy-bandwidth ceiling: 1 GiB device-to-device memcpy (read + write).
void MeasureCopyBandwidth(Backend& be, void* stream, Timer& timer, int reps) {
  const int64_t copy_bytes = int64_t{1} << 30;
  auto a = be.Allocate(copy_bytes).value();
  auto b = be.Allocate(copy_bytes).value();
  const double us = timer.MedianUs(5, reps, [&](int) {
    CHECK_CUDA(ci::CopyDeviceToDeviceAsync(b->data(), a->data(), copy_bytes, stream));
  });
  const double bw = 2.0 * copy_bytes / (us * 1e-6);
  std::printf("copy: cudaMemcpy D2D 1 GiB: %.1f us, %.3f TB/s (read+write)\n", us, bw / 1e12);
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  std::printf("COPY_BW %.6e\n", bw);
}

// Fill: pack 16 random states, then replicate them over the pool.
void FillPool(Backend& be, PreparedModel& model, const PoolView& pool, const ModelGeometry& geo,
              int64_t num_slots, std::mt19937& rng) {
  const int seed_slots = 16;
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::vector<float> states(int64_t{seed_slots} * geo.h_v * geo.d_k * geo.d_v);
  for (float& x : states) x = normal(rng);
  auto d_states = Upload(be, states);
  std::vector<int32_t> seeds(seed_slots);
  for (int i = 0; i < seed_slots; ++i) seeds[i] = i;
  auto d_seeds = Upload(be, seeds);
  CHECK_OK(be.PackStates(model, pool, reinterpret_cast<int32_t*>(d_seeds->data()), seed_slots,
                         reinterpret_cast<float*>(d_states->data())));
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

// n bf16 values scale * N(0, 1).
std::vector<uint16_t> Bf16(int64_t n, float scale, std::normal_distribution<float>& normal,
                           std::mt19937& rng) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = FloatToBf16Bits(scale * normal(rng));
  return v;
}

// The slot sets and decode inputs of one batch size, uploaded.
void MakeBatchInputs(const Bench& b, const Case& c, int batch, BatchInputs* bi) {
  Backend& be = b.be;
  const ModelGeometry& geo = c.geo;
  bi->batch = batch;
  bi->sets = static_cast<int>(c.num_slots / batch);
  std::vector<int32_t> slot_sets(int64_t{bi->sets} * batch);
  for (int64_t i = 0; i < int64_t{bi->sets} * batch; ++i) slot_sets[i] = static_cast<int32_t>(i);
  bi->d_sets = Upload(be, slot_sets);
  // Inputs (bf16 q, k, v), fixed across launches.
  bi->inv = 1.0f / std::sqrt(static_cast<float>(geo.d_k));
  bi->q = Upload(be, Bf16(int64_t{batch} * geo.h_qk * geo.d_k, bi->inv, bi->normal, b.rng));
  bi->k = Upload(be, Bf16(int64_t{batch} * geo.h_qk * geo.d_k, bi->inv, bi->normal, b.rng));
  bi->v = Upload(be, Bf16(int64_t{batch} * geo.h_v * geo.d_v, 1.0f, bi->normal, b.rng));
  std::vector<float> g(int64_t{batch} * geo.h_v * geo.GateWidth()), beta(batch * geo.h_v);
  for (float& x : g) x = -0.3f * bi->uni(b.rng);
  for (float& x : beta) x = 0.2f + 0.6f * bi->uni(b.rng);
  bi->d_g = Upload(be, g);
  bi->d_beta = Upload(be, beta);
  bi->d_o = be.Allocate(int64_t{batch} * geo.h_v * geo.d_v * 4).value();
  DecodeInputs& in = bi->in;
  in.batch = batch;
  in.dtype = DType::kBf16;
  in.q = bi->q->data();
  in.k = bi->k->data();
  in.v = bi->v->data();
  in.g = reinterpret_cast<float*>(bi->d_g->data());
  in.beta = reinterpret_cast<float*>(bi->d_beta->data());
  in.o = reinterpret_cast<float*>(bi->d_o->data());
  in.slots = reinterpret_cast<int32_t*>(bi->d_sets->data());
}

// BINDING: the full binding (validation kernels + one 44-byte read-back +
// the kernel + stream sync), host wall clock, median of 15 calls.
void TimeBinding(const Bench& b, const Case& c, const BatchInputs& bi) {
  std::vector<double> wall;
  for (int r = 0; r < 15; ++r) {
    DecodeInputs it = bi.in;
    it.slots = bi.Slots(r);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_OK(b.be.DecodeUpdate(c.model, c.pool, 0, it));
    wall.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(wall.begin(), wall.end());
  std::printf("BINDING arch=%s format=%s B=%d us=%.1f\n", c.arch_name.c_str(), c.fmt.c_str(),
              bi.batch, wall[wall.size() / 2]);
}

// OP and OPSTEP: EnqueueDecode with its validation kernel and record, next to
// the raw kernel's `us`; then one decode step of 30 layers as one graph:
// replay time and the host's time to launch it.
void TimeEngineDecode(const Bench& b, const Case& c, const BatchInputs& bi, EngineRecord& er,
                      double us) {
  void* stream = b.stream;
  StreamOps& ops = er.ops;
  const auto op_launch = [&](int i) {
    DecodeInputs it = bi.in;
    it.slots = bi.Slots(i);
    CHECK_OK(ops.EnqueueDecode(c.model, c.pool, 0, it, er.rec, stream));
  };
  const double op_us = b.timer.MedianGraphUs(b.flags.iters, b.flags.reps, op_launch);
  CHECK_OK(ops.CheckRecord(er.rec, stream, true));
  std::printf("OP arch=%s format=%s B=%d us=%.2f kernel_us=%.2f ratio=%.3f\n",
              c.arch_name.c_str(), c.fmt.c_str(), bi.batch, op_us, us, op_us / us);
  constexpr int kLayers = 30;
  CHECK_CUDA(ci::StreamSynchronize(stream));
  void* exec = nullptr;
  CHECK_CUDA(ci::GraphCaptureBegin(stream));
  for (int l = 0; l < kLayers; ++l) op_launch(l);
  CHECK_CUDA(ci::GraphCaptureEnd(stream, &exec));
  CHECK_CUDA(ci::GraphLaunch(exec, stream));
  CHECK_CUDA(ci::StreamSynchronize(stream));
  std::vector<double> host_us;
  const double step_us = b.timer.MedianUs(1, b.flags.reps, [&](int) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_CUDA(ci::GraphLaunch(exec, stream));
    host_us.push_back(std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - t0).count());
  });
  std::sort(host_us.begin(), host_us.end());
  CHECK_CUDA(ci::GraphExecDestroy(exec));
  CHECK_OK(ops.CheckRecord(er.rec, stream, true));
  std::printf("OPSTEP arch=%s format=%s B=%d layers=%d step_us=%.1f kernels_us=%.1f "
              "launch_host_us=%.1f\n",
              c.arch_name.c_str(), c.fmt.c_str(), bi.batch, kLayers, step_us, kLayers * us,
              host_us[host_us.size() / 2]);
}

// OPCOPY, OPPACK, OPUNPACK and OPPREFILL: the engine path's copy, pack,
// unpack and prefill ops on B slots, with their bytes.
void TimeEngineOps(const Bench& b, const Case& c, BatchInputs& bi, EngineRecord& er) {
  Backend& be = b.be;
  void* stream = b.stream;
  StreamOps& ops = er.ops;
  const OpRecord& rec = er.rec;
  const ModelGeometry& geo = c.geo;
  const int batch = bi.batch, sets = bi.sets;
  const char* fmt = c.fmt.c_str();
  const double bytes = 2.0 * batch * c.slot_bytes;
  const double cus = b.timer.MedianGraphUs(b.flags.iters, b.flags.reps, [&](int i) {
    const int a = i % sets, b2 = (i + sets / 2) % sets;
    const int32_t* src = reinterpret_cast<int32_t*>(bi.d_sets->data()) + int64_t{a} * batch;
    const int32_t* dst = reinterpret_cast<int32_t*>(bi.d_sets->data()) + int64_t{b2} * batch;
    CHECK_OK(ops.EnqueueCopySlots(c.pool, src, dst, batch, rec, stream));
  });
  std::printf("OPCOPY format=%s B=%d us=%.2f bytes=%.0f\n", fmt, batch, cus, bytes);
  // Pack and unpack of B slots: packed bytes plus FP32 states.
  const int64_t values = int64_t{batch} * geo.HeadsPerSlot() * geo.d_k * geo.d_v;
  auto st = be.Allocate(values * 4).value();
  float* stp = reinterpret_cast<float*>(st->data());
  const int32_t* s0 = reinterpret_cast<int32_t*>(bi.d_sets->data());
  CHECK_OK(ops.EnqueueUnpack(c.model, c.pool, s0, batch, stp, rec, stream));
  const double pk = b.timer.MedianGraphUs(4, b.flags.reps, [&](int) {
    CHECK_OK(ops.EnqueuePack(c.model, c.pool, s0, batch, stp, rec, stream));
  });
  const double uk = b.timer.MedianGraphUs(4, b.flags.reps, [&](int) {
    CHECK_OK(ops.EnqueueUnpack(c.model, c.pool, s0, batch, stp, rec, stream));
  });
  CHECK_OK(ops.CheckRecord(rec, stream, true));
  const double pbytes = batch * c.slot_bytes + values * 4.0;
  std::printf("OPPACK format=%s B=%d us=%.2f bytes=%.0f\n", fmt, batch, pk, pbytes);
  std::printf("OPUNPACK format=%s B=%d us=%.2f bytes=%.0f\n", fmt, batch, uk, pbytes);
  // Prefill of a chunk of kPrefillTokens tokens per item (bf16 inputs, o
  // written): the layer's packed heads read + written once, plus the inputs
  // and o.
  constexpr int kPrefillTokens = 16;
  const int64_t rows = int64_t{batch} * kPrefillTokens;
  auto pq = Upload(be, Bf16(rows * geo.h_qk * geo.d_k, bi.inv, bi.normal, b.rng));
  auto pk2 = Upload(be, Bf16(rows * geo.h_qk * geo.d_k, bi.inv, bi.normal, b.rng));
  auto pv = Upload(be, Bf16(rows * geo.h_v * geo.d_v, 1.0f, bi.normal, b.rng));
  std::vector<float> pg(rows * geo.h_v * geo.GateWidth()), pb(rows * geo.h_v);
  for (float& x : pg) x = -0.3f * bi.uni(b.rng);
  for (float& x : pb) x = 0.2f + 0.6f * bi.uni(b.rng);
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
  const double pf = b.timer.MedianGraphUs(4, b.flags.reps, [&](int i) {
    PrefillInputs it = pin;
    it.slots = bi.Slots(i);
    CHECK_OK(ops.EnqueuePrefill(c.model, c.pool, 0, it, rec, stream));
  });
  CHECK_OK(ops.CheckRecord(rec, stream, true));
  const double fbytes =
      2.0 * batch * geo.h_v * c.layout.head_layout().head_bytes +
      rows * (2.0 * 2 * geo.h_qk * geo.d_k + 2.0 * geo.h_v * geo.d_v +
              4.0 * geo.h_v * geo.GateWidth() + 4.0 * geo.h_v + 4.0 * geo.h_v * geo.d_v);
  std::printf("OPPREFILL format=%s B=%d T=%d us=%.2f bytes=%.0f\n", fmt, batch, kPrefillTokens,
              pf, fbytes);
}

// SNAPSHOT: snapshot / restore of the same slots at copy speed.
void TimeSnapshot(const Bench& b, const Case& c, const BatchInputs& bi, double state_bytes) {
  const int batch = bi.batch, sets = bi.sets;
  const double cus = b.timer.MedianGraphUs(b.flags.iters, b.flags.reps, [&](int i) {
    const int a = i % sets, b2 = (i + sets / 2) % sets;
    const int32_t* src = reinterpret_cast<int32_t*>(bi.d_sets->data()) + int64_t{a} * batch;
    const int32_t* dst = reinterpret_cast<int32_t*>(bi.d_sets->data()) + int64_t{b2} * batch;
    CHECK_OK(CudaEnqueueCopySlotsUnchecked(b.be, c.pool, src, c.pool, dst, batch));
  });
  std::printf("SNAPSHOT format=%s B=%d us=%.2f bytes=%.0f\n", c.fmt.c_str(), batch, cus,
              state_bytes);
}

// Every line of one (case, B): EAGER, BINDING, OP, OPSTEP, the engine ops
// (GDN, B >= 64), RESULT, SNAPSHOT (GDN).
void RunBatch(const Bench& b, const Case& c, int batch) {
  const ModelGeometry& geo = c.geo;
  BatchInputs bi;
  MakeBatchInputs(b, c, batch, &bi);
  // One validated call first (also checks the inputs).
  CHECK_OK(b.be.DecodeUpdate(c.model, c.pool, 0, bi.in));
  const auto launch = [&](int i) {
    DecodeInputs it = bi.in;
    it.slots = bi.Slots(i);
    CHECK_OK(CudaEnqueueDecodeUnchecked(b.be, c.model, c.pool, 0, it, b.flags.early_heads));
  };
  const double us = b.timer.MedianGraphUs(b.flags.iters, b.flags.reps, launch);
  const double eager_us = b.timer.MedianUs(b.flags.iters, b.flags.reps, launch);
  std::printf("EAGER arch=%s format=%s B=%d us=%.2f\n", c.arch_name.c_str(), c.fmt.c_str(), batch,
              eager_us);
  TimeBinding(b, c, bi);
  // The engine path: EnqueueDecode with its validation kernel and record.
  StreamOps& ops = b.be.stream_ops();
  EngineRecord er{ops, b.be.Allocate(ops.RecordBytes(c.num_slots)).value(), {}};
  er.rec = OpRecord{er.buf->data(), ops.RecordBytes(c.num_slots)};
  CHECK_OK(ops.InitRecord(er.rec, b.stream));
  TimeEngineDecode(b, c, bi, er, us);
  if (c.arch == Arch::kGdn && batch >= 64) TimeEngineOps(b, c, bi, er);
  const double state_bytes = 2.0 * batch * c.slot_bytes;
  const double io_bytes = batch * (2.0 * 2 * geo.h_qk * geo.d_k + 2.0 * geo.h_v * geo.d_v +
                                   4.0 * geo.h_v * geo.GateWidth() + 4.0 * geo.h_v +
                                   4.0 * geo.h_v * geo.d_v);
  b.rows.push_back({c.arch_name, c.fmt, batch, us, state_bytes + io_bytes, state_bytes});
  std::printf("RESULT arch=%s format=%s B=%d us=%.2f state_bytes=%.0f bytes=%.0f mode=graph\n",
              c.arch_name.c_str(), c.fmt.c_str(), batch, us, state_bytes, state_bytes + io_bytes);
  // Snapshot / restore (GDN only: the bytes do not depend on the arch).
  if (c.arch == Arch::kGdn) TimeSnapshot(b, c, bi, state_bytes);
}

// One (arch, format): its layout, model and pool (--pool_mib MiB, at least
// two sets of the largest B), then every --batches entry.
void RunFormat(const Bench& b, const std::string& arch_name, const std::string& fmt) {
  Backend& be = b.be;
  const Arch arch = ParseArch(arch_name).value();
  const FormatSpec spec = ParseFormatSpec(fmt).value();
  const StateLayout layout = BenchLayout(arch, spec, b.rng);
  const ModelGeometry& geo = layout.geometry();
  auto model = be.Prepare(layout).value();
  const int64_t slot_bytes = layout.slot_bytes();
  const int max_b = *std::max_element(b.flags.batches.begin(), b.flags.batches.end());
  const int64_t num_slots =
      std::max<int64_t>(2 * max_b, b.flags.pool_mib * (int64_t{1} << 20) / slot_bytes);
  auto pool_buf = be.Allocate(num_slots * slot_bytes).value();
  const PoolView pool{pool_buf->data(), num_slots, geo.layers, geo.h_v,
                      layout.head_layout().head_bytes};
  FillPool(be, *model, pool, geo, num_slots, b.rng);
  const Case c{arch_name, fmt, arch, layout, geo, *model, slot_bytes, num_slots, pool};
  for (int batch : b.flags.batches) RunBatch(b, c, batch);
}

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
  MeasureCopyBandwidth(be, stream, timer, flags.reps);

  std::vector<Row> rows;
  std::mt19937 rng(42);
  const Bench bench{flags, be, stream, timer, rng, rows};
  for (const std::string& arch_name : flags.arches) {
    for (const std::string& fmt : flags.formats) RunFormat(bench, arch_name, fmt);
  }
  return 0;
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) { return statecache::Main(argc, argv); }
