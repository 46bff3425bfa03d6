// DataPlane::SubmitUpdates: the streamed fast path of registered buffers
// (data_plane.h explains the ordering; the proto states the wire contract).
//
// Per submission: seq check, ring-event wait (CUDA), the same UpdateImpl as a
// unary Update with references, then the done word, then the reply (queued
// for a writer thread; a reader thread reads ahead). Every
// error of a submission is its reply (code kept, message prefixed with the
// submission's field path, e.g. "update.q.ref: ..."); only a bad open message
// ends the stream.
#include <chrono>
#include <deque>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/common/status_macros.h"
#include "kernels/cuda_ipc/ipc_runtime.h"
#include "server/dataplane/data_plane.h"

namespace statecache {
namespace {

// The worker's ring of interprocess events, opened in this process for the
// lifetime of one stream.
class EventRing {
 public:
  EventRing() = default;
  EventRing(const EventRing&) = delete;
  EventRing& operator=(const EventRing&) = delete;
  ~EventRing() {
    for (void* e : events_) cuda_ipc::EventDestroy(e);
  }
  absl::Status Open(const google::protobuf::RepeatedPtrField<std::string>& handles) {
    for (int i = 0; i < handles.size(); ++i) {
      if (static_cast<int>(handles[i].size()) != cuda_ipc::kHandleBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("open.cuda_ipc_events[", i, "]: ", handles[i].size(),
                         " bytes; an event handle is ", cuda_ipc::kHandleBytes));
      }
      void* e = nullptr;
      if (int rc = cuda_ipc::OpenEventHandle(handles[i], &e); rc != 0) {
        return absl::InvalidArgumentError(absl::StrCat("open.cuda_ipc_events[", i, "]: ",
                                                       cuda_ipc::ErrorString(rc), " (CUDA error ",
                                                       rc, ")"));
      }
      events_.push_back(e);
    }
    return absl::OkStatus();
  }
  int size() const { return static_cast<int>(events_.size()); }
  absl::Status Wait(int index) {
    if (int rc = cuda_ipc::EventSynchronize(events_[index]); rc != 0) {
      return absl::InternalError(absl::StrCat("wait.index: waiting for ring event ", index, ": ",
                                              cuda_ipc::ErrorString(rc)));
    }
    return absl::OkStatus();
  }

