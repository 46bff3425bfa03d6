// DataPlane::SubmitUpdates: the streamed fast path of registered buffers
// (data_plane.h explains the ordering; the proto states the wire contract).
//
// Per submission: seq check, ring-event wait (CUDA), the same UpdateImpl as a
// unary Update with references, then the done word, then the reply (queued
// for a writer thread; a reader thread reads ahead). Every
// error of a submission is its reply (code kept, message prefixed with the
// submission's field path, e.g. "update.q.ref: ..."); only a bad open message
// ends the stream.
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/backend/interprocess.h"
#include "kernels/common/status_macros.h"
#include "server/dataplane/data_plane.h"
#include "server/core/log.h"

namespace statecache {
namespace {

// The worker's ring of interprocess events, opened in this process for the
// lifetime of one stream.
class EventRing {
 public:
  absl::Status Open(Interprocess& ipc,
                    const google::protobuf::RepeatedPtrField<std::string>& handles) {
    for (int i = 0; i < handles.size(); ++i) {
      if (static_cast<int>(handles[i].size()) != ipc.handle_bytes()) {
        return absl::InvalidArgumentError(
            absl::StrCat("open.cuda_ipc_events[", i, "]: ", handles[i].size(),
                         " bytes; an event handle is ", ipc.handle_bytes()));
      }
      ASSIGN_OR_RETURN(std::unique_ptr<InterprocessEvent> e,
                       ipc.OpenEvent(handles[i], absl::StrCat("open.cuda_ipc_events[", i, "]")));
      events_.push_back(std::move(e));
    }
    return absl::OkStatus();
  }
  int size() const { return static_cast<int>(events_.size()); }
  InterprocessEvent& event(int index) const { return *events_[index]; }
  // Device-side: later work on `stream` waits for the event's latest record.
  absl::Status StreamWait(int index, void* stream) {
    absl::Status st = events_[index]->StreamWait(stream);
    if (st.ok()) return st;
    return absl::InternalError(absl::StrCat("wait.index: waiting for ring event ", index,
                                            " on the device: ", st.message()));
  }
  absl::Status Wait(int index) {
    absl::Status st = events_[index]->Synchronize();
    if (st.ok()) return st;
    return absl::InternalError(
        absl::StrCat("wait.index: waiting for ring event ", index, ": ", st.message()));
  }

 private:
  std::vector<std::unique_ptr<InterprocessEvent>> events_;
};

// The queue's device-side wait for the worker's ring events, which the
// server can always release (a cudaStreamWaitEvent on the worker's event
// could not be: a worker whose event never fires would leave device work
// pending forever, and implicit device synchronizations of the server's
// other calls, e.g. cudaFree, would then wait for it). Per submission the
// queue's stream gets a one-thread gate kernel that waits until a word in
// pinned host memory reaches the submission's seq; a poller thread queries
// the worker's event (cudaEventQuery, spinning with yields for a few
// milliseconds, then every 20 us) and stores the seq once it completed.
// When an event has not completed within `timeout`, or the stream ends
// with an abort, the poller sets the abort flag and releases every gate:
// the gated updates then write nothing (DecodeQueue abort word; kAborted).
class RingGate {
 public:
  RingGate(EventRing* ring, absl::Duration timeout) : ring_(ring), timeout_(timeout) {}
  RingGate(const RingGate&) = delete;
  RingGate& operator=(const RingGate&) = delete;
  ~RingGate() { Finish(/*abort=*/true); }

