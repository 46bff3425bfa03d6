// CallGate: admission of RPCs, and the drain before a shutdown.
//
// While serving, every call (unary RPC, client stream, each message of a
// bidirectional stream) holds a Ticket while it runs. BeginDrain() closes the
// gate: calls that arrive afterwards are refused before they do anything (the
// service answers kUnavailable: the call did not run), while running calls
// go on. AwaitQuiet() then waits until no admitted call is running and no call
// arrived for a quiet period (so calls the transport had already accepted
// reach the gate and get their kUnavailable instead of being cut off by the
// gRPC server's shutdown), and CancelIdleStreams() ends the streams that are
// only waiting for their next message, so an idle stream does not hold the
// shutdown for its whole grace period.
//
// Thread-safe.
//
//   CallGate::Ticket ticket(&gate, [ctx] { ctx->TryCancel(); });
//   if (!ticket.admitted()) return Unavailable();
//   bool got;
//   while (ticket.Idle([&] { return stream->Read(&req); }, &got) && got) { ... }
#ifndef STATECACHE_SERVER_CALL_GATE_H_
#define STATECACHE_SERVER_CALL_GATE_H_

#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace statecache {

class CallGate {
 public:
  // One call's admission. Construct at the start of the call; admitted() is
  // false once BeginDrain() ran. An admitted ticket counts as running until
  // it is destroyed, except while inside Idle().
  class Ticket {
   public:
    // `cancel` (optional, streams) ends the call from another thread, e.g.
    // grpc::ServerContext::TryCancel; CancelIdleStreams() calls it while
    // the call is inside Idle().
    explicit Ticket(CallGate* gate, std::function<void()> cancel = nullptr);
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

    bool admitted() const { return admitted_; }

    // Runs `read` (a blocking read of the stream's next message) with the
    // call counted as idle instead of running. *got is read()'s result.
    // Returns false when the gate is draining: before the read (which then
    // does not run, *got = false) or after it (a message read then must be
    // answered as not run). Only on admitted tickets.
    bool Idle(absl::FunctionRef<bool()> read, bool* got);

   private:
    friend class CallGate;
    CallGate* const gate_;
    const std::function<void()> cancel_;
    const bool admitted_;
  };

  // Time source for the quiet period (tests); absl::Now when empty.
  explicit CallGate(std::function<absl::Time()> clock = nullptr);

  // Refuses every call that arrives from now on. Idempotent.
  void BeginDrain() ABSL_LOCKS_EXCLUDED(mu_);
  bool draining() const ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until no admitted call is running (idle streams do not count) and
  // no call or stream message arrived for `quiet`, or until `deadline`.
  // True when it got quiet before the deadline.
  bool AwaitQuiet(absl::Duration quiet, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // Cancels every call that is inside Ticket::Idle(); returns how many.
  int CancelIdleStreams() ABSL_LOCKS_EXCLUDED(mu_);

  // Admitted calls running now (not counting idle streams).
  int64_t running() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Time Now() const { return clock_ ? clock_() : absl::Now(); }
  bool NoneRunningLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; }

  const std::function<absl::Time()> clock_;
  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_arrival_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::flat_hash_set<const Ticket*> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_CALL_GATE_H_
