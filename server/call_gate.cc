#include "server/call_gate.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace statecache {

CallGate::CallGate(std::function<absl::Time()> clock) : clock_(std::move(clock)) {}

CallGate::Ticket::Ticket(CallGate* gate, std::function<void()> cancel)
    : gate_(gate), cancel_(std::move(cancel)), admitted_([gate] {
        absl::MutexLock lock(&gate->mu_);
        gate->last_arrival_ = gate->Now();
        if (gate->draining_) return false;
        ++gate->running_;
        return true;
      }()) {}

CallGate::Ticket::~Ticket() {
  if (!admitted_) return;
  absl::MutexLock lock(&gate_->mu_);
  --gate_->running_;
}

bool CallGate::Ticket::Idle(absl::FunctionRef<bool()> read, bool* got) {
  *got = false;
  {
    absl::MutexLock lock(&gate_->mu_);
    if (gate_->draining_) return false;
    --gate_->running_;
    gate_->idle_.insert(this);
  }
  *got = read();
  absl::MutexLock lock(&gate_->mu_);
  gate_->idle_.erase(this);
  ++gate_->running_;
  if (*got) gate_->last_arrival_ = gate_->Now();
  return !gate_->draining_;
}

void CallGate::BeginDrain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool CallGate::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

int64_t CallGate::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

bool CallGate::AwaitQuiet(absl::Duration quiet, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    const absl::Time now = Now();
    if (running_ == 0 && now - last_arrival_ >= quiet) return true;
    if (now >= deadline) return false;
    if (running_ > 0) {
      // Until the running calls finish (or the deadline).
      mu_.AwaitWithTimeout(absl::Condition(this, &CallGate::NoneRunningLocked),
                           deadline - now);
    } else {
      // Until the quiet period would end (a call may arrive meanwhile).
      const absl::Duration wait = std::min(last_arrival_ + quiet, deadline) - now;
      mu_.Unlock();
      absl::SleepFor(std::max(wait, absl::Milliseconds(1)));
      mu_.Lock();
    }
  }
}

int CallGate::CancelIdleStreams() {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const Ticket* t : idle_) {
    if (t->cancel_) {
      t->cancel_();
      ++n;
    }
  }
  return n;
}

}  // namespace statecache