  absl::Status Start(Interprocess& ipc) {
    absl::StatusOr<std::unique_ptr<StreamGate>> gate = ipc.NewGate();
    if (!gate.ok()) {
      return absl::InternalError(
          absl::StrCat("open: cannot allocate the ring gate: ", gate.status().message()));
    }
    gate_ = *std::move(gate);
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  // A DecodeQueue prologue: the gate kernel for `seq` on the queue's
  // stream, and (index, seq) handed to the poller.
  absl::Status Enqueue(void* stream, void* abort_word, int index, uint64_t seq) {
    absl::MutexLock lock(&mu_);
    if (aborted_) {
      gate_->Release(static_cast<uint32_t>(seq));
      return reason_;
    }
    if (absl::Status st = gate_->Enqueue(stream, static_cast<uint32_t>(seq), abort_word);
        !st.ok()) {
      return absl::InternalError(absl::StrCat("wait.index: enqueueing the wait for ring event ",
                                              index, ": ", st.message()));
    }
    pending_.push_back({index, seq});
    last_seq_ = seq;
    return absl::OkStatus();
  }

  // Why gated updates were aborted (OK while none was).
  absl::Status reason() const {
    absl::MutexLock lock(&mu_);
    return reason_;
  }

  // Stops the poller once every handed entry is released (their events
  // completed, or timed out); `abort`: releases them at once instead.
  void Finish(bool abort) {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      if (abort && !pending_.empty()) {
        AbortLocked(absl::AbortedError(
            "wait.index: the stream ended before the worker's ring event completed; nothing "
            "was written"));
      }
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Entry {
    int index;
    uint64_t seq;
  };

  void AbortLocked(absl::Status reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (aborted_) return;
    aborted_ = true;
    reason_ = std::move(reason);
    gate_->SetAbort();  // the abort flag first: a released gate kernel then aborts
    gate_->Release(static_cast<uint32_t>(last_seq_));
    pending_.clear();
  }

  void Loop() {
    for (;;) {
      Entry e;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](RingGate* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu_) {
              return !g->pending_.empty() || g->stop_;
            },
            this));
        if (pending_.empty()) return;
        e = pending_.front();
      }
      const absl::Time start = absl::Now();
      const absl::Time spin_until = start + absl::Milliseconds(5);
      absl::Status failure;
      for (;;) {
        const absl::StatusOr<bool> complete = ring_->event(e.index).Query();
        if (complete.ok() && *complete) break;
        if (!complete.ok()) {
          failure = absl::InternalError(absl::StrCat("wait.index: querying ring event ", e.index,
                                                     ": ", complete.status().message()));
          break;
        }
        const absl::Time now = absl::Now();
        if (now - start > timeout_) {
          failure = absl::DeadlineExceededError(absl::StrCat(
              "wait.index: ring event ", e.index, " (submission ", e.seq,
              ") did not complete within ", absl::FormatDuration(timeout_),
              "; the stream ends and its later submissions write nothing"));
          break;
        }
        {
          absl::MutexLock lock(&mu_);
          if (aborted_) break;
        }
        if (now < spin_until) {
          std::this_thread::yield();
        } else {
          absl::SleepFor(absl::Microseconds(20));
        }
      }
      absl::MutexLock lock(&mu_);
      if (aborted_) continue;  // Finish(abort) released everything
      if (!failure.ok()) {
        AbortLocked(std::move(failure));
        continue;
      }
      gate_->Release(static_cast<uint32_t>(e.seq));
      pending_.pop_front();
    }
  }

  EventRing* const ring_;
  const absl::Duration timeout_;
  std::unique_ptr<StreamGate> gate_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  std::deque<Entry> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status reason_ ABSL_GUARDED_BY(mu_);
};

// A bounded queue between two threads. Close: the producer is done, the
// consumer drains what is queued. Abort: both sides stop at once.
template <typename T>
class Pipe {
 public:
  explicit Pipe(size_t capacity) : capacity_(capacity) {}
  // False once aborted (or closed).
  bool Push(T v) {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return q_.size() < capacity_ || closed_ || aborted_;
    };
    mu_.Await(absl::Condition(&room));
    if (closed_ || aborted_) return false;
    q_.push_back(std::move(v));
    return true;
  }
  // False when aborted, or closed and drained.
  bool Pop(T* v) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !q_.empty() || closed_ || aborted_;
    };
    mu_.Await(absl::Condition(&ready));
    if (aborted_ || q_.empty()) return false;
    *v = std::move(q_.front());
    q_.pop_front();
    return true;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  void Abort() {
    absl::MutexLock lock(&mu_);
    aborted_ = true;
  }

 private:
  const size_t capacity_;
  absl::Mutex mu_;
  std::deque<T> q_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
};

// Messages read ahead / replies queued per stream.
constexpr size_t kPipeDepth = 256;

