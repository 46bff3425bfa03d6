// The CUDA backend's DecodeQueue (the asynchronous SubmitUpdates path, issue
// 10) against its synchronous DecodeUpdate: bytes and outputs identical,
// callbacks in enqueue order with the right status and field name, a failing
// update in the middle writes nothing (its o, its slots) while the others
// proceed, the epilogue's done word (stream_wait::StreamStoreWord, as the
// server uses it) reaches the last seq, the host never waits (enqueue returns
// while the queue's stream is held by a device-side wait) and a held queue
// does not block the backend's synchronous calls; the server's ring gate
// (release and abort). Skips (GTEST_SKIP) without
// a usable GPU; gpu_only. Runs in tests/dataplane/device_run.sh.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"
#include "kernels/cuda/testing/gpu_backend.h"
#include "kernels/cuda_ipc/stream_wait.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kB = 3;
constexpr int kSlots = 4;  // slot 3 is never in a batch

ModelGeometry Geo() {
  ModelGeometry g;
  g.arch = Arch::kGdn;
  g.layers = 2;
  g.h_qk = 2;
  g.h_v = 4;
  g.d_k = 128;
  g.d_v = 128;
  return g;
}

std::unique_ptr<BackendBuffer> Upload(const void* host, int64_t bytes) {
  auto b = TestGpu()->Allocate(bytes).value();
  EXPECT_TRUE(TestGpu()->CopyIn(b->data(), host, bytes).ok());
  return b;
}
template <typename T>
std::vector<T> Download(const BackendBuffer& b, size_t n) {
  std::vector<T> out(n);
  EXPECT_TRUE(TestGpu()->CopyOut(out.data(), b.data(), n * sizeof(T)).ok());
  return out;
}

// One step's inputs, on the device.
struct Step {
  std::unique_ptr<BackendBuffer> q, k, v, g, beta, o;
};

Step MakeStep(std::mt19937* rng, bool nan_in_v = false) {
  const ModelGeometry geo = Geo();
  std::normal_distribution<float> n(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.05f, 0.95f);
  auto unit_rows = [&](int rows, int d) {
    std::vector<float> x(static_cast<size_t>(rows) * d);
    for (int r = 0; r < rows; ++r) {
      double norm = 0;
      for (int i = 0; i < d; ++i) norm += std::pow(x[r * d + i] = n(*rng), 2);
      for (int i = 0; i < d; ++i) x[r * d + i] /= static_cast<float>(std::sqrt(norm));
    }
    return x;
  };
  const std::vector<float> q = unit_rows(kB * geo.h_qk, geo.d_k);
  const std::vector<float> k = unit_rows(kB * geo.h_qk, geo.d_k);
  std::vector<float> v(kB * geo.h_v * geo.d_v), g(kB * geo.h_v), beta(kB * geo.h_v);
  for (float& x : v) x = n(*rng);
  for (float& x : g) x = -u(*rng);
  for (float& x : beta) x = u(*rng);
  if (nan_in_v) v[77] = std::nanf("");
  Step s;
  s.q = Upload(q.data(), q.size() * 4);
  s.k = Upload(k.data(), k.size() * 4);
  s.v = Upload(v.data(), v.size() * 4);
  s.g = Upload(g.data(), g.size() * 4);
  s.beta = Upload(beta.data(), beta.size() * 4);
  s.o = TestGpu()->Allocate(int64_t{kB} * geo.h_v * geo.d_v * 4).value();
  return s;
}

DecodeInputs Inputs(const Step& s, const int32_t* slots) {
  DecodeInputs in;
  in.batch = kB;
  in.slots = slots;
  in.q = s.q->data();
  in.k = s.k->data();
  in.v = s.v->data();
  in.g = reinterpret_cast<const float*>(s.g->data());
  in.beta = reinterpret_cast<const float*>(s.beta->data());
  in.o = reinterpret_cast<float*>(s.o->data());
  return in;
}

// A pool of kSlots on the device.
struct Pool {
  std::unique_ptr<BackendBuffer> arena;
  PoolView view;
  explicit Pool(const StateLayout& layout) {
    arena = TestGpu()->Allocate(kSlots * layout.slot_bytes()).value();
    view.base = arena->data();
    view.num_slots = kSlots;
    view.layers = Geo().layers;
    view.heads = Geo().h_v;
    view.head_bytes = layout.head_layout().head_bytes;
  }
  std::vector<uint8_t> Bytes() const {
    return Download<uint8_t>(*arena, static_cast<size_t>(kSlots * view.slot_bytes()));
  }
  std::vector<uint8_t> Slot(int i) const {
    const std::vector<uint8_t> all = Bytes();
    return std::vector<uint8_t>(all.begin() + i * view.slot_bytes(),
                                all.begin() + (i + 1) * view.slot_bytes());
  }
};

class CudaQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (TestGpu() == nullptr) return;
    layout_ = std::make_unique<StateLayout>(
        *StateLayout::Identity(Geo(), *ParseFormatSpec("damp:16")));
    prepared_ = TestGpu()->Prepare(*layout_).value();
    const std::vector<int32_t> slots = {0, 1, 2};
    slots_ = Upload(slots.data(), slots.size() * 4);
    const std::vector<int32_t> dup = {0, 1, 0};
    dup_slots_ = Upload(dup.data(), dup.size() * 4);
  }
  const int32_t* slots() const { return reinterpret_cast<const int32_t*>(slots_->data()); }

  std::unique_ptr<StateLayout> layout_;
  std::unique_ptr<PreparedModel> prepared_;
  std::unique_ptr<BackendBuffer> slots_, dup_slots_;
};

// Callback record: (seq, status) in the order callbacks ran.
struct Record {
  absl::Mutex mu;
  std::vector<std::pair<int, absl::Status>> done ABSL_GUARDED_BY(mu);
  DecodeQueue::Done For(int seq) {
    return [this, seq](absl::Status s) {
      absl::MutexLock lock(&mu);
      done.emplace_back(seq, std::move(s));
    };
  }
  size_t size() {
    absl::MutexLock lock(&mu);
    return done.size();
  }
};

TEST_F(CudaQueueTest, InOrderIdenticalToSyncAndAFailingUpdateWritesNothing) {
  STATECACHE_SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  constexpr int kSteps = 6;
  constexpr int kBad = 3;  // seq 4: NaN in v
  std::vector<Step> steps;
  for (int i = 0; i < kSteps; ++i) steps.push_back(MakeStep(&rng, i == kBad));
  std::vector<Step> ref_steps;  // same inputs for the synchronous reference
  std::mt19937 rng2(17);
  for (int i = 0; i < kSteps; ++i) ref_steps.push_back(MakeStep(&rng2, i == kBad));

  Pool pool(*layout_), ref(*layout_);
  auto done_word = TestGpu()->Allocate(8).value();
  auto queue = TestGpu()->NewDecodeQueue();
  ASSERT_TRUE(queue.ok()) << queue.status();
  Record rec;
  for (int i = 0; i < kSteps; ++i) {
    const uint64_t seq = i + 1;
    ASSERT_TRUE((*queue)
                    ->EnqueueDecodeUpdate(
                        *prepared_, pool.view, i % 2, Inputs(steps[i], slots()), nullptr,
                        [&done_word, seq](void* stream) {
                          int rc = stream_wait::StreamStoreWord(stream, done_word->data(), seq);
                          return rc == 0 ? absl::OkStatus()
                                         : absl::InternalError("store the done word");
                        },
                        rec.For(seq))
                    .ok());
  }
  (*queue)->Drain();
  {
    absl::MutexLock lock(&rec.mu);
    ASSERT_EQ(rec.done.size(), static_cast<size_t>(kSteps));
    for (int i = 0; i < kSteps; ++i) {
      EXPECT_EQ(rec.done[i].first, i + 1);
      if (i == kBad) {
        EXPECT_EQ(rec.done[i].second.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(std::string(rec.done[i].second.message()), StartsWith("v[77]: is not finite"));
      } else {
        EXPECT_TRUE(rec.done[i].second.ok()) << i << ": " << rec.done[i].second;
      }
    }
  }
  EXPECT_EQ(Download<uint64_t>(*done_word, 1)[0], static_cast<uint64_t>(kSteps));
  // Reference: synchronous calls; the bad one fails there too.
  for (int i = 0; i < kSteps; ++i) {
    absl::Status s = TestGpu()->DecodeUpdate(*prepared_, ref.view, i % 2, Inputs(ref_steps[i], slots()));
    EXPECT_EQ(s.ok(), i != kBad) << s;
  }
  const size_t o_count = static_cast<size_t>(kB) * Geo().h_v * Geo().d_v;
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(Download<float>(*steps[i].o, o_count), Download<float>(*ref_steps[i].o, o_count))
        << "o of step " << i;
  }
  EXPECT_EQ(Download<float>(*steps[kBad].o, o_count), std::vector<float>(o_count, 0.f));
  EXPECT_EQ(pool.Bytes(), ref.Bytes());
  EXPECT_EQ(pool.Slot(3), std::vector<uint8_t>(pool.view.slot_bytes(), 0));
  EXPECT_NE(pool.Slot(0), std::vector<uint8_t>(pool.view.slot_bytes(), 0));
}

