// Concurrent synchronous calls on the CUDA backend (issue 33): threads on
// disjoint slots run DecodeUpdate / Prefill / PackStates / CopySlots at once
// (each call on its own call context) and the pool bytes and every output
// equal the same calls run one after another; a failing call's error names
// its own field and leaves every other slot alone; an update ordered after
// work on the backend stream (Backend::native_stream) sees that work. Prints the
// per-call wall time of 1 thread vs 16 (CONCURRENCY line). Skips without a
// usable GPU (tagged gpu_only).
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/common/status_macros.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"
#include "kernels/cuda/testing/gpu_backend.h"

namespace statecache {
namespace {

constexpr int kThreads = 16;
constexpr int kSlotsPerThread = 4;
constexpr int kSlots = kThreads * kSlotsPerThread + 1;  // the last one: copy target scratch
const ModelGeometry kGeo{Arch::kGdn, /*layers=*/2, /*h_qk=*/2, /*h_v=*/4, 128, 128};

std::vector<float> Unit(std::mt19937& rng, int64_t rows, int d) {
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> x(rows * d);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int j = 0; j < d; ++j) s += double{x[r * d + j] = n(rng)} * x[r * d + j];
    for (int j = 0; j < d; ++j) x[r * d + j] /= static_cast<float>(std::sqrt(s));
  }
  return x;
}

// One thread's device inputs for `rows` token rows, and its o.
struct Inputs {
  std::unique_ptr<BackendBuffer> slots, q, k, v, g, beta, o;
  static Inputs Make(Backend& be, uint32_t seed, int64_t rows, std::vector<int32_t> slot_ids) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(0.05f, 0.95f);
    std::vector<float> q = Unit(rng, rows * kGeo.h_qk, kGeo.d_k),
                       k = Unit(rng, rows * kGeo.h_qk, kGeo.d_k);
    std::normal_distribution<float> n(0.f, 1.f);
    std::vector<float> v(rows * kGeo.h_v * kGeo.d_v), g(rows * kGeo.h_v), beta(rows * kGeo.h_v);
    for (float& x : v) x = n(rng);
    for (float& x : g) x = -0.3f * u(rng);
    for (float& x : beta) x = u(rng);
    Inputs in;
    auto up = [&](const void* host, int64_t bytes) {
      std::unique_ptr<BackendBuffer> b = be.Allocate(bytes).value();
      EXPECT_TRUE(be.CopyIn(b->data(), host, bytes).ok());
      return b;
    };
    in.slots = up(slot_ids.data(), slot_ids.size() * 4);
    in.q = up(q.data(), q.size() * 4);
    in.k = up(k.data(), k.size() * 4);
    in.v = up(v.data(), v.size() * 4);
    in.g = up(g.data(), g.size() * 4);
    in.beta = up(beta.data(), beta.size() * 4);
    in.o = be.Allocate(rows * kGeo.h_v * kGeo.d_v * 4).value();
    return in;
  }
  DecodeInputs Decode(int batch) const {
    DecodeInputs d;
    d.batch = batch;
    d.slots = reinterpret_cast<const int32_t*>(slots->data());
    d.q = q->data();
    d.k = k->data();
    d.v = v->data();
    d.g = reinterpret_cast<const float*>(g->data());
    d.beta = reinterpret_cast<const float*>(beta->data());
    d.o = reinterpret_cast<float*>(o->data());
    return d;
  }
};

class CudaConcurrencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STATECACHE_SKIP_WITHOUT_GPU();
    be_ = TestGpu().get();
    layout_.emplace(StateLayout::Identity(kGeo, ParseFormatSpec("damp:16").value()).value());
    model_ = be_->Prepare(*layout_).value();
  }
  PoolView NewPool(std::unique_ptr<BackendBuffer>* arena) {
    *arena = be_->Allocate(kSlots * layout_->slot_bytes()).value();
    PoolView p;
    p.base = (*arena)->data();
    p.num_slots = kSlots;
    p.layers = kGeo.layers;
    p.heads = kGeo.h_v;
    p.head_bytes = layout_->head_layout().head_bytes;
    return p;
  }
  std::string Bytes(const PoolView& p) {
    std::string s(p.num_slots * p.slot_bytes(), '\0');
    EXPECT_TRUE(be_->CopyOut(s.data(), p.base, s.size()).ok());
    return s;
  }

  // Thread t's sequence on `pool`: steps of decode (its slots one by one,
  // then all of them), a 3-token prefill of its first slot, a copy of its
  // first slot to its last; o bytes appended to *outs.
  absl::Status RunThread(const PoolView& pool, int t, int steps, std::string* outs) {
    std::vector<int32_t> mine;
    for (int i = 0; i < kSlotsPerThread; ++i) mine.push_back(t * kSlotsPerThread + i);
    for (int step = 0; step < steps; ++step) {
      for (int i = 0; i <= kSlotsPerThread; ++i) {
        std::vector<int32_t> ids = i < kSlotsPerThread ? std::vector<int32_t>{mine[i]} : mine;
        Inputs in = Inputs::Make(*be_, 7919 * t + 31 * step + i, ids.size(), ids);
        const DecodeInputs d = in.Decode(static_cast<int>(ids.size()));
        RETURN_IF_ERROR(be_->DecodeUpdate(*model_, pool, step % 2, d));
        std::string o(ids.size() * kGeo.h_v * kGeo.d_v * 4, '\0');
        RETURN_IF_ERROR(be_->CopyOut(o.data(), d.o, o.size()));
        outs->append(o);
      }
    }
    Inputs pre = Inputs::Make(*be_, 100 + t, 3, {mine[0]});
    PrefillInputs p;
    p.batch = 1;
    p.tokens = 3;
    const DecodeInputs d = pre.Decode(1);
    p.slots = d.slots;
    p.q = d.q;
    p.k = d.k;
    p.v = d.v;
    p.g = d.g;
    p.beta = d.beta;
    RETURN_IF_ERROR(be_->Prefill(*model_, pool, 1, p));
    std::unique_ptr<BackendBuffer> src = be_->Allocate(4).value(), dst = be_->Allocate(4).value();
    RETURN_IF_ERROR(be_->CopyIn(src->data(), &mine[0], 4));
    RETURN_IF_ERROR(be_->CopyIn(dst->data(), &mine[kSlotsPerThread - 1], 4));
    return be_->CopySlots(pool, reinterpret_cast<int32_t*>(src->data()), pool,
                          reinterpret_cast<int32_t*>(dst->data()), 1);
  }

  Backend* be_ = nullptr;
  std::optional<StateLayout> layout_;
  std::unique_ptr<PreparedModel> model_;
};

TEST_F(CudaConcurrencyTest, DisjointSlotsConcurrentlyEqualSerialBytes) {
  constexpr int kSteps = 6;
  std::unique_ptr<BackendBuffer> a, b;
  const PoolView live = NewPool(&a), serial = NewPool(&b);
  std::vector<std::string> outs(kThreads), serial_outs(kThreads);
  std::vector<absl::Status> status(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] { status[t] = RunThread(live, t, kSteps, &outs[t]); });
  }
  // Meanwhile a call with a bad slot (the scratch slot's neighbour out of
  // range) fails with its own message and writes nothing.
  std::vector<int32_t> bad = {kSlots - 1, kSlots + 5};
  Inputs in = Inputs::Make(*be_, 4242, 2, bad);
  const absl::Status st = be_->DecodeUpdate(*model_, live, 0, in.Decode(2));
  for (auto& th : threads) th.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("slots[1]"), std::string::npos) << st;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(status[t].ok()) << "thread " << t << ": " << status[t];
    ASSERT_TRUE(RunThread(serial, t, kSteps, &serial_outs[t]).ok());
    EXPECT_EQ(outs[t], serial_outs[t]) << "outputs of thread " << t;
  }
  EXPECT_EQ(Bytes(live), Bytes(serial));  // the scratch slot stayed zero in both
  absl::StatusOr<int64_t> contexts = CudaCallContexts(*be_);
  ASSERT_TRUE(contexts.ok());
  EXPECT_GT(*contexts, 1) << "no two calls ever ran at once";
}

TEST_F(CudaConcurrencyTest, CallsAreOrderedAfterTheBackendStream) {
  // An unchecked decode enqueued on the backend stream, then (without a
  // host wait) a validated decode of the same slot: the second must see the
  // first's state, as serially.
  std::unique_ptr<BackendBuffer> a, b;
  const PoolView p1 = NewPool(&a), p2 = NewPool(&b);
  Inputs first = Inputs::Make(*be_, 1, 1, {3}), second = Inputs::Make(*be_, 2, 1, {3});
  ASSERT_TRUE(CudaEnqueueDecodeUnchecked(*be_, *model_, p1, 0, first.Decode(1)).ok());
  ASSERT_TRUE(be_->DecodeUpdate(*model_, p1, 0, second.Decode(1)).ok());
  ASSERT_TRUE(CudaSynchronize(*be_).ok());
  ASSERT_TRUE(be_->DecodeUpdate(*model_, p2, 0, first.Decode(1)).ok());
  ASSERT_TRUE(be_->DecodeUpdate(*model_, p2, 0, second.Decode(1)).ok());
  EXPECT_EQ(Bytes(p1), Bytes(p2));
}

