#include "kernels/cuda/internal/cuda_decode_queue.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/backend/batch_validation.h"
#include "kernels/backend/stream_ops.h"
#include "kernels/common/status_macros.h"
#include "kernels/cuda/internal/call_context.h"
#include "kernels/cuda/internal/cuda_model.h"
#include "kernels/cuda/internal/cuda_runtime.h"

namespace statecache {
namespace cuda_internal {
namespace {

// DecodeQueue on its own non-blocking stream, with its own validation block,
// slot bitmap and a ring of pinned read-back blocks (one per update in
// flight): nothing is shared with the backend's synchronous calls or other
// queues but the read-only prepared models. Per update the stream gets:
// reset error block + bitmap, validation kernels, the fused kernel (exits
// untouched on any error), an async copy of the 44-byte block into the
// update's pinned entry, the caller's epilogue, an event. A completion
// thread waits for the events in order, turns the block into a status and
// runs `done`; the host never waits on the producer side (except when
// kRing updates are in flight).
class CudaDecodeQueue : public DecodeQueue {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDecodeQueue>> Create(const LaunchOptions& options) {
    std::unique_ptr<CudaDecodeQueue> q(new CudaDecodeQueue(options));
    RETURN_IF_ERROR(CudaStatus(StreamCreate(&q->stream_), "create queue stream"));
    void* errors = nullptr;
    RETURN_IF_ERROR(CudaStatus(Malloc(&errors, kErrorBytes), "allocate error block"));
    q->errors_ = static_cast<int32_t*>(errors);
    void* host = nullptr;
    RETURN_IF_ERROR(
        CudaStatus(HostAllocPinned(&host, kRing * kErrorBytes), "allocate pinned blocks"));
    q->host_errors_ = static_cast<int32_t*>(host);
    void* abort_word = nullptr;
    RETURN_IF_ERROR(CudaStatus(Malloc(&abort_word, 256), "allocate abort word"));
    q->abort_word_ = abort_word;
    RETURN_IF_ERROR(CudaStatus(MemsetAsync(abort_word, 0, 256, q->stream_), "zero abort word"));
    for (int i = 0; i < kRing; ++i) {
      // Blocking-sync events have no timing (the completion thread only
      // waits on them); the default keeps the spinning timing events.
      RETURN_IF_ERROR(CudaStatus(EventCreate(&q->events_[i], !options.queue_blocking_sync,
                                             options.queue_blocking_sync),
                                 "create queue event"));
    }
    q->thread_ = std::thread([p = q.get()] { p->CompletionLoop(); });
    return q;
  }

  ~CudaDecodeQueue() override {
    if (thread_.joinable()) {
      Drain();
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
    if (stream_ != nullptr) {
      StreamSynchronize(stream_);
      StreamDestroy(stream_);
    }
    for (void* e : events_) {
      if (e != nullptr) EventDestroy(e);
    }
    if (errors_ != nullptr) Free(errors_);
    if (bitmap_ != nullptr) Free(bitmap_);
    if (abort_word_ != nullptr) Free(abort_word_);
    if (host_errors_ != nullptr) HostFreePinned(host_errors_);
  }

  void* native_stream() const override { return stream_; }

  absl::Status EnqueueDecodeUpdate(const PreparedModel& model, const PoolView& pool, int layer,
                                   const DecodeInputs& in, const Prologue& prologue,
                                   const Epilogue& epilogue, Done done) override {
    ASSIGN_OR_RETURN(const CudaPreparedModel* m, AsCudaModel(model));
    const StateLayout& layout = m->layout();
    RETURN_IF_ERROR(ValidatePoolAndLayer(layout, pool, layer));
    RETURN_IF_ERROR(CheckTokenPointers(in.batch, 1, in.slots, in.dtype, in.q, in.k,
                                                    in.v, in.g, in.beta));
    if (in.batch > 0 && in.o == nullptr) return absl::InvalidArgumentError("o: null");
    if (in.batch == 0) {
      if (prologue) {
        // Its device work may wait (a gate): keep it in the order.
        absl::Status p = prologue(stream_, abort_word_);
        if (!p.ok()) {
          return EnqueueCompletion(epilogue, [p, done = std::move(done)](absl::Status) {
            done(p);
          });
        }
      }
      return EnqueueCompletion(epilogue, std::move(done));
    }
    // A bigger pool than seen so far: the bitmap grows once (after the
    // stream's earlier work, which may still read the old one).
    const int64_t bitmap_bytes = std::max<int64_t>(4, BitmapBytes(pool.num_slots));
    if (bitmap_bytes > bitmap_bytes_) {
      RETURN_IF_ERROR(CudaStatus(StreamSynchronize(stream_), "queue sync"));
      RETURN_IF_ERROR(EnsureBitmap(pool.num_slots, &bitmap_, &bitmap_bytes_));
    }
    const int entry = TakeEntry();
    Pending pending;
    pending.entry = entry;
    pending.update = true;
    pending.slots = in.slots;
    pending.num_slots = pool.num_slots;
    pending.done = std::move(done);
    // From here on the update has its place in the order: CUDA and
    // prologue errors become its status (and nothing more is enqueued).
    absl::Status st = prologue ? prologue(stream_, abort_word_) : absl::OkStatus();
    if (st.ok()) {
      int rc = MemsetAsync(errors_, 0x7f, kErrorBytes, stream_);
      if (rc == 0) rc = MemsetAsync(bitmap_, 0, bitmap_bytes, stream_);
      st = CudaStatus(rc, "reset validation");
    }
    if (st.ok()) {
      st = EnqueueInputValidation(layout, pool, in.batch, 1, in.slots, in.dtype, in.q, in.k, in.v,
                                  in.g, in.beta, bitmap_, errors_, stream_, abort_word_);
    }
    if (st.ok()) {
      st = EnqueueRecurrenceOn(*m, pool, layer, in.batch, 1, in.slots, in.dtype, in.q, in.k, in.v,
                               in.g, in.beta, in.o, errors_, RecurrenceStart::kEarlyHeads,
                               options_, stream_);
    }
    if (st.ok()) {
      st = CudaStatus(CopyDeviceToHostAsync(host_errors_ + entry * kNumValidationFields,
                                                errors_, kErrorBytes, stream_),
                      "read errors");
    }
    pending.status = st;
    Finish(std::move(pending), epilogue);
    return absl::OkStatus();
  }

  absl::Status EnqueueCompletion(const Epilogue& epilogue, Done done) override {
    Pending pending;
    pending.entry = TakeEntry();
    pending.done = std::move(done);
    Finish(std::move(pending), epilogue);
    return absl::OkStatus();
  }

  void Drain() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return queue_.empty() && !running_; });
  }