absl::Status Prefixed(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

double SecondsBetween(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Field names of the UpdateRequest are "update.<field>" here; errors of
// the ring wait and the done word already name theirs.
absl::Status UpdateError(const absl::Status& s) {
  if (s.ok() || absl::StartsWith(s.message(), "wait.") ||
      absl::StartsWith(s.message(), "open.")) {
    return s;
  }
  return Prefixed(s, "update.");
}

}  // namespace

// One SubmitUpdates stream: its open message, done word, ring events, queue
// (backends with a DecodeQueue) and gate, and what the submissions share.
struct DataPlane::SubmitStream {
  const StreamIo* io = nullptr;
  v1::SubmitUpdatesOpen open;
  // Held for the stream: the done word stays mapped while the stream lives,
  // as an in-flight call keeps its buffers.
  Resolved done;
  int64_t done_offset = 0;
  EventRing ring;
  std::unique_ptr<DecodeQueue> queue;
  std::unique_ptr<RingGate> gate;
  HeldSlots held;  // slots of the last queued update (async path)
  uint64_t last_seq = 0;
  // Completes a submission: error or timings into its reply, metrics, queue
  // the reply (reply, status, start, kernel_micros, wait_seconds).
  std::function<void(v1::SubmitUpdatesResponse, absl::Status,
                     std::chrono::steady_clock::time_point, int64_t, double)>
      respond;
};

// One submission on its way: what StartSubmission decided.
struct DataPlane::SubmissionRun {
  std::chrono::steady_clock::time_point start;
  v1::SubmitUpdatesResponse reply;
  v1::UpdateResponse update_resp;
  double wait_seconds = 0;
  bool store_done = false;
  bool queued = false;  // async: the reply comes from the queue
};

absl::Status DataPlane::OpenSubmitStream(const std::string& tenant,
                                         const v1::SubmitUpdatesOpen& open, SubmitStream* s) {
  s->open = open;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(FindSessionLocked(tenant, open.session_id(), "open.session_id").status());
  }
  {
    absl::StatusOr<std::shared_ptr<Model>> m = registry_->Find(tenant, open.model_id());
    if (!m.ok()) return Prefixed(m.status(), "open.model_id: ");
  }
  if (!open.has_done_ref()) {
    return absl::InvalidArgumentError("open.done_ref: required (the word the server stores "
                                      "each submission's seq in)");
  }
  ASSIGN_OR_RETURN(s->done,
                   ResolveRef(tenant, open.done_ref(), "open.done_ref", DType::kFp32, 2));
  s->done_offset = open.done_ref().offset();
  if (ipc_ != nullptr && ipc_->uses_events()) {
    if (open.cuda_ipc_events_size() > kMaxRingEvents) {
      return absl::InvalidArgumentError(absl::StrCat("open.cuda_ipc_events: ",
                                                     open.cuda_ipc_events_size(),
                                                     " events exceed the limit of ",
                                                     kMaxRingEvents));
    }
    RETURN_IF_ERROR(s->ring.Open(*ipc_, open.cuda_ipc_events()));
  } else if (open.cuda_ipc_events_size() > 0) {
    return absl::InvalidArgumentError(
        "open.cuda_ipc_events: the CPU backend orders submissions by message order; send no "
        "events");
  }
  // Backends with a DecodeQueue (CUDA): submissions run on a queue of the
  // stream's own (the host never waits per submission; the queue's stream
  // waits for the worker's ring event on the device, behind a RingGate, or
  // with Options::device_event_wait a cudaStreamWaitEvent) and the
  // reply is sent from its completion thread. Others (CPU): each submission
  // runs synchronously here.
  {
    absl::StatusOr<std::unique_ptr<DecodeQueue>> q = backend_->NewDecodeQueue();
    if (q.ok()) {
      s->queue = std::move(*q);
    } else if (q.status().code() != absl::StatusCode::kUnimplemented) {
      LogEvent("dataplane_submit_sync",
               absl::StrCat("no decode queue (", q.status().ToString(), "): host-synchronous"));
    }
  }
  if (s->queue != nullptr && s->ring.size() > 0) {
    if (!options_.device_event_wait) {
      s->gate = std::make_unique<RingGate>(&s->ring, options_.ring_wait_timeout);
      RETURN_IF_ERROR(s->gate->Start(*ipc_));
    }
  }
  return absl::OkStatus();
}


