// UpdatePhases: where the server's time goes in Updates of inline bytes (a
// debug stat for benchmarks: tests/load/update_echo_bench prints it). Each
// phase accumulates calls and wall nanoseconds; lock-free, thread-safe.
//
//   checks   request checks: shapes, finite / L2 / |v| / gate values (host)
//   slots    attach check and slot acquisition
//   stage    packing the inputs into one host staging block
//   backend  the backend call: copy in, validation, kernel, copy out, wait
//            (CPU backend in place: the kernel alone)
//   copy_out o from the host staging block into the response
//   total    the whole operation (ops::Update), the above and the rest
//
// Coalesced Updates record checks, slots and total only.
#ifndef STATECACHE_SERVER_CORE_UPDATE_PHASES_H_
#define STATECACHE_SERVER_CORE_UPDATE_PHASES_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"

namespace statecache {

class UpdatePhases {
 public:
  enum Phase { kChecks, kSlots, kStage, kBackend, kCopyOut, kTotal, kNumPhases };
  static const char* Name(Phase p) {
    static const char* const kNames[kNumPhases] = {"checks", "slots",    "stage",
                                                   "backend", "copy_out", "total"};
    return kNames[p];
  }

  void Add(Phase p, absl::Duration d) {
    calls_[p].fetch_add(1, std::memory_order_relaxed);
    nanos_[p].fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_relaxed);
  }
  // Mean microseconds per call of `p` so far (0 without calls) and calls.
  double MeanMicros(Phase p) const {
    const int64_t n = calls_[p].load(std::memory_order_relaxed);
    return n == 0 ? 0 : nanos_[p].load(std::memory_order_relaxed) / 1e3 / n;
  }
  int64_t Calls(Phase p) const { return calls_[p].load(std::memory_order_relaxed); }
  void Reset() {
    for (int p = 0; p < kNumPhases; ++p) {
      calls_[p].store(0, std::memory_order_relaxed);
      nanos_[p].store(0, std::memory_order_relaxed);
    }
  }

 private:
  std::array<std::atomic<int64_t>, kNumPhases> calls_{};
  std::array<std::atomic<int64_t>, kNumPhases> nanos_{};
};

// Adds the time since construction (or the last Lap) to phase p of
// `phases` (null: does nothing, reads no clock).
class PhaseClock {
 public:
  explicit PhaseClock(UpdatePhases* phases)
      : phases_(phases), last_(phases != nullptr ? absl::Now() : absl::InfinitePast()) {}
  void Lap(UpdatePhases::Phase p) {
    if (phases_ == nullptr) return;
    const absl::Time now = absl::Now();
    phases_->Add(p, now - last_);
    last_ = now;
  }

 private:
  UpdatePhases* phases_;
  absl::Time last_;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_CORE_UPDATE_PHASES_H_
