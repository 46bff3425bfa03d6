// Test helper: an in-memory remote tier (tier() kRemote) whose Put and
// LongestHeld block, while their gate is armed, until it is released (Take
// never blocks; it removes the entry). Thread-safe.
//
//   auto remote = std::make_shared<GatedRemote>();
//   remote->Arm(GatedRemote::kPut);
//   ... a call that writes to it, on another thread ...
//   ASSERT_TRUE(remote->WaitEntered(GatedRemote::kPut, std::chrono::seconds(5)));
//   remote->Release(GatedRemote::kPut);
#ifndef STATECACHE_SERVER_POOL_TESTING_GATED_REMOTE_H_
#define STATECACHE_SERVER_POOL_TESTING_GATED_REMOTE_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "server/pool/checkpoint_tier.h"

namespace statecache {

class GatedRemote : public CheckpointTier {
 public:
  enum Call { kPut = 0, kLongestHeld = 1 };

  StoreTier tier() const override { return StoreTier::kRemote; }
  absl::Status Put(CheckpointBlob blob, std::vector<CheckpointBlob>*) override {
    std::unique_lock<std::mutex> lock(mu_);
    Pass(kPut, lock);
    ++puts_;
    held_[blob.key] = std::move(blob);
    return absl::OkStatus();
  }
  bool LongestHeld(absl::Span<const PrefixKey> candidates, PrefixKey* best) const override {
    std::unique_lock<std::mutex> lock(mu_);
    Pass(kLongestHeld, lock);
    return LongestHeldIn(held_, candidates, best);
  }
  absl::StatusOr<CheckpointBlob> Take(const PrefixKey& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = held_.find(key);
    if (it == held_.end()) return absl::NotFoundError("not held");
    CheckpointBlob b = std::move(it->second);
    held_.erase(it);
    return b;
  }
  TierUse use() const override {
    std::lock_guard<std::mutex> lock(mu_);
    TierUse u;
    u.entries = static_cast<int64_t>(held_.size());
    return u;
  }
  // A copy of the blob held under `key`, or false.
  bool Held(const PrefixKey& key, CheckpointBlob* out) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = held_.find(key);
    if (it == held_.end()) return false;
    *out = it->second;
    return true;
  }
  int puts() const {
    std::lock_guard<std::mutex> lock(mu_);
    return puts_;
  }
  void Arm(Call c) {
    std::lock_guard<std::mutex> lock(mu_);
    gates_[c] = Gate{true, false, false};
  }
  bool WaitEntered(Call c, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return gates_[c].entered; });
  }
  void Release(Call c) {
    std::lock_guard<std::mutex> lock(mu_);
    gates_[c].released = true;
    cv_.notify_all();
  }

 private:
  struct Gate {
    bool armed = false, entered = false, released = false;
  };
  void Pass(Call c, std::unique_lock<std::mutex>& lock) const {
    Gate& g = gates_[c];
    if (!g.armed) return;
    g.entered = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return g.released; });
  }

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable Gate gates_[2];
  absl::flat_hash_map<PrefixKey, CheckpointBlob> held_;
  int puts_ = 0;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_TESTING_GATED_REMOTE_H_
