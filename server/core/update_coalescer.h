// UpdateCoalescer: concurrent Update calls of the same model, layer and
// input dtype merged into one DecodeUpdate launch (continuous batching).
//
// Group commit per (prepared model, pool, layer, dtype): a call that finds
// no launch of its key running launches at once (alone: no added latency at
// low load); calls that arrive while a launch of their key runs queue, and
// when it ends the first of them launches everything queued (up to
// max_batch slots) as one batch. So a call waits at most for the launch
// ahead of it plus its own, and under load the number of launches (CUDA:
// kernel launches, synchronizations, staging copies) drops by the batch
// size. max_delay > 0 additionally holds a launch until max_batch slots are
// queued or max_delay has passed (bounded extra latency for larger batches).
//
// Results are byte-identical to running the calls one by one: every slot of
// a batch is updated by the same per-(slot, head) arithmetic whatever else is
// in the batch (both backends), and callers hold their slots exclusively
// (SlotPool::Acquire), so no two queued calls share a slot. When a merged
// launch fails validation (kInvalidArgument: nothing was written) each call
// runs alone and gets its own status; other errors go to every call of the
// batch. Thread-safe.
//
//   UpdateCoalescer c(backend, &staging, {.max_batch = 256});
//   UpdateCoalescer::Launch launch;
//   RETURN_IF_ERROR(c.Run(*m->prepared, view, layer, host_update, &launch));
#ifndef STATECACHE_SERVER_UPDATE_COALESCER_H_
#define STATECACHE_SERVER_UPDATE_COALESCER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/backend/backend.h"
#include "server/core/host_update.h"
#include "server/pool/staging_cache.h"

namespace statecache {

class UpdateCoalescer {
 public:
  struct Options {
    // Most slots in one launch (a call with more runs alone).
    int max_batch = 256;
    // Extra wait of a launch for more calls while fewer than max_batch slots
    // are queued; zero = launch at once.
    absl::Duration max_delay = absl::ZeroDuration();
  };

  // The launch a call was part of.
  struct Launch {
    int batch = 0;              // slots in the launch
    int calls = 0;              // calls merged into it
    double kernel_seconds = 0;  // its DecodeUpdate wall time
    bool leader = false;        // true for exactly one call per launch
  };

  // `backend` and `staging` must outlive the coalescer.
  UpdateCoalescer(Backend* backend, StagingCache* staging, Options options)
      : backend_(backend), staging_(staging), options_(options) {}
  UpdateCoalescer(const UpdateCoalescer&) = delete;
  UpdateCoalescer& operator=(const UpdateCoalescer&) = delete;

  // Runs `u` (validated; its slots held by the caller until this returns),
  // possibly merged with concurrent calls of the same key. Returns when its
  // o is written (OK) or with its error.
  absl::Status Run(const PreparedModel& model, const PoolView& pool, int layer,
                   const HostUpdate& u, Launch* launch) ABSL_LOCKS_EXCLUDED(groups_mu_);

  // Launches so far and calls they carried (calls / launches = mean merge).
  int64_t launches() const;
  int64_t calls() const;

 private:
  struct Pending {
    const HostUpdate* update = nullptr;
    bool done = false;
    bool lead = false;
    absl::Status status;
    Launch launch;
  };
  struct Group {
    absl::Mutex mu;
    std::deque<Pending*> queue ABSL_GUARDED_BY(mu);  // waiting, in arrival order
    int64_t queued_slots ABSL_GUARDED_BY(mu) = 0;
    bool running ABSL_GUARDED_BY(mu) = false;  // a leader owns the group
  };
  using Key = std::tuple<const PreparedModel*, const uint8_t*, int, int>;

  Group* GroupOf(const Key& key) ABSL_LOCKS_EXCLUDED(groups_mu_);
  // The leader's turn: takes a batch from the front of the queue (the
  // leader's own call first), runs it, completes its calls and hands the
  // group to the next queued call.
  void Lead(Group& g, const PreparedModel& model, const PoolView& pool, int layer)
      ABSL_LOCKS_EXCLUDED(g.mu);
  // Runs the calls as one launch (or each alone after a merged validation
  // failure); sets their status and launch. Returns the launches made.
  int Execute(const std::vector<Pending*>& batch, const PreparedModel& model,
               const PoolView& pool, int layer);

  Backend* const backend_;
  StagingCache* const staging_;
  const Options options_;
  absl::Mutex groups_mu_;
  // One entry per key ever updated (a few per model); never removed.
  absl::flat_hash_map<Key, std::unique_ptr<Group>> groups_ ABSL_GUARDED_BY(groups_mu_);
  mutable absl::Mutex stats_mu_;
  int64_t launches_ ABSL_GUARDED_BY(stats_mu_) = 0;
  int64_t calls_ ABSL_GUARDED_BY(stats_mu_) = 0;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_UPDATE_COALESCER_H_