absl::Status DataPlane::StartSubmission(const std::string& tenant, SubmitStream& s,
                                        const v1::SubmitUpdatesRequest& msg,
                                        const ops::Limits& limits,
                                        const KernelObserver& observe, SubmissionRun* run) {
  if (msg.message_case() != v1::SubmitUpdatesRequest::kUpdate) {
    return absl::InvalidArgumentError("update: every message after open is an update");
  }
  const v1::UpdateSubmission& sub = msg.update();
  run->reply.set_seq(sub.seq());
  if (sub.seq() <= s.last_seq) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq: ", sub.seq(), " is not greater than the previous submission's ", s.last_seq));
  }
  s.last_seq = sub.seq();
  run->store_done = true;
  if (s.io->admit) RETURN_IF_ERROR(s.io->admit());
  const v1::UpdateRequest& req = sub.update();
  if (!req.model_id().empty() && req.model_id() != s.open.model_id()) {
    return absl::InvalidArgumentError(absl::StrCat("update.model_id: '", req.model_id(),
                                                   "' is not the stream's model '",
                                                   s.open.model_id(), "'"));
  }
  if (!req.has_o_ref()) {
    return absl::InvalidArgumentError(
        "update.o_ref: required on SubmitUpdates (o is written into a registered buffer)");
  }
  int wait_index = -1;
  if (sub.has_wait()) {
    wait_index = sub.wait().index();
    if (wait_index < 0 || wait_index >= s.ring.size()) {
      return absl::InvalidArgumentError(
          s.ring.size() == 0
              ? absl::StrCat("wait.index: ", wait_index, ": the stream has no ring events")
              : absl::StrCat("wait.index: ", wait_index, " is outside 0..", s.ring.size() - 1));
    }
  }
  absl::StatusOr<std::shared_ptr<Model>> m = registry_->Find(tenant, s.open.model_id());
  if (!m.ok()) return Prefixed(m.status(), "open.model_id: ");
  if (s.queue == nullptr) {
    const std::function<absl::Status()> before_read = [&]() -> absl::Status {
      if (wait_index < 0) return absl::OkStatus();
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status st = s.ring.Wait(wait_index);
      run->wait_seconds = SecondsBetween(t0, std::chrono::steady_clock::now());
      return st;
    };
    return UpdateError(
        UpdateImpl(tenant, **m, req, limits, observe, &before_read, &run->update_resp));
  }
  // Async: the queue's stream waits for the worker's ring event on the
  // device (gate: the prologue below); nothing here waits for the GPU.
  RingGate* const gate = s.gate.get();
  const std::function<absl::Status()> before_read = [&]() -> absl::Status {
    if (wait_index < 0 || gate != nullptr) return absl::OkStatus();
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = s.ring.StreamWait(wait_index, s.queue->native_stream());
    run->wait_seconds = SecondsBetween(t0, std::chrono::steady_clock::now());
    return st;
  };
  DecodeQueue::Prologue prologue;
  if (wait_index >= 0 && gate != nullptr) {
    prologue = [gate, wait_index, seq = sub.seq()](void* stream, void* abort_word) {
      return gate->Enqueue(stream, abort_word, wait_index, seq);
    };
  }
  auto plan = std::make_shared<UpdatePlan>();
  plan->model = *m;
  RETURN_IF_ERROR(
      UpdateError(PlanUpdate(tenant, **m, req, limits, &before_read, &s.held, plan.get())));
  const uint64_t seq = sub.seq();
  const Model& model = **m;
  const int batch = plan->in.batch;
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(UpdateError(s.queue->EnqueueDecodeUpdate(
      *model.prepared, model.slots->view(), req.layer(), plan->in, prologue,
      [&s, seq](void* stream) {
        return Prefixed(s.done.buffer->StoreWord(s.done_offset, seq, stream), "open.done_ref: ");
      },
      [&respond = s.respond, &observe, gate, plan, reply = run->reply, start = run->start, t0,
       wait_seconds = run->wait_seconds, batch](absl::Status st) mutable {
        // The GPU work is done: the slots and buffers are released (plan)
        // after the reply is queued.
        // Metrics: enqueue to completion; the reply's kernel_micros: the
        // host's enqueue time (the backend call).
        const double seconds = SecondsBetween(t0, std::chrono::steady_clock::now());
        if (st.code() == absl::StatusCode::kAborted && gate != nullptr && !gate->reason().ok()) {
          st = gate->reason();  // why the gate aborted it (names wait.index)
        }
        if (st.ok() && observe) observe("decode_update", seconds, batch);
        respond(std::move(reply), UpdateError(st), start,
                plan->enqueue_micros.load(std::memory_order_relaxed), wait_seconds);
        plan.reset();
      })));
  plan->enqueue_micros.store(
      static_cast<int64_t>(SecondsBetween(t0, std::chrono::steady_clock::now()) * 1e6),
      std::memory_order_relaxed);
  run->queued = true;
  return absl::OkStatus();
}