 private:
  // Updates (pinned blocks, events) in flight at most; the producer waits
  // for a free entry beyond that.
  static constexpr int kRing = 256;

  struct Pending {
    int entry = 0;
    bool update = false;
    const int32_t* slots = nullptr;  // device; read only for an error message
    int64_t num_slots = 0;
    absl::Status status;  // an enqueue or epilogue error, else the block decides
    bool event_ok = false;
    Done done;
  };

  explicit CudaDecodeQueue(const LaunchOptions& options) : options_(options) {}

  int TakeEntry() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return in_flight_ < kRing; });
    ++in_flight_;
    const int e = next_entry_;
    next_entry_ = (next_entry_ + 1) % kRing;
    return e;
  }

  // Epilogue, event, hand-off to the completion thread.
  void Finish(Pending pending, const Epilogue& epilogue) {
    if (epilogue) {
      absl::Status e = epilogue(stream_);
      if (pending.status.ok()) pending.status = e;
    }
    absl::Status ev = CudaStatus(EventRecord(events_[pending.entry], stream_), "record event");
    if (pending.status.ok()) pending.status = ev;
    pending.event_ok = ev.ok();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(pending));
    }
    cv_.notify_all();
  }

  void CompletionLoop() {
    for (;;) {
      Pending p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty() || stop_; });
        if (queue_.empty()) return;
        p = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
      }
      // Entries complete in order (one stream): this event also covers the
      // block copy and the epilogue of this update.
      absl::Status st = p.status;
      const absl::Status synced = CudaStatus(
          p.event_ok ? EventSynchronize(events_[p.entry]) : StreamSynchronize(stream_),
          "queue completion");
      if (st.ok()) st = synced;
      if (st.ok() && p.update) {
        int32_t e[kNumValidationFields];
        std::memcpy(e, host_errors_ + p.entry * kNumValidationFields, sizeof(e));
        st = e[kErrAborted] != kNoError
                 ? absl::AbortedError("aborted by the queue's prologue before it ran; nothing "
                                      "was written")
                 : ErrorBlockStatus(e, p.slots, nullptr, p.num_slots, 0,
                              [](const int32_t* arr, int32_t i) -> std::string {
                                int32_t v = 0;
                                if (CopyDeviceToHost(&v, arr + i, 4) != 0) return "?";
                                return absl::StrCat(v);
                              });
      }
      if (p.done) p.done(std::move(st));
      {
        std::lock_guard<std::mutex> lock(mu_);
        --in_flight_;
        running_ = false;
      }
      cv_.notify_all();
    }
  }

  void* stream_ = nullptr;
  int32_t* errors_ = nullptr;       // device [kNumValidationFields]
  int32_t* host_errors_ = nullptr;  // pinned [kRing][kNumValidationFields]
  uint32_t* bitmap_ = nullptr;      // device slot bitmap (producer thread only)
  void* abort_word_ = nullptr;      // device float, 0 until a prologue aborts
  int64_t bitmap_bytes_ = 0;
  void* events_[kRing] = {};
  std::thread thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;  // enqueued, not yet completed (guarded by mu_)
  int in_flight_ = 0;          // entries taken, callbacks not yet run
  int next_entry_ = 0;
  bool running_ = false;       // a callback is running
  bool stop_ = false;
  const LaunchOptions options_;  // the backend's
};

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeQueue>> NewCudaDecodeQueue(const LaunchOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDecodeQueue> q, CudaDecodeQueue::Create(options));
  return std::unique_ptr<DecodeQueue>(std::move(q));
}

}  // namespace cuda_internal
}  // namespace statecache
