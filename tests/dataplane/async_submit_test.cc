// SubmitUpdates' asynchronous path (server/dataplane/submit_updates.cc with a
// Backend::NewDecodeQueue), run on the CPU: a test backend wraps the CPU
// backend and gives it a DecodeQueue whose "device" is one worker thread
// (updates and epilogues run there, in order, after Enqueue returned; the test
// can pause it). DataPlane::SubmitUpdates is driven directly through a
// StreamIo (no gRPC). Checks: outputs and slots bit-identical to in-process
// calls, replies in seq order with the right code and field name, an error
// submission in the middle leaves every slot and o untouched, the done word
// advances only after the work completed, slots stay busy until completion
// (and the next update on the same slots does not wait for that), buffers stay
// mapped when the session closes with work in flight.
// The CUDA queue itself: //tests/dataplane:cuda_queue_test (gpu_only).
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
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
#include "kernels/backend/stream_ops.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"
#include "kernels/testing/token_batch.h"
#include "server/dataplane/data_plane.h"
#include "kernels/shm/shm_region.h"
#include "server/dataplane/testing/reference_pool.h"
#include "server/core/model_registry.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kB = dataplane_testing::kTestSlots;  // slots per update
constexpr int kSlots = 4;   // allocated (the 4th is never updated)
constexpr char kModel[] = "dp";

ModelGeometry Geo() { return dataplane_testing::TestGeometry(); }

// ---- A backend with a thread-backed DecodeQueue ----------------------------

struct QueueGate {
  absl::Mutex mu;
  bool paused ABSL_GUARDED_BY(mu) = false;
  int enqueued ABSL_GUARDED_BY(mu) = 0;
  int executed ABSL_GUARDED_BY(mu) = 0;
  int queues ABSL_GUARDED_BY(mu) = 0;

  void SetPaused(bool p) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    paused = p;
  }
  // Waits (up to 10 s) until at least n updates were enqueued; false on timeout.
  bool AwaitEnqueued(int n) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return enqueued >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(10));
  }
};

class ThreadQueue : public DecodeQueue {
 public:
  ThreadQueue(Backend* inner, QueueGate* gate) : inner_(inner), gate_(gate) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~ThreadQueue() override {
    Drain();
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void* native_stream() const override { return nullptr; }
  absl::Status EnqueueDecodeUpdate(const PreparedModel& model, const PoolView& pool, int layer,
                                   const DecodeInputs& in, const Prologue& prologue,
                                   const Epilogue& epilogue, Done done) override {
    // The prologue's "device work" runs on the worker thread too (the
    // server enqueues no prologue without ring events, i.e. on the CPU).
    Push([this, &model, pool, layer, in, prologue, epilogue, done = std::move(done)] {
      absl::Status s = prologue ? prologue(nullptr, nullptr) : absl::OkStatus();
      if (s.ok()) s = inner_->DecodeUpdate(model, pool, layer, in);
      if (epilogue) {
        absl::Status e = epilogue(nullptr);
        if (s.ok()) s = e;
      }
      done(s);
    });
    return absl::OkStatus();
  }
  absl::Status EnqueueCompletion(const Epilogue& epilogue, Done done) override {
    Push([epilogue, done = std::move(done)] { done(epilogue ? epilogue(nullptr) : absl::OkStatus()); });
    return absl::OkStatus();
  }
  void Drain() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](ThreadQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
          return q->work_.empty() && !q->running_;
        },
        this));
  }

 private:
  void Push(std::function<void()> f) {
    {
      absl::MutexLock lock(&gate_->mu);
      ++gate_->enqueued;
    }
    absl::MutexLock lock(&mu_);
    work_.push_back(std::move(f));
  }
  void Loop() {
    for (;;) {
      std::function<void()> f;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](ThreadQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
              return !q->work_.empty() || q->stop_;
            },
            this));
        if (work_.empty()) return;
        f = std::move(work_.front());
        work_.pop_front();
        running_ = true;
      }
      {
        absl::MutexLock lock(&gate_->mu);
        gate_->mu.Await(absl::Condition(
            +[](QueueGate* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu) { return !g->paused; },
            gate_));
      }
      f();
      {
        absl::MutexLock lock(&gate_->mu);
        ++gate_->executed;
      }
      absl::MutexLock lock(&mu_);
      running_ = false;
    }
  }

  Backend* const inner_;
  QueueGate* const gate_;
  std::thread thread_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> work_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