void DataPlane::RunSubmission(const std::string& tenant, SubmitStream& s,
                              const v1::SubmitUpdatesRequest& msg, const ops::Limits& limits,
                              const KernelObserver& observe) {
  SubmissionRun run;
  run.start = std::chrono::steady_clock::now();
  absl::Status status = StartSubmission(tenant, s, msg, limits, observe, &run);
  if (run.queued) return;
  if (s.queue != nullptr) {
    // Failed before the backend: the done word and the reply still follow
    // every earlier submission of the stream.
    const auto on_done = [&respond = s.respond, reply = run.reply, status, start = run.start,
                          wait_seconds = run.wait_seconds](absl::Status st) {
      respond(reply, status.ok() ? st : status, start, 0, wait_seconds);
    };
    absl::Status enq = run.store_done
        ? s.queue->EnqueueCompletion(
              [&s, seq = s.last_seq](void* stream) {
                return Prefixed(s.done.buffer->StoreWord(s.done_offset, seq, stream),
                                "open.done_ref: ");
              },
              on_done)
        : s.queue->EnqueueCompletion(nullptr, on_done);
    if (!enq.ok()) s.respond(run.reply, status.ok() ? enq : status, run.start, 0, run.wait_seconds);
    return;
  }
  if (run.store_done) {
    // Failed submissions advance the word too: a worker stream waiting for
    // it must not hang; the reply says whether o was written.
    absl::Status st =
        s.done.buffer->StoreWord(s.done_offset, s.last_seq, backend_->native_stream());
    if (status.ok()) status = Prefixed(st, "open.done_ref: ");
  }
  s.respond(std::move(run.reply), status, run.start, run.update_resp.kernel_micros(),
            run.wait_seconds);
}

absl::Status DataPlane::SubmitUpdates(const std::string& tenant, const StreamIo& io,
                                      const ops::Limits& limits,
                                      const KernelObserver& observe) {
  v1::SubmitUpdatesRequest msg;
  if (!io.read(&msg)) return absl::OkStatus();  // nothing sent
  if (msg.message_case() != v1::SubmitUpdatesRequest::kOpen) {
    return absl::InvalidArgumentError("open: the first message of the stream must be open");
  }
  SubmitStream s;
  s.io = &io;
  RETURN_IF_ERROR(OpenSubmitStream(tenant, msg.open(), &s));
  {
    v1::SubmitUpdatesResponse ack;  // seq 0: the stream is open
    if (!io.write(ack)) return absl::OkStatus();
  }

  // Three threads: this one runs submissions in order; a reader takes the
  // next messages off the wire while a kernel runs (so a queued submission
  // costs no Read round trip), a writer sends the replies (so the next
  // submission does not wait for one).
  Pipe<v1::SubmitUpdatesRequest> in(kPipeDepth);
  Pipe<v1::SubmitUpdatesResponse> out(kPipeDepth);
  std::thread reader([&] {
    v1::SubmitUpdatesRequest m;
    while (io.read(&m)) {
      if (!in.Push(std::move(m))) break;
      m = v1::SubmitUpdatesRequest();
    }
    in.Close();
  });
  std::thread writer([&] {
    v1::SubmitUpdatesResponse r;
    while (out.Pop(&r)) {
      if (!io.write(r)) {  // the client went away
        out.Abort();
        in.Abort();
        break;
      }
    }
  });
  std::atomic<bool> client_gone{false};
  // Runs here (CPU, errors before the backend on CPU) or on the queue's
  // completion thread (CUDA; in seq order).
  s.respond = [&io, &out, &client_gone](v1::SubmitUpdatesResponse reply, absl::Status status,
                                        std::chrono::steady_clock::time_point start,
                                        int64_t kernel_micros, double wait_seconds) {
    if (status.ok()) {
      reply.set_kernel_micros(kernel_micros);
    } else {
      reply.mutable_error()->set_code(static_cast<int>(status.code()));
      reply.mutable_error()->set_message(std::string(status.message()));
    }
    const double seconds = SecondsBetween(start, std::chrono::steady_clock::now());
    reply.set_server_micros(static_cast<int64_t>(seconds * 1e6));
    reply.set_wait_micros(static_cast<int64_t>(wait_seconds * 1e6));
    if (io.done) io.done(status.code(), seconds);
    if (!out.Push(std::move(reply))) client_gone.store(true);
  };
  while (!client_gone.load() && in.Pop(&msg)) {
    if (io.cancelled && io.cancelled()) break;
    if (s.gate != nullptr && !s.gate->reason().ok()) break;  // a ring event timed out
    RunSubmission(tenant, s, msg, limits, observe);
  }
  // In-flight GPU work completes and is answered before the stream's
  // buffers, events and slot accesses go away (a worker event that never
  // completes: released after the gate's timeout, the update aborted).
  absl::Status ended;
  if (s.gate != nullptr) {
    s.gate->Finish(/*abort=*/false);
    if (s.gate->reason().code() == absl::StatusCode::kDeadlineExceeded) ended = s.gate->reason();
  }
  if (s.queue != nullptr) {
    s.queue->Drain();
    s.queue.reset();
  }
  s.gate.reset();
  out.Close();
  writer.join();
  // Stops taking messages: the reader ends when the client half-closes or
  // the call ends (a cancelled call's Read returns false).
  in.Abort();
  reader.join();
  return ended;
}

}  // namespace statecache