TEST_F(CudaQueueTest, SlotErrorsAndHostChecks) {
  STATECACHE_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  Step s = MakeStep(&rng);
  Pool pool(*layout_);
  auto queue = TestGpu()->NewDecodeQueue();
  ASSERT_TRUE(queue.ok()) << queue.status();
  Record rec;
  // Host check: nothing enqueued, no callback.
  DecodeInputs no_o = Inputs(s, slots());
  no_o.o = nullptr;
  absl::Status host = (*queue)->EnqueueDecodeUpdate(*prepared_, pool.view, 0, no_o, nullptr,
                                                    nullptr, rec.For(1));
  EXPECT_EQ(host.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(host.message(), "o: null");
  absl::Status layer = (*queue)->EnqueueDecodeUpdate(
      *prepared_, pool.view, 2, Inputs(s, slots()), nullptr, nullptr, rec.For(2));
  EXPECT_EQ(layer.code(), absl::StatusCode::kInvalidArgument);
  // Device check: duplicate slot.
  ASSERT_TRUE((*queue)
                  ->EnqueueDecodeUpdate(*prepared_, pool.view, 0,
                                        Inputs(s, reinterpret_cast<const int32_t*>(
                                                      dup_slots_->data())),
                                        nullptr, nullptr, rec.For(3))
                  .ok());
  ASSERT_TRUE((*queue)->EnqueueCompletion(nullptr, rec.For(4)).ok());
  (*queue)->Drain();
  absl::MutexLock lock(&rec.mu);
  ASSERT_EQ(rec.done.size(), 2u);
  EXPECT_EQ(rec.done[0].first, 3);
  EXPECT_EQ(rec.done[0].second.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rec.done[0].second.message(), "slots[2]: slot 0 appears twice in one batch");
  EXPECT_EQ(rec.done[1].first, 4);
  EXPECT_TRUE(rec.done[1].second.ok());
  EXPECT_EQ(pool.Bytes(), std::vector<uint8_t>(kSlots * pool.view.slot_bytes(), 0));
}

TEST_F(CudaQueueTest, HostNeverWaitsAndAHeldQueueBlocksNoOtherWork) {
  STATECACHE_SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  std::vector<Step> steps;
  for (int i = 0; i < 3; ++i) steps.push_back(MakeStep(&rng));
  Step other = MakeStep(&rng);
  Pool pool(*layout_), other_pool(*layout_);
  uint32_t* words = nullptr;  // host memory: released without a CUDA call
  ASSERT_EQ(stream_wait::AllocGateWords(&words), 0);
  auto queue = TestGpu()->NewDecodeQueue();
  ASSERT_TRUE(queue.ok()) << queue.status();
  // Warm the synchronous path (its bitmap allocation) first.
  ASSERT_TRUE(TestGpu()->DecodeUpdate(*prepared_, other_pool.view, 0, Inputs(other, slots())).ok());
  Record rec;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    // The first update's stream waits on the device for words[0] >= 1 (as
    // for a worker's ring event that has not fired yet).
    DecodeQueue::Prologue gate;
    if (i == 0) {
      gate = [words](void* stream, void* abort_word) {
        return stream_wait::StreamGate(stream, words, 1, abort_word) == 0
                   ? absl::OkStatus()
                   : absl::InternalError("gate");
      };
    }
    ASSERT_TRUE((*queue)
                    ->EnqueueDecodeUpdate(*prepared_, pool.view, i % 2, Inputs(steps[i], slots()),
                                          gate, nullptr, rec.For(i + 1))
                    .ok());
  }
  const double enqueue_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(enqueue_ms, 500.0);
  // Other work on the backend's own stream proceeds while the queue waits.
  EXPECT_TRUE(TestGpu()->DecodeUpdate(*prepared_, other_pool.view, 1, Inputs(other, slots())).ok());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(rec.size(), 0u);  // nothing completed: the gate holds the stream
  EXPECT_EQ(pool.Bytes(), std::vector<uint8_t>(kSlots * pool.view.slot_bytes(), 0));
  // Diagnostic (not a check): does freeing device memory block while a
  // queue's stream waits on the device? (cudaFree may synchronize the device.)
  {
    std::atomic<bool> freed{false};
    std::thread t([&] {
      auto b = TestGpu()->Allocate(1 << 20);
      b->reset();
      freed = true;
    });
    for (int i = 0; i < 40 && !freed.load(); ++i) absl::SleepFor(absl::Milliseconds(50));
    std::printf("DIAG allocate+free while a queue waits on the device: %s\n",
                freed.load() ? "returned" : "BLOCKED (>= 2 s)");
    std::fflush(stdout);
    __atomic_store_n(&words[0], 1u, __ATOMIC_SEQ_CST);  // release
    t.join();
  }
  (*queue)->Drain();
  queue->reset();
  EXPECT_EQ(stream_wait::FreeGateWords(words), 0);
  absl::MutexLock lock(&rec.mu);
  ASSERT_EQ(rec.done.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rec.done[i].first, i + 1);
    EXPECT_TRUE(rec.done[i].second.ok()) << rec.done[i].second;
  }
  EXPECT_NE(pool.Slot(0), std::vector<uint8_t>(pool.view.slot_bytes(), 0));
}