 private:
  std::vector<void*> events_;
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

}  // namespace

absl::Status DataPlane::SubmitUpdates(const std::string& tenant, const StreamIo& io,
                                      const ComputeLimits& limits,
                                      const KernelObserver& observe) {
  v1::SubmitUpdatesRequest msg;
  if (!io.read(&msg)) return absl::OkStatus();  // nothing sent
  if (msg.message_case() != v1::SubmitUpdatesRequest::kOpen) {
    return absl::InvalidArgumentError("open: the first message of the stream must be open");
  }
  const v1::SubmitUpdatesOpen open = msg.open();
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
  // Held for the stream: the done word stays mapped while the stream lives,
  // as an in-flight call keeps its buffers.
  ASSIGN_OR_RETURN(Resolved done,
                   ResolveRef(tenant, open.done_ref(), "open.done_ref", DType::kFp32, 2));
  const int64_t done_offset = open.done_ref().offset();
  EventRing ring;
  if (cuda_) {
    if (open.cuda_ipc_events_size() > kMaxRingEvents) {
      return absl::InvalidArgumentError(absl::StrCat("open.cuda_ipc_events: ",
                                                     open.cuda_ipc_events_size(),
                                                     " events exceed the limit of ",
                                                     kMaxRingEvents));
    }
    RETURN_IF_ERROR(ring.Open(open.cuda_ipc_events()));
  } else if (open.cuda_ipc_events_size() > 0) {
    return absl::InvalidArgumentError(
        "open.cuda_ipc_events: the CPU backend orders submissions by message order; send no "
        "events");
  }
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
  uint64_t last_seq = 0;
  while (in.Pop(&msg)) {
    if (io.cancelled && io.cancelled()) break;
    const auto start = std::chrono::steady_clock::now();
    v1::SubmitUpdatesResponse reply;
    v1::UpdateResponse update_resp;
    double wait_seconds = 0;
    bool store_done = false;
    absl::Status status = [&]() -> absl::Status {
      if (msg.message_case() != v1::SubmitUpdatesRequest::kUpdate) {
        return absl::InvalidArgumentError("update: every message after open is an update");
      }
      const v1::UpdateSubmission& sub = msg.update();
      reply.set_seq(sub.seq());
      if (sub.seq() <= last_seq) {
        return absl::InvalidArgumentError(absl::StrCat(
            "seq: ", sub.seq(), " is not greater than the previous submission's ", last_seq));
      }
      last_seq = sub.seq();
      store_done = true;
      if (io.admit) RETURN_IF_ERROR(io.admit());
      const v1::UpdateRequest& req = sub.update();
      if (!req.model_id().empty() && req.model_id() != open.model_id()) {
        return absl::InvalidArgumentError(absl::StrCat("update.model_id: '", req.model_id(),
                                                       "' is not the stream's model '",
                                                       open.model_id(), "'"));
      }
      if (!req.has_o_ref()) {
        return absl::InvalidArgumentError(
            "update.o_ref: required on SubmitUpdates (o is written into a registered buffer)");
      }
      int wait_index = -1;
      if (sub.has_wait()) {
        wait_index = sub.wait().index();
        if (wait_index < 0 || wait_index >= ring.size()) {
          return absl::InvalidArgumentError(
              ring.size() == 0
                  ? absl::StrCat("wait.index: ", wait_index, ": the stream has no ring events")
                  : absl::StrCat("wait.index: ", wait_index, " is outside 0..", ring.size() - 1));
        }
      }
      absl::StatusOr<std::shared_ptr<Model>> m = registry_->Find(tenant, open.model_id());
      if (!m.ok()) return Prefixed(m.status(), "open.model_id: ");
      const std::function<absl::Status()> before_read = [&]() -> absl::Status {
        if (wait_index < 0) return absl::OkStatus();
        const auto t0 = std::chrono::steady_clock::now();
        absl::Status s = ring.Wait(wait_index);
        wait_seconds = SecondsBetween(t0, std::chrono::steady_clock::now());
        return s;
      };
      absl::Status s = UpdateImpl(tenant, **m, req, limits, observe, &before_read, &update_resp);
      // Field names of the UpdateRequest are "update.<field>" here; errors
      // of the ring wait already name wait.index.
      if (!s.ok() && !absl::StartsWith(s.message(), "wait.")) return Prefixed(s, "update.");
      return s;
    }();
    if (store_done) {
      // Failed submissions advance the word too: a worker stream waiting for
      // it must not hang; the reply says whether o was written.
      absl::Status st = done.buffer->StoreWord(done_offset, last_seq, cuda_stream_);
      if (status.ok()) status = Prefixed(st, "open.done_ref: ");
    }
    if (status.ok()) {
      reply.set_kernel_micros(update_resp.kernel_micros());
    } else {
      reply.mutable_error()->set_code(static_cast<int>(status.code()));
      reply.mutable_error()->set_message(std::string(status.message()));
    }
    const double seconds = SecondsBetween(start, std::chrono::steady_clock::now());
    reply.set_server_micros(static_cast<int64_t>(seconds * 1e6));
    reply.set_wait_micros(static_cast<int64_t>(wait_seconds * 1e6));
    if (io.done) io.done(status.code(), seconds);
    if (!out.Push(std::move(reply))) break;  // the client went away
  }
  out.Close();
  writer.join();
  // Stops taking messages: the reader ends when the client half-closes or
  // the call ends (a cancelled call's Read returns false).
  in.Abort();
  reader.join();
  return absl::OkStatus();
}

}  // namespace statecache