class QueueBackend : public Backend {
 public:
  QueueBackend() : inner_(*CreateBackend("cpu")) {}
  const char* name() const override { return "cpu"; }  // shared-memory buffers
  std::string Describe() const override { return "cpu + thread queue (test)"; }
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(int64_t bytes) override {
    return inner_->Allocate(bytes);
  }
  absl::StatusOr<int64_t> AvailableBytes() const override { return inner_->AvailableBytes(); }
  absl::Status CopyIn(void* d, const void* s, int64_t n) override { return inner_->CopyIn(d, s, n); }
  absl::Status CopyOut(void* d, const void* s, int64_t n) override {
    return inner_->CopyOut(d, s, n);
  }
  absl::StatusOr<std::unique_ptr<PreparedModel>> Prepare(const StateLayout& l) override {
    return inner_->Prepare(l);
  }
  absl::Status DecodeUpdate(const PreparedModel& m, const PoolView& p, int layer,
                            const DecodeInputs& in) override {
    return inner_->DecodeUpdate(m, p, layer, in);
  }
  absl::Status Prefill(const PreparedModel& m, const PoolView& p, int layer,
                       const PrefillInputs& in) override {
    return inner_->Prefill(m, p, layer, in);
  }
  absl::Status PackStates(const PreparedModel& m, const PoolView& p, const int32_t* s, int n,
                          const float* x) override {
    return inner_->PackStates(m, p, s, n, x);
  }
  absl::Status UnpackStates(const PreparedModel& m, const PoolView& p, const int32_t* s, int n,
                            float* x) override {
    return inner_->UnpackStates(m, p, s, n, x);
  }
  absl::Status CopySlots(const PoolView& a, const int32_t* as, const PoolView& b,
                         const int32_t* bs, int n) override {
    return inner_->CopySlots(a, as, b, bs, n);
  }
  absl::Status ZeroSlots(const PoolView& p, const int32_t* s, int n) override {
    return inner_->ZeroSlots(p, s, n);
  }
  StreamOps& stream_ops() override { return inner_->stream_ops(); }
  Interprocess* interprocess() override { return inner_->interprocess(); }  // shared memory
  absl::StatusOr<std::unique_ptr<DecodeQueue>> NewDecodeQueue() override {
    {
      absl::MutexLock lock(&gate.mu);
      ++gate.queues;
    }
    return std::unique_ptr<DecodeQueue>(new ThreadQueue(inner_.get(), &gate));
  }

  QueueGate gate;

 private:
  std::unique_ptr<Backend> inner_;
};

// ---- Inputs and the in-process reference ----------------------------------

using Step = TokenBatch;
Step MakeStep(std::mt19937* rng) { return dataplane_testing::MakeTestStep(rng); }

constexpr int64_t kOCount = int64_t{kB} * 4 * 32;  // kB * h_v * d_v

using Reference = dataplane_testing::ReferencePool;

// ---- The stream driver -----------------------------------------------------

// Messages in, replies out, SubmitUpdates on its own thread.
class Stream {
 public:
  Stream(DataPlane* dp) {
    io_.read = [this](v1::SubmitUpdatesRequest* r) {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Stream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return !s->in_.empty() || s->closed_;
          },
          this));
      if (in_.empty()) return false;
      *r = std::move(in_.front());
      in_.pop_front();
      return true;
    };
    io_.write = [this](const v1::SubmitUpdatesResponse& r) {
      absl::MutexLock lock(&mu_);
      replies_.push_back(r);
      return true;
    };
    thread_ = std::thread([this, dp] {
      absl::Status s = dp->SubmitUpdates("", io_, ops::Limits(), nullptr);
      absl::MutexLock lock(&mu_);
      end_ = s;
      ended_ = true;
    });
  }
  ~Stream() { Close(); }
  void Send(v1::SubmitUpdatesRequest m) {
    absl::MutexLock lock(&mu_);
    in_.push_back(std::move(m));
  }
  // Half-close, wait for the end of the call.
  absl::Status Close() {
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return end_;
  }
  // Waits for n replies (incl. the open ack) or 10 s.
  std::vector<v1::SubmitUpdatesResponse> WaitReplies(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return replies_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return replies_;
  }
  size_t reply_count() {
    absl::MutexLock lock(&mu_);
    return replies_.size();
  }

 private:
  DataPlane::StreamIo io_;
  absl::Mutex mu_;
  std::deque<v1::SubmitUpdatesRequest> in_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::SubmitUpdatesResponse> replies_ ABSL_GUARDED_BY(mu_);
  absl::Status end_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Buffer layout (bytes): done word at 0; per step i inputs at kIn + i *
