// UpdateCoalescer on the CPU backend: merged launches give the same bytes
// (states and o) as the calls run one by one; a merged launch that fails
// validation falls back to per-call verdicts; keys do not mix.
#include "server/core/update_coalescer.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"
#include "server/core/host_update.h"
#include "server/pool/staging_cache.h"

namespace statecache {
namespace {

const ModelGeometry kGeo{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};

// Inputs of one call on one slot (FP32, q / k unit rows).
struct Call {
  int32_t slot = 0;
  std::vector<float> q, k, v, g, beta, o;
  HostUpdate update() {
    HostUpdate u;
    u.batch = 1;
    u.slots = &slot;
    u.q = q.data();
    u.k = k.data();
    u.v = v.data();
    u.g = g.data();
    u.beta = beta.data();
    u.o = o.data();
    return u;
  }
};

Call MakeCall(int32_t slot, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.05f, 0.95f);
  Call c;
  c.slot = slot;
  auto unit = [&](std::vector<float>* x, int dim) {
    x->resize(dim);
    double s = 0;
    for (float& e : *x) {
      e = n(rng);
      s += double{e} * e;
    }
    for (float& e : *x) e /= static_cast<float>(std::sqrt(s));
  };
  unit(&c.q, kGeo.h_qk * kGeo.d_k);
  unit(&c.k, kGeo.h_qk * kGeo.d_k);
  c.v.resize(kGeo.h_v * kGeo.d_v);
  for (float& e : c.v) e = n(rng);
  c.g.resize(kGeo.h_v);
  for (float& e : c.g) e = -0.3f * u(rng);
  c.beta.resize(kGeo.h_v);
  for (float& e : c.beta) e = u(rng);
  c.o.assign(kGeo.h_v * kGeo.d_v, -1.f);
  return c;
}

class CoalescerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = CpuBackend::Create({/*threads=*/2});
    layout_.emplace(StateLayout::Identity(kGeo, ParseFormatSpec("damp:8").value()).value());
    model_ = backend_->Prepare(*layout_).value();
    arena_ = backend_->Allocate(kSlots * layout_->slot_bytes()).value();
    reference_ = backend_->Allocate(kSlots * layout_->slot_bytes()).value();
    pool_ = View(*arena_);
  }
  PoolView View(const BackendBuffer& b) const {
    PoolView p;
    p.base = b.data();
    p.num_slots = kSlots;
    p.layers = kGeo.layers;
    p.heads = kGeo.h_v;
    p.head_bytes = layout_->head_layout().head_bytes;
    return p;
  }
  std::string Bytes(const BackendBuffer& b) const {
    return std::string(reinterpret_cast<const char*>(b.data()), kSlots * layout_->slot_bytes());
  }

  static constexpr int kSlots = 8;
  std::unique_ptr<Backend> backend_;
  std::optional<StateLayout> layout_;
  std::unique_ptr<PreparedModel> model_;
  std::unique_ptr<BackendBuffer> arena_, reference_;
  PoolView pool_;
};

