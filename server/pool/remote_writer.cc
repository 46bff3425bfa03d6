#include "server/pool/remote_writer.h"

#include <utility>
#include <vector>

namespace statecache {

RemoteWriter::RemoteWriter(std::shared_ptr<CheckpointTier> tier, RemoteWriterOptions options)
    : tier_(std::move(tier)), options_(options), thread_([this] { Loop(); }) {}

RemoteWriter::~RemoteWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&drained), options_.drain_timeout);
    stats_.dropped_shutdown += static_cast<int64_t>(queue_.size());
    queue_.clear();
    stats_.queued = 0;
    stats_.queued_bytes = 0;
  }
  thread_.join();  // after the write in flight, if any
}

bool RemoteWriter::Admit(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (!stopping_ && stats_.queued_bytes + bytes <= options_.max_queued_bytes) return true;
  ++stats_.dropped_full;
  return false;
}

bool RemoteWriter::Enqueue(CheckpointBlob blob) {
  const int64_t bytes = blob.bytes();
  absl::MutexLock lock(&mu_);
  if (stopping_ || stats_.queued_bytes + bytes > options_.max_queued_bytes) {
    ++stats_.dropped_full;
    return false;
  }
  stats_.queued_bytes += bytes;
  ++stats_.queued;
  queue_.push_back(std::move(blob));
  return true;
}

bool RemoteWriter::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !writing_; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

RemoteWriterStats RemoteWriter::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void RemoteWriter::Loop() {
  while (true) {
    CheckpointBlob blob;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, drained or dropped
      blob = std::move(queue_.front());
      queue_.pop_front();
      --stats_.queued;
      stats_.queued_bytes -= blob.bytes();
      writing_ = true;
    }
    std::vector<CheckpointBlob> evicted;  // the last tier: nothing to spill
    (void)tier_->Put(std::move(blob), &evicted);  // a failed write is a dropped blob
    absl::MutexLock lock(&mu_);
    ++stats_.written;
  }
}

}  // namespace statecache