// kStepBytes (q, k, v, g, beta); outputs at kOut + i * kOBytes.
constexpr int64_t kQBytes = int64_t{kB} * 2 * 32 * 4;
constexpr int64_t kVBytes = int64_t{kB} * 4 * 32 * 4;
constexpr int64_t kGBytes = int64_t{kB} * 4 * 4;
constexpr int64_t kStepBytes = 2 * kQBytes + kVBytes + 2 * kGBytes;
constexpr int64_t kIn = 256;
constexpr int kMaxSteps = 8;
constexpr int64_t kOBytes = kOCount * 4;
constexpr int64_t kOut = kIn + kMaxSteps * kStepBytes;
constexpr int64_t kBufferBytes = kOut + kMaxSteps * kOBytes;

class AsyncSubmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelRegistry::Options ro;
    ro.state_budget_bytes = 64 << 20;
    registry_ = std::make_unique<ModelRegistry>(&backend_, ro);
    ModelSpec spec;
    spec.id = kModel;
    spec.geometry = Geo();
    spec.format = *ParseFormatSpec("damp:8");
    spec.slots = 8;
    model_ = *registry_->Register(spec);
    DataPlane::Options o;
    o.sweep_period = absl::ZeroDuration();
    dp_ = std::make_unique<DataPlane>(&backend_, registry_.get(), o);
    v1::OpenSessionResponse os;
    ASSERT_TRUE(dp_->OpenSession("", v1::OpenSessionRequest(), &os).ok());
    session_ = os.session_id();
    auto region = SharedMemoryRegion::Create(kBufferBytes);
    ASSERT_TRUE(region.ok()) << region.status();
    mine_ = *std::move(region);
    v1::RegisterBufferRequest rb;
    rb.set_session_id(session_);
    rb.set_size_bytes(kBufferBytes);
    rb.set_shm_name(mine_->name());
    v1::RegisterBufferResponse rr;
    ASSERT_TRUE(dp_->RegisterBuffer("", rb, &rr).ok());
    buffer_ = rr.buffer_id();
    handles_ = *model_->slots->Allocate(kSlots);
  }

  void WriteStep(int i, const Step& s) {
    uint8_t* p = mine_->data() + kIn + i * kStepBytes;
    for (const std::vector<float>* x : {&s.q, &s.k, &s.v, &s.g, &s.beta}) {
      std::memcpy(p, x->data(), x->size() * 4);
      p += x->size() * 4;
    }
  }
  std::vector<float> ReadO(int i) const {
    std::vector<float> o(kOCount);
    std::memcpy(o.data(), mine_->data() + kOut + i * kOBytes, kOBytes);
    return o;
  }
  uint64_t DoneWord() const {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(mine_->data()), __ATOMIC_ACQUIRE);
  }
  std::string Packed(int slot_index) const {
    const PoolView& v = model_->slots->view();
    return std::string(reinterpret_cast<const char*>(v.slot(slot_index)), v.slot_bytes());
  }
  int SlotIndex(int i) {
    auto access = model_->slots->Acquire({handles_[i]}, "h");
    return access.ok() ? access->indices()[0] : -1;
  }

  static v1::SubmitUpdatesRequest Open(uint64_t session, uint64_t buffer) {
    v1::SubmitUpdatesRequest m;
    m.mutable_open()->set_session_id(session);
    m.mutable_open()->set_model_id(kModel);
    m.mutable_open()->mutable_done_ref()->set_buffer_id(buffer);
    m.mutable_open()->mutable_done_ref()->set_offset(0);
    return m;
  }
  // Submission `seq`: layer, inputs of step `in`, o into output `out`.
  v1::SubmitUpdatesRequest Sub(uint64_t seq, int layer, int in, int out) const {
    v1::SubmitUpdatesRequest m;
    v1::UpdateSubmission* s = m.mutable_update();
    s->set_seq(seq);
    v1::UpdateRequest* r = s->mutable_update();
    r->set_layer(layer);
    for (int i = 0; i < kB; ++i) {
      r->add_slots()->set_id(handles_[i].id);
      r->mutable_slots(i)->set_generation(handles_[i].generation);
    }
    int64_t off = kIn + in * kStepBytes;
    auto ref = [&](v1::Tensor* t, std::vector<int64_t> shape, int64_t bytes) {
      t->set_dtype(v1::DTYPE_FP32);
      for (int64_t d : shape) t->add_shape(d);
      t->mutable_ref()->set_buffer_id(buffer_);
      t->mutable_ref()->set_offset(off);
      off += bytes;
    };
    ref(r->mutable_q(), {kB, 2, 32}, kQBytes);
    ref(r->mutable_k(), {kB, 2, 32}, kQBytes);
    ref(r->mutable_v(), {kB, 4, 32}, kVBytes);
    ref(r->mutable_g(), {kB, 4}, kGBytes);
    ref(r->mutable_beta(), {kB, 4}, kGBytes);
    r->mutable_o_ref()->set_buffer_id(buffer_);
    r->mutable_o_ref()->set_offset(kOut + out * kOBytes);
    return m;
  }

  QueueBackend backend_;
  std::unique_ptr<ModelRegistry> registry_;
  std::shared_ptr<Model> model_;
  std::unique_ptr<DataPlane> dp_;
  uint64_t session_ = 0;
  std::unique_ptr<SharedMemoryRegion> mine_;
  uint64_t buffer_ = 0;
  std::vector<SlotHandle> handles_;
};