TEST_F(CoalescerTest, ConcurrentCallsMergeAndMatchSerialBytes) {
  StagingCache staging(backend_.get(), 1 << 20);
  // Waits until all kSlots calls are queued: one launch per round.
  UpdateCoalescer c(backend_.get(), &staging, {/*max_batch=*/kSlots, absl::Seconds(10)});
  constexpr int kRounds = 5;
  std::vector<std::vector<Call>> calls(kRounds);
  for (int r = 0; r < kRounds; ++r) {
    for (int s = 0; s < kSlots; ++s) calls[r].push_back(MakeCall(s, 1000 * r + s));
  }
  for (int r = 0; r < kRounds; ++r) {
    std::vector<std::thread> threads;
    std::vector<UpdateCoalescer::Launch> launches(kSlots);
    std::vector<absl::Status> status(kSlots);
    for (int s = 0; s < kSlots; ++s) {
      threads.emplace_back([&, s] {
        HostUpdate u = calls[r][s].update();
        status[s] = c.Run(*model_, pool_, /*layer=*/r % 2, u, &launches[s]);
      });
    }
    for (auto& t : threads) t.join();
    int leaders = 0;
    for (int s = 0; s < kSlots; ++s) {
      EXPECT_TRUE(status[s].ok()) << status[s];
      EXPECT_EQ(launches[s].batch, kSlots);
      EXPECT_EQ(launches[s].calls, kSlots);
      leaders += launches[s].leader;
    }
    EXPECT_EQ(leaders, 1);
  }
  EXPECT_EQ(c.launches(), kRounds);
  EXPECT_EQ(c.calls(), kRounds * kSlots);
  // The same calls one by one on a second arena.
  const PoolView ref = View(*reference_);
  for (int r = 0; r < kRounds; ++r) {
    for (int s = 0; s < kSlots; ++s) {
      Call one = MakeCall(s, 1000 * r + s);
      double seconds = 0;
      HostUpdate u = one.update();
      ASSERT_TRUE(RunHostUpdate(*backend_, staging, *model_, ref, r % 2, u, &seconds).ok());
      EXPECT_EQ(0, std::memcmp(one.o.data(), calls[r][s].o.data(), one.o.size() * 4))
          << "o of round " << r << " slot " << s;
    }
  }
  EXPECT_EQ(Bytes(*arena_), Bytes(*reference_));
}

TEST_F(CoalescerTest, MergedValidationFailureGivesEachCallItsOwnVerdict) {
  StagingCache staging(backend_.get(), 1 << 20);
  UpdateCoalescer c(backend_.get(), &staging, {/*max_batch=*/4, absl::Seconds(10)});
  std::vector<Call> calls;
  for (int s = 0; s < 4; ++s) calls.push_back(MakeCall(s, 7 + s));
  calls[2].v[5] = std::nanf("");  // the backend rejects the merged batch (v[...])
  const std::string before = Bytes(*arena_);
  std::vector<absl::Status> status(4);
  std::vector<std::thread> threads;
  for (int s = 0; s < 4; ++s) {
    threads.emplace_back([&, s] {
      HostUpdate u = calls[s].update();
      UpdateCoalescer::Launch launch;
      status[s] = c.Run(*model_, pool_, 0, u, &launch);
    });
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < 4; ++s) {
    if (s == 2) {
      EXPECT_EQ(status[s].code(), absl::StatusCode::kInvalidArgument) << status[s];
      EXPECT_NE(status[s].message().find("v["), std::string::npos) << status[s];
    } else {
      EXPECT_TRUE(status[s].ok()) << s << ": " << status[s];
    }
  }
  // Slot 2 untouched; the others equal their calls run alone.
  const PoolView ref = View(*reference_);
  for (int s = 0; s < 4; ++s) {
    if (s == 2) continue;
    Call one = MakeCall(s, 7 + s);
    double seconds = 0;
    HostUpdate u = one.update();
    ASSERT_TRUE(RunHostUpdate(*backend_, staging, *model_, ref, 0, u, &seconds).ok());
    EXPECT_EQ(0, std::memcmp(one.o.data(), calls[s].o.data(), one.o.size() * 4)) << s;
  }
  EXPECT_EQ(Bytes(*arena_), Bytes(*reference_));
  EXPECT_NE(Bytes(*arena_), before);
}

TEST_F(CoalescerTest, DifferentLayersDoNotMerge) {
  StagingCache staging(backend_.get(), 1 << 20);
  // A short wait: each layer's leader gives up waiting for a full batch.
  UpdateCoalescer c(backend_.get(), &staging, {/*max_batch=*/8, absl::Milliseconds(50)});
  std::vector<Call> calls;
  for (int s = 0; s < 2; ++s) calls.push_back(MakeCall(s, 40 + s));
  std::vector<UpdateCoalescer::Launch> launches(2);
  std::vector<std::thread> threads;
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&, s] {
      HostUpdate u = calls[s].update();
      EXPECT_TRUE(c.Run(*model_, pool_, /*layer=*/s, u, &launches[s]).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.launches(), 2);
  EXPECT_EQ(launches[0].batch, 1);
  EXPECT_EQ(launches[1].batch, 1);
}