// The server's RingGate mechanism (stream_wait gate kernel + the queue's
// abort word): gated updates run once the host releases the gate, and write
// nothing once it aborts (that update and every later one: kAborted).
TEST_F(CudaQueueTest, GatedUpdatesRunWhenReleasedAndWriteNothingWhenAborted) {
  STATECACHE_SKIP_WITHOUT_GPU();
  std::mt19937 rng(23), rng2(23);
  std::vector<Step> steps, ref_steps;
  for (int i = 0; i < 4; ++i) steps.push_back(MakeStep(&rng));
  for (int i = 0; i < 4; ++i) ref_steps.push_back(MakeStep(&rng2));
  Pool pool(*layout_), ref(*layout_);
  uint32_t* words = nullptr;
  ASSERT_EQ(stream_wait::AllocGateWords(&words), 0);
  auto queue = TestGpu()->NewDecodeQueue();
  ASSERT_TRUE(queue.ok()) << queue.status();
  Record rec;
  for (int i = 0; i < 3; ++i) {
    const uint32_t seq = i + 1;
    ASSERT_TRUE((*queue)
                    ->EnqueueDecodeUpdate(
                        *prepared_, pool.view, i % 2, Inputs(steps[i], slots()),
                        [words, seq](void* stream, void* abort_word) {
                          return stream_wait::StreamGate(stream, words, seq, abort_word) == 0
                                     ? absl::OkStatus()
                                     : absl::InternalError("gate");
                        },
                        nullptr, rec.For(seq))
                    .ok());
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(rec.size(), 0u);
  __atomic_store_n(&words[0], 1u, __ATOMIC_SEQ_CST);  // release seq 1
  for (int i = 0; i < 200 && rec.size() < 1; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(rec.size(), 1u);
  __atomic_store_n(&words[1], 1u, __ATOMIC_SEQ_CST);  // abort, then release all
  __atomic_store_n(&words[0], 3u, __ATOMIC_SEQ_CST);
  // An update enqueued after the abort, without a prologue: aborted too.
  ASSERT_TRUE((*queue)
                  ->EnqueueDecodeUpdate(*prepared_, pool.view, 1, Inputs(steps[3], slots()),
                                        nullptr, nullptr, rec.For(4))
                  .ok());
  (*queue)->Drain();
  {
    absl::MutexLock lock(&rec.mu);
    ASSERT_EQ(rec.done.size(), 4u);
    EXPECT_TRUE(rec.done[0].second.ok()) << rec.done[0].second;
    for (int i = 1; i < 4; ++i) {
      EXPECT_EQ(rec.done[i].first, i + 1);
      EXPECT_EQ(rec.done[i].second.code(), absl::StatusCode::kAborted) << rec.done[i].second;
    }
  }
  ASSERT_TRUE(TestGpu()->DecodeUpdate(*prepared_, ref.view, 0, Inputs(ref_steps[0], slots())).ok());
  const size_t o_count = static_cast<size_t>(kB) * Geo().h_v * Geo().d_v;
  EXPECT_EQ(Download<float>(*steps[0].o, o_count), Download<float>(*ref_steps[0].o, o_count));
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(Download<float>(*steps[i].o, o_count), std::vector<float>(o_count, 0.f)) << i;
  }
  EXPECT_EQ(pool.Bytes(), ref.Bytes());
  queue->reset();
  EXPECT_EQ(stream_wait::FreeGateWords(words), 0);
}

}  // namespace
}  // namespace statecache