TEST_F(AsyncSubmitTest, MatchesInProcessCallsInOrder) {
  std::mt19937 rng(7);
  Reference ref;
  std::vector<Step> steps;
  for (int i = 0; i < 4; ++i) {
    steps.push_back(MakeStep(&rng));
    WriteStep(i, steps[i]);
  }
  {
    Stream st(dp_.get());
    st.Send(Open(session_, buffer_));
    for (int i = 0; i < 4; ++i) st.Send(Sub(i + 1, i % 2, i, i));
    const auto replies = st.WaitReplies(5);
    ASSERT_EQ(replies.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(replies[i].seq(), static_cast<uint64_t>(i));
      EXPECT_FALSE(replies[i].has_error()) << replies[i].error().message();
    }
    EXPECT_TRUE(st.Close().ok());
  }
  {
    absl::MutexLock lock(&backend_.gate.mu);
    EXPECT_EQ(backend_.gate.queues, 1);
    EXPECT_EQ(backend_.gate.executed, 4);
  }
  EXPECT_EQ(DoneWord(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ReadO(i), ref.Update(i % 2, steps[i])) << "step " << i;
  for (int i = 0; i < kB; ++i) EXPECT_EQ(Packed(SlotIndex(i)), ref.Packed(i)) << "slot " << i;
  // The slot outside every batch is untouched (zero state).
  EXPECT_EQ(Packed(SlotIndex(kB)), std::string(model_->slots->slot_bytes(), '\0'));
}

TEST_F(AsyncSubmitTest, ErrorSubmissionsInTheMiddleWriteNothing) {
  std::mt19937 rng(11);
  Reference ref;
  std::vector<Step> steps;
  for (int i = 0; i < 3; ++i) steps.push_back(MakeStep(&rng));
  steps[1].q[5] = std::nanf("");  // seq 2 fails in the backend's validation
  for (int i = 0; i < 3; ++i) WriteStep(i, steps[i]);
  Stream st(dp_.get());
  st.Send(Open(session_, buffer_));
  st.Send(Sub(1, 0, 0, 0));
  st.Send(Sub(2, 1, 1, 1));
  v1::SubmitUpdatesRequest bad_ref = Sub(3, 1, 2, 2);  // fails before the backend
  bad_ref.mutable_update()->mutable_update()->mutable_k()->mutable_ref()->set_offset(kBufferBytes);
  st.Send(bad_ref);
  st.Send(Sub(4, 1, 2, 3));
  const auto replies = st.WaitReplies(5);
  ASSERT_EQ(replies.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(replies[i].seq(), static_cast<uint64_t>(i));
  EXPECT_FALSE(replies[1].has_error()) << replies[1].error().message();
  EXPECT_EQ(replies[2].error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(replies[2].error().message(), StartsWith("update.q[5]: "));
  EXPECT_THAT(replies[2].error().message(), HasSubstr("is not finite"));
  EXPECT_EQ(replies[3].error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(replies[3].error().message(), StartsWith("update.k.ref: bytes ["));
  EXPECT_FALSE(replies[4].has_error()) << replies[4].error().message();
  EXPECT_TRUE(st.Close().ok());
  EXPECT_EQ(DoneWord(), 4u);
  // Only seq 1 and 4 happened: slots and outputs as in-process calls of
  // those two; the failed submissions' o untouched (zero).
  EXPECT_EQ(ReadO(0), ref.Update(0, steps[0]));
  EXPECT_EQ(ReadO(1), std::vector<float>(kOCount, 0.f));
  EXPECT_EQ(ReadO(2), std::vector<float>(kOCount, 0.f));
  EXPECT_EQ(ReadO(3), ref.Update(1, steps[2]));
  for (int i = 0; i < kB; ++i) EXPECT_EQ(Packed(SlotIndex(i)), ref.Packed(i)) << "slot " << i;
  EXPECT_EQ(Packed(SlotIndex(kB)), std::string(model_->slots->slot_bytes(), '\0'));
}

TEST_F(AsyncSubmitTest, SlotsStayBusyUntilCompletionAndTheNextUpdateDoesNotWait) {
  std::mt19937 rng(3);
  const Step s = MakeStep(&rng);
  WriteStep(0, s);
  backend_.gate.SetPaused(true);
  Stream st(dp_.get());
  st.Send(Open(session_, buffer_));
  st.Send(Sub(1, 0, 0, 0));
  st.Send(Sub(2, 1, 0, 1));
  {
    // Both are queued although the first has not run: the second shares
    // the first's slot access instead of waiting for it on the host.
    EXPECT_TRUE(backend_.gate.AwaitEnqueued(2));
    absl::MutexLock lock(&backend_.gate.mu);
    EXPECT_EQ(backend_.gate.executed, 0);
  }
  std::atomic<bool> acquired{false};
  std::thread other([&] {
    auto a = model_->slots->Acquire({handles_[1]}, "slots");
    EXPECT_TRUE(a.ok()) << a.status();
    acquired = true;
  });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(acquired.load());      // busy while the work is in flight
  EXPECT_EQ(st.reply_count(), 1u);    // only the open ack
  EXPECT_EQ(DoneWord(), 0u);          // the word follows the work
  backend_.gate.SetPaused(false);
  other.join();
  EXPECT_TRUE(acquired.load());
  const auto replies = st.WaitReplies(3);
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_FALSE(replies[1].has_error()) << replies[1].error().message();
  EXPECT_FALSE(replies[2].has_error()) << replies[2].error().message();
  EXPECT_TRUE(st.Close().ok());
  EXPECT_EQ(DoneWord(), 2u);
  EXPECT_TRUE(model_->slots->CheckInvariants().ok());
}

TEST_F(AsyncSubmitTest, CloseSessionWithWorkInFlightKeepsBuffersUntilItCompletes) {
  std::mt19937 rng(5);
  Reference ref;
  const Step s = MakeStep(&rng);
  WriteStep(0, s);
  backend_.gate.SetPaused(true);
  Stream st(dp_.get());
  st.Send(Open(session_, buffer_));
  st.Send(Sub(1, 0, 0, 0));
  EXPECT_TRUE(backend_.gate.AwaitEnqueued(1));
  v1::CloseSessionRequest close;
  close.set_session_id(session_);
  ASSERT_TRUE(dp_->CloseSession("", close).ok());
  EXPECT_EQ(dp_->buffer_count(), 0);
  backend_.gate.SetPaused(false);
  // The in-flight update still reads and writes the (still mapped) buffer.
  const auto replies = st.WaitReplies(2);
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_FALSE(replies[1].has_error()) << replies[1].error().message();
  EXPECT_EQ(ReadO(0), ref.Update(0, s));
  EXPECT_EQ(DoneWord(), 1u);
  // The next submission names a buffer of the closed session.
  st.Send(Sub(2, 1, 0, 1));
  const auto after = st.WaitReplies(3);
  ASSERT_EQ(after.size(), 3u);
  EXPECT_EQ(after[2].error().code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(after[2].error().message(), HasSubstr("update.q.ref.buffer_id"));
  EXPECT_TRUE(st.Close().ok());
}

}  // namespace
}  // namespace statecache