TEST_F(CoalescerTest, LoneCallLaunchesAtOnce) {
  StagingCache staging(backend_.get(), 1 << 20);
  UpdateCoalescer c(backend_.get(), &staging, {/*max_batch=*/8, absl::ZeroDuration()});
  Call one = MakeCall(3, 99);
  HostUpdate u = one.update();
  UpdateCoalescer::Launch launch;
  ASSERT_TRUE(c.Run(*model_, pool_, 1, u, &launch).ok());
  EXPECT_TRUE(launch.leader);
  EXPECT_EQ(launch.batch, 1);
  EXPECT_EQ(c.launches(), 1);
  EXPECT_NE(one.o[0], -1.f);  // o written
}

// Many threads, many rounds, no wait: whatever merges happen, the bytes
// equal the serial run (the TSan target of the coalescer).
TEST_F(CoalescerTest, FreeRunningThreadsMatchSerialBytes) {
  StagingCache staging(backend_.get(), 1 << 20);
  UpdateCoalescer c(backend_.get(), &staging, {/*max_batch=*/3, absl::ZeroDuration()});
  constexpr int kSteps = 30;
  std::vector<std::thread> threads;
  std::vector<uint64_t> digest(kSlots, 0);
  for (int s = 0; s < kSlots; ++s) {
    threads.emplace_back([&, s] {
      for (int i = 0; i < kSteps; ++i) {
        Call call = MakeCall(s, 5000 + 100 * i + s);
        HostUpdate u = call.update();
        UpdateCoalescer::Launch launch;
        absl::Status st = c.Run(*model_, pool_, i % 2, u, &launch);
        EXPECT_TRUE(st.ok()) << st;
        for (float x : call.o) {
          uint32_t bits;
          std::memcpy(&bits, &x, 4);
          digest[s] = digest[s] * 1099511628211ull ^ bits;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.calls(), kSlots * kSteps);
  const PoolView ref = View(*reference_);
  for (int s = 0; s < kSlots; ++s) {
    uint64_t d = 0;
    for (int i = 0; i < kSteps; ++i) {
      Call call = MakeCall(s, 5000 + 100 * i + s);
      HostUpdate u = call.update();
      double seconds = 0;
      ASSERT_TRUE(RunHostUpdate(*backend_, staging, *model_, ref, i % 2, u, &seconds).ok());
      for (float x : call.o) {
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        d = d * 1099511628211ull ^ bits;
      }
    }
    EXPECT_EQ(d, digest[s]) << "slot " << s;
  }
  EXPECT_EQ(Bytes(*arena_), Bytes(*reference_));
}


// The CPU backend seen as a device backend (host_memory() false): the
// staged path of RunHostUpdate (inputs packed into one host staging block,
// one DecodeUpdateStaged, o copied out of that block) runs on it.
class StagedCpu : public Backend {
 public:
  explicit StagedCpu(Backend* cpu) : cpu_(cpu) {}
  const char* name() const override { return "staged-cpu"; }
  std::string Describe() const override { return "cpu without host_memory"; }
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(int64_t bytes) override {
    ++allocations;
    return cpu_->Allocate(bytes);
  }
  absl::StatusOr<int64_t> AvailableBytes() const override { return cpu_->AvailableBytes(); }
  absl::Status CopyIn(void* d, const void* s, int64_t n) override {
    ++copies_in;
    return cpu_->CopyIn(d, s, n);
  }
  absl::Status CopyOut(void* d, const void* s, int64_t n) override { return cpu_->CopyOut(d, s, n); }
  absl::StatusOr<std::unique_ptr<PreparedModel>> Prepare(const StateLayout& l) override {
    return cpu_->Prepare(l);
  }
  absl::Status DecodeUpdate(const PreparedModel& m, const PoolView& p, int layer,
                            const DecodeInputs& in) override {
    return cpu_->DecodeUpdate(m, p, layer, in);
  }
  absl::Status Prefill(const PreparedModel& m, const PoolView& p, int layer,
                       const PrefillInputs& in) override {
    return cpu_->Prefill(m, p, layer, in);
  }
  absl::Status PackStates(const PreparedModel& m, const PoolView& p, const int32_t* s, int n,
                          const float* x) override {
    return cpu_->PackStates(m, p, s, n, x);
  }
  absl::Status UnpackStates(const PreparedModel& m, const PoolView& p, const int32_t* s, int n,
                            float* x) override {
    return cpu_->UnpackStates(m, p, s, n, x);
  }
  absl::Status CopySlots(const PoolView& a, const int32_t* as, const PoolView& b, const int32_t* bs,
                         int n) override {
    return cpu_->CopySlots(a, as, b, bs, n);
  }
  absl::Status ZeroSlots(const PoolView& p, const int32_t* s, int n) override {
    return cpu_->ZeroSlots(p, s, n);
  }
  StreamOps& stream_ops() override { return cpu_->stream_ops(); }
  int allocations = 0, copies_in = 0;

 private:
  Backend* cpu_;
};

TEST_F(CoalescerTest, StagedPathEqualsInPlaceBytes) {
  StagedCpu staged(backend_.get());
  StagingCache staged_cache(&staged, 1 << 20), cache(backend_.get(), 1 << 20);
  const PoolView ref = View(*reference_);
  UpdatePhases staged_phases, in_place_phases;
  for (int i = 0; i < 6; ++i) {
    Call a = MakeCall(i % kSlots, 300 + i), b = MakeCall(i % kSlots, 300 + i);
    HostUpdate ua = a.update(), ub = b.update();
    double seconds = 0;
    ASSERT_TRUE(RunHostUpdate(staged, staged_cache, *model_, pool_, i % 2, ua, &seconds,
                              &staged_phases)
                    .ok());
    ASSERT_TRUE(
        RunHostUpdate(*backend_, cache, *model_, ref, i % 2, ub, &seconds, &in_place_phases).ok());
    EXPECT_EQ(0, std::memcmp(a.o.data(), b.o.data(), a.o.size() * 4)) << i;
  }
  EXPECT_EQ(Bytes(*arena_), Bytes(*reference_));
  EXPECT_EQ(staged.copies_in, 6);    // one packed copy per update
  EXPECT_EQ(staged.allocations, 1);  // the staging buffer was reused
  EXPECT_EQ(staged_cache.allocations(), 2);  // + one host staging block, reused
  for (UpdatePhases::Phase p : {UpdatePhases::kStage, UpdatePhases::kBackend,
                                UpdatePhases::kCopyOut}) {
    EXPECT_EQ(staged_phases.Calls(p), 6) << UpdatePhases::Name(p);
  }
  EXPECT_EQ(in_place_phases.Calls(UpdatePhases::kBackend), 6);
  EXPECT_EQ(in_place_phases.Calls(UpdatePhases::kStage), 0);  // nothing staged in place
  EXPECT_EQ(in_place_phases.Calls(UpdatePhases::kCopyOut), 0);
  // A bad input through the staged path: the binding's error, nothing written.
  Call bad = MakeCall(1, 999);
  bad.beta[1] = 7.f;
  HostUpdate u = bad.update();
  double seconds = 0;
  const std::string before = Bytes(*arena_);
  absl::Status st = RunHostUpdate(staged, staged_cache, *model_, pool_, 0, u, &seconds);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("beta[1]"), std::string::npos) << st;
  EXPECT_EQ(Bytes(*arena_), before);
}

}  // namespace
}  // namespace statecache
