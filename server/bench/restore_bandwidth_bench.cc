// Benchmark (tagged benchmark / gpu_only): restore from the host checkpoint
// tier against the host-to-device link's peak (issue 31 acceptance: restore
// from the host tier at >= 80% of PCIe host-to-device bandwidth for its
// bytes).
//
//   (a) PEAK: raw cudaMemcpyAsync host -> device from page-locked memory,
//       per size: one copy + one stream wait (single_gbps) and --batch
//       copies back to back + one wait (batched_gbps). On --backend=cpu:
//       Backend::CopyIn (memcpy) from the same kind of buffer.
//   (b) RESTORE: checkpoints of one sequence of Qwen3.6-35B-A3B's states
//       (30 GDN layers x 32 value heads x 128 x 128, one checkpoint = every
//       layer) in each --formats format, sitting in the host tier, restored
//       through what the Restore RPC runs: ops::LookupPrefix (promotion
//       host -> device arena, one copy from pinned memory) + ops::Restore
//       (arena -> slot). Two arena states:
//         free: the arena has a free entry (the promotion is one copy);
//         full: the arena is full, so the promotion first evicts its
//               least recently used entry (the steady state of an LRU
//               cache): with an exclusive host tier it is copied out
//               (device -> host, overlapped with the copy in,
//               Backend::CopyOutThenIn); with the inclusive host tier
//               (CheckpointStore::Options::host_write_through, the server's
//               default) the host tier holds it already, so nothing is
//               copied out (line key host_write_through=0|1).
//       Bytes/s = slot_bytes / (lookup + restore time), median over
//       --rounds x --checkpoints restores; ratio = to the best PEAK
//       batched_gbps (ratio_same_size: to the single copy of slot_bytes).
//       Every restored slot is read back and compared with what was
//       snapshotted (result=OK / MISMATCH).
//
//   restore_bandwidth_bench --backend=cuda [--formats=damp:16,fp32]
//       [--sizes_mib=4,16,64,256] [--checkpoints=8] [--rounds=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/pinned_memory.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/cuda/internal/cuda_runtime.h"
#include "server/core/log.h"
#include "server/core/model_registry.h"
#include "server/core/proto_convert.h"
#include "server/ops/state_ops.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/host_tier.h"
#include "server/pool/prefix_key.h"

ABSL_FLAG(std::string, backend, "cuda", "cuda or cpu (a smoke run of the same path)");
ABSL_FLAG(std::string, formats, "damp:16,fp32", "slot formats, comma-separated");
ABSL_FLAG(std::string, sizes_mib, "4,16,64,256", "PEAK copy sizes in MiB");
ABSL_FLAG(int, iters, 20, "PEAK copies per size (after 3 warm-up copies)");
ABSL_FLAG(int, batch, 8, "PEAK copies back to back per stream wait");
ABSL_FLAG(int, checkpoints, 8, "checkpoints in the host tier per round");
ABSL_FLAG(int, rounds, 3, "rounds per format and arena state");
ABSL_FLAG(int, layers, 30, "GDN layers (Qwen3.6-35B-A3B: 30)");

namespace statecache {
namespace {

namespace ci = cuda_internal;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}
template <typename T>
T Check(absl::StatusOr<T> s, const char* what) {
  Check(s.status(), what);
  return *std::move(s);
}

struct Peak {
  double single_gbps = 0;
  double batched_gbps = 0;
};

// One host -> device copy of `bytes` from pinned `src`: raw cudaMemcpyAsync +
// a stream wait on CUDA, Backend::CopyIn on the CPU backend.
class RawCopy {
 public:
  explicit RawCopy(Backend* backend)
      : backend_(backend), cuda_(backend->name() == std::string("cuda")) {
    if (cuda_ && ci::StreamCreate(&stream_) != 0) Check(absl::InternalError("stream"), "stream");
  }
  ~RawCopy() {
    if (stream_ != nullptr) ci::StreamDestroy(stream_);
  }
  void Enqueue(void* dst, const void* src, int64_t bytes) {
    if (!cuda_) {
      Check(backend_->CopyIn(dst, src, bytes), "copy in");
    } else if (ci::CopyHostToDeviceAsync(dst, src, bytes, stream_) != 0) {
      Check(absl::InternalError("cudaMemcpyAsync"), "copy");
    }
  }
  void Wait() {
    if (cuda_ && ci::StreamSynchronize(stream_) != 0) Check(absl::InternalError("sync"), "sync");
  }