TEST_F(CudaConcurrencyTest, ThroughputOfOneVsManyThreads) {
  // Batch-1 decodes of 4 heads (~3 us of GPU work each): the synchronous
  // path's per-call cost, alone and with 16 threads at once.
  constexpr int kCalls = 4000;
  std::unique_ptr<BackendBuffer> a;
  const PoolView pool = NewPool(&a);
  std::vector<Inputs> inputs;
  for (int t = 0; t < kThreads; ++t) inputs.push_back(Inputs::Make(*be_, t, 1, {t}));
  auto run = [&](int threads) {
    std::vector<std::thread> ts;
    std::atomic<int> failed{0};
    const absl::Time start = absl::Now();
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        for (int i = 0; i < kCalls / threads; ++i) {
          if (!be_->DecodeUpdate(*model_, pool, 0, inputs[t].Decode(1)).ok()) ++failed;
        }
      });
    }
    for (auto& th : ts) th.join();
    EXPECT_EQ(failed.load(), 0);
    return absl::ToDoubleMicroseconds(absl::Now() - start) / kCalls;
  };
  run(kThreads);  // warm-up: contexts exist
  const double one = run(1), many = run(kThreads);
  std::printf("CONCURRENCY calls=%d us_per_call_1_thread=%.2f us_per_call_%d_threads=%.2f "
              "speedup=%.2f contexts=%lld\n",
              kCalls, one, kThreads, many, one / many,
              static_cast<long long>(CudaCallContexts(*be_).value()));
  EXPECT_LT(many, one) << "16 threads were not faster than 1";
}


TEST_F(CudaConcurrencyTest, StagedDecodeEqualsCopiesAndDecode) {
  // DecodeUpdateStaged (copy in + update + copy out, one wait) against
  // CopyIn + DecodeUpdate + CopyOut: same pool bytes and o; a bad beta is
  // the binding's error and writes nothing.
  std::unique_ptr<BackendBuffer> a, b;
  const PoolView p1 = NewPool(&a), p2 = NewPool(&b);
  const int64_t in_floats = 2 * kGeo.h_qk * kGeo.d_k + kGeo.h_v * kGeo.d_v + 2 * kGeo.h_v;
  for (int step = 0; step < 4; ++step) {
    std::mt19937 rng(step);
    std::vector<float> host = Unit(rng, 1, static_cast<int>(in_floats));
    // q, k, v from the unit row (finite, small); g <= 0 and beta in (0, 1).
    for (int h = 0; h < kGeo.h_v; ++h) {
      host[in_floats - 2 * kGeo.h_v + h] = -0.1f * (h + 1);
      host[in_floats - kGeo.h_v + h] = 0.2f * (h + 1);
    }
    int32_t slot = 5;
    std::vector<uint8_t> packed(4096 + in_floats * 4);
    std::memcpy(packed.data(), &slot, 4);
    std::memcpy(packed.data() + 256, host.data(), in_floats * 4);
    std::unique_ptr<BackendBuffer> staged = be_->Allocate(packed.size() + 4096).value();
    uint8_t* base = staged->data();
    DecodeInputs d;
    d.batch = 1;
    d.slots = reinterpret_cast<const int32_t*>(base);
    d.q = base + 256;
    d.k = base + 256 + kGeo.h_qk * kGeo.d_k * 4;
    d.v = base + 256 + 2 * kGeo.h_qk * kGeo.d_k * 4;
    d.g = reinterpret_cast<const float*>(base + 256 + (in_floats - 2 * kGeo.h_v) * 4);
    d.beta = reinterpret_cast<const float*>(base + 256 + (in_floats - kGeo.h_v) * 4);
    d.o = reinterpret_cast<float*>(base + packed.size());
    const int64_t o_bytes = kGeo.h_v * kGeo.d_v * 4;
    std::vector<float> o1(o_bytes / 4), o2(o_bytes / 4);
    ASSERT_TRUE(be_->DecodeUpdateStaged(*model_, p1, step % 2, d, base, packed.data(),
                                        packed.size(), o1.data(), o_bytes)
                    .ok());
    ASSERT_TRUE(be_->CopyIn(base, packed.data(), packed.size()).ok());
    ASSERT_TRUE(be_->DecodeUpdate(*model_, p2, step % 2, d).ok());
    ASSERT_TRUE(be_->CopyOut(o2.data(), d.o, o_bytes).ok());
    EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o_bytes)) << step;
    if (step == 3) {
      const std::string before = Bytes(p1);
      const float bad_beta = 7.f;
      std::memcpy(packed.data() + 256 + (in_floats - kGeo.h_v + 2) * 4, &bad_beta, 4);
      absl::Status st = be_->DecodeUpdateStaged(*model_, p1, 0, d, base, packed.data(),
                                                packed.size(), o1.data(), o_bytes);
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_NE(st.message().find("beta[2]"), std::string::npos) << st;
      EXPECT_EQ(Bytes(p1), before);
    }
  }
  EXPECT_EQ(Bytes(p1), Bytes(p2));
}

}  // namespace
}  // namespace statecache
