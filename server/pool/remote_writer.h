// RemoteWriter: writes checkpoints to the remote tier on a background thread
// (write-through of snapshots, checkpoint_store.h), so a Snapshot never
// waits for Redis.
//
// The queue is bounded in bytes (CheckpointBlob::bytes(), the host copies it
// holds): a blob that does not fit is dropped at once (the newest is
// dropped, so the caller can skip its copy: Admit) and counted in
// dropped_full. Writes go out in queue order, one at a time, through the
// tier's Put (which bounds each by its own timeout and never fails for the
// caller). Destruction drains: it waits up to `drain_timeout` for the queue
// to empty (plus the write in flight, bounded by the tier's timeout), then
// drops what is left (counted in dropped_shutdown) and joins the thread.
//
// Thread-safe.
//
//   RemoteWriter writer(remote_tier, RemoteWriterOptions{});
//   if (writer.Admit(bytes)) writer.Enqueue(std::move(blob));  // never blocks
#ifndef STATECACHE_SERVER_POOL_REMOTE_WRITER_H_
#define STATECACHE_SERVER_POOL_REMOTE_WRITER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/pool/checkpoint_tier.h"

namespace statecache {

struct RemoteWriterOptions {
  // Bytes of blobs queued and not yet written (>= 1).
  int64_t max_queued_bytes = int64_t{512} << 20;
  // How long destruction waits for the queue to drain.
  absl::Duration drain_timeout = absl::Seconds(2);
};

struct RemoteWriterStats {
  int64_t written = 0;           // blobs handed to the tier's Put
  int64_t dropped_full = 0;      // blobs refused because the queue was full
  int64_t dropped_shutdown = 0;  // blobs still queued when the drain timed out
  int64_t queued = 0;            // blobs waiting now
  int64_t queued_bytes = 0;      // their bytes
};

class RemoteWriter {
 public:
  // `tier` must be thread-safe (the remote tier is). Starts the thread.
  RemoteWriter(std::shared_ptr<CheckpointTier> tier, RemoteWriterOptions options);
  ~RemoteWriter();
  RemoteWriter(const RemoteWriter&) = delete;
  RemoteWriter& operator=(const RemoteWriter&) = delete;

  // True when a blob of `bytes` fits in the queue now; false counts a drop
  // in dropped_full (the caller then does not copy or enqueue it).
  bool Admit(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `blob`; false (counted in dropped_full) when it does not fit.
  bool Enqueue(CheckpointBlob blob) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until nothing is queued or being written; false on timeout.
  bool WaitIdle(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  RemoteWriterStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::shared_ptr<CheckpointTier> tier_;
  const RemoteWriterOptions options_;
  mutable absl::Mutex mu_;
  std::deque<CheckpointBlob> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  RemoteWriterStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_REMOTE_WRITER_H_