 private:
  Backend* backend_;
  bool cuda_;
  void* stream_ = nullptr;
};

Peak MeasurePeak(Backend* backend, RawCopy& raw, uint8_t* host, uint8_t* device, int64_t bytes) {
  const int iters = absl::GetFlag(FLAGS_iters), batch = absl::GetFlag(FLAGS_batch);
  for (int i = 0; i < 3; ++i) {
    raw.Enqueue(device, host, bytes);
    raw.Wait();
  }
  std::vector<double> single;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    raw.Enqueue(device, host, bytes);
    raw.Wait();
    single.push_back(Seconds(t0, Clock::now()));
  }
  std::vector<double> batched;
  for (int i = 0; i < std::max(1, iters / batch); ++i) {
    const auto t0 = Clock::now();
    for (int j = 0; j < batch; ++j) raw.Enqueue(device, host, bytes);
    raw.Wait();
    batched.push_back(Seconds(t0, Clock::now()) / batch);
  }
  Peak p;
  p.single_gbps = bytes / Median(single) / 1e9;
  p.batched_gbps = bytes / Median(batched) / 1e9;
  std::printf("PEAK bytes=%lld single_gbps=%.2f batched_gbps=%.2f\n",
              static_cast<long long>(bytes), p.single_gbps, p.batched_gbps);
  return p;
}

PrefixKey Key(int n) {
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = 1000 + i;
  return Sha256KeyOfTokens(tokens);
}

std::string Pattern(int seed, int64_t n) {
  std::mt19937_64 rng(seed);
  std::string s(static_cast<size_t>(n), '\0');
  for (size_t i = 0; i + 8 <= s.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(&s[i], &r, 8);
  }
  return s;
}

struct Bench {
  Backend* backend;
  Model* m;
  std::shared_ptr<HostTier> host;
  ops::Context ctx;
  v1::SlotHandle slot_a, slot_b;  // snapshot source, restore target
  int32_t index_b = -1;
  int64_t slot_bytes = 0;
  std::vector<std::string> patterns;  // by key number 1..n+1
  bool mismatch = false;
  bool inclusive = false;  // host_write_through of the stores made

  std::unique_ptr<CheckpointStore> Store(int64_t capacity) {
    CheckpointStore::Options o;
    o.capacity = capacity;
    o.host = host;
    o.host_write_through = inclusive;
    return Check(CheckpointStore::Create(backend, m->layout, o), "checkpoint store");
  }

  // Snapshots keys 1..n+1 through a 1-entry arena: 1..n land in the host tier.
  void FillHostTier(int n) {
    m->checkpoints = Store(1);
    for (int k = 1; k <= n + 1; ++k) {
      const int32_t a = Check(m->slots->Acquire({HandleFromProto(slot_a)}, "slot"), "acquire")
                            .indices()[0];
      Check(backend->CopyIn(m->slots->view().slot(a), patterns[k].data(), slot_bytes), "fill");
      v1::SnapshotRequest req;
      *req.mutable_slot() = slot_a;
      KeyToProto(Key(k), req.mutable_key());
      v1::SnapshotResponse resp;
      Check(ops::Snapshot(ctx, *m, req, &resp), "snapshot");
    }
  }

  // Lookup + Restore of key k: seconds of each; checks the slot's bytes.
  std::pair<double, double> RestoreOne(int k, StoreTier want_tier) {
    v1::LookupPrefixRequest lreq;
    KeyToProto(Key(k), lreq.mutable_keys()->add_keys());
    v1::LookupPrefixResponse lresp;
    const auto t0 = Clock::now();
    Check(ops::LookupPrefix(ctx, *m, lreq, &lresp), "lookup");
    const auto t1 = Clock::now();
    v1::RestoreRequest rreq;
    *rreq.mutable_slot() = slot_b;
    *rreq.mutable_key() = lresp.key();
    rreq.set_lease_id(lresp.lease_id());
    v1::RestoreResponse rresp;
    Check(ops::Restore(ctx, *m, rreq, &rresp), "restore");
    const auto t2 = Clock::now();
    if (!lresp.hit() || static_cast<StoreTier>(lresp.tier()) != want_tier) {
      std::fprintf(stderr, "key %d: hit=%d tier=%d, want the %s tier\n", k, lresp.hit(),
                   static_cast<int>(lresp.tier()), StoreTierName(want_tier));
      mismatch = true;
    }
    std::string out(static_cast<size_t>(slot_bytes), '\0');
    Check(backend->CopyOut(&out[0], m->slots->view().slot(index_b), slot_bytes), "read back");
    if (out != patterns[k]) {
      std::fprintf(stderr, "key %d: restored bytes differ\n", k);
      mismatch = true;
    }
    return {Seconds(t0, t1), Seconds(t1, t2)};
  }
};

void RunFormat(Backend* backend, const std::string& format, double peak_gbps, RawCopy& raw) {
  const ModelGeometry geo{Arch::kGdn, absl::GetFlag(FLAGS_layers), 16, 32, 128, 128};
  Model m{"qwen3.6-35b-a3b",
          Check(StateLayout::Identity(geo, Check(ParseFormatSpec(format), "format")), "layout")};
  m.prepared = Check(backend->Prepare(m.layout), "prepare");
  m.slots = Check(SlotPool::Create(backend, m.layout, 2), "slots");
  const std::vector<SlotHandle> handles = Check(m.slots->Allocate(2), "allocate");
  const int n = absl::GetFlag(FLAGS_checkpoints);
  Bench b{backend, &m};
  b.slot_bytes = m.layout.slot_bytes();
  b.host = std::make_shared<HostTier>(
      HostTier::Options{(n + 1) * b.slot_bytes, backend->pinned_memory()});
  b.ctx.backend = backend;
  HandleToProto(handles[0], &b.slot_a);
  HandleToProto(handles[1], &b.slot_b);
  b.index_b = Check(m.slots->Acquire({handles[1]}, "slot"), "acquire").indices()[0];
  for (int k = 0; k <= n + 1; ++k) b.patterns.push_back(Pattern(k, b.slot_bytes));

  // The single copy of exactly slot_bytes, for ratio_same_size.
  auto pinned = Check(backend->pinned_memory()->AllocatePinned(b.slot_bytes), "pinned");
  auto device = Check(backend->Allocate(b.slot_bytes), "device buffer");
  std::memcpy(pinned->data(), b.patterns[0].data(), b.slot_bytes);
  const Peak same = MeasurePeak(backend, raw, pinned->data(), device->data(), b.slot_bytes);

  struct Setup {
    const char* arena;
    bool inclusive;
  };
  for (const Setup setup : {Setup{"free", false}, Setup{"full", false}, Setup{"full", true}}) {
    const char* arena = setup.arena;
    b.inclusive = setup.inclusive;
    std::vector<double> lookup, restore, total;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      b.FillHostTier(n);
      if (arena == std::string("free")) {
        m.checkpoints.reset();
        m.checkpoints = b.Store(n);  // n free entries: no demotion
      }
      for (int k = 1; k <= n; ++k) {
        auto [l, r] = b.RestoreOne(k, StoreTier::kHost);
        lookup.push_back(l);
        restore.push_back(r);
        total.push_back(l + r);
      }
      m.checkpoints.reset();
    }
    const double gbps = b.slot_bytes / Median(total) / 1e9;
    std::printf(
        "RESTORE format=%s arena=%s host_write_through=%d slot_bytes=%lld restores=%zu "
        "lookup_ms=%.3f restore_ms=%.3f total_ms=%.3f gbps=%.2f ratio=%.3f ratio_same_size=%.3f "
        "host_chunks=%lld page_locked=%d result=%s\n",
        format.c_str(), arena, b.inclusive ? 1 : 0, static_cast<long long>(b.slot_bytes),
        total.size(),
        Median(lookup) * 1e3, Median(restore) * 1e3, Median(total) * 1e3, gbps, gbps / peak_gbps,
        gbps / same.single_gbps, static_cast<long long>(b.host->chunk_allocations()),
        backend->pinned_memory()->page_locked() ? 1 : 0, b.mismatch ? "MISMATCH" : "OK");
  }
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  SetLoggingEnabled(false);
  std::unique_ptr<Backend> backend =
      Check(CreateBackend(absl::GetFlag(FLAGS_backend)), "backend");
  std::printf("backend %s\n", backend->Describe().c_str());
  if (backend->pinned_memory() == nullptr) Check(absl::UnavailableError("no pinned memory"), "");
  std::vector<int64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes_mib), ',')) {
    int64_t mib = 0;
    if (!absl::SimpleAtoi(s, &mib) || mib < 1) Check(absl::InvalidArgumentError("sizes_mib"), "");
    sizes.push_back(mib << 20);
  }
  RawCopy raw(backend.get());
  double peak = 0;
  {
    const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
    auto pinned = Check(backend->pinned_memory()->AllocatePinned(largest), "pinned");
    auto device = Check(backend->Allocate(largest), "device buffer");
    std::memset(pinned->data(), 0x3c, static_cast<size_t>(largest));
    for (int64_t bytes : sizes) {
      peak = std::max(peak, MeasurePeak(backend.get(), raw, pinned->data(), device->data(), bytes)
                                .batched_gbps);
    }
  }
  std::printf("PEAK best_batched_gbps=%.2f\n", peak);
  for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_formats), ',')) {
    RunFormat(backend.get(), std::string(f), peak, raw);
  }
  return 0;
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) { return statecache::Main(argc, argv); }
