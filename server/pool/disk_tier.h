// DiskTier: checkpoints as files in a local directory, LRU within a byte
// budget (--disk_checkpoint_dir, --disk_checkpoint_bytes). See
// checkpoint_tier.h for the contract.
//
// One file per checkpoint, named <hash as 16 hex digits>-<num_tokens>-<kind>-
// <digest hex>.ckpt, holding the blob image of checkpoint_blob.h (tags, key,
// sizes, payload, CRC-32). Files are written to a temporary name and
// renamed, so a crash never leaves a half-written file under a real name.
// Take reads the whole file and checks magic, tags, key, sizes and CRC; a
// truncated or corrupted file is logged, deleted, counted in dropped_corrupt
// and reported as kDataLoss: its bytes are never returned.
//
// Create re-indexes the directory (a restarted server registering the same
// model again): files whose header names the same tags are indexed (oldest
// modification time = least recently used), files with other tags or an
// unreadable header are deleted, and the budget is enforced.
//
//   ASSIGN_OR_RETURN(auto disk, DiskTier::Create("/var/cache/sc/qwen", tags, 8 << 30));
#ifndef STATECACHE_SERVER_POOL_DISK_TIER_H_
#define STATECACHE_SERVER_POOL_DISK_TIER_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "server/pool/checkpoint_tier.h"

namespace statecache {

class DiskTier : public CheckpointTier {
 public:
  // Creates `dir` (and its parents) when missing and re-indexes it.
  // kInvalidArgument for an empty dir or capacity_bytes < 1; kUnavailable when
  // the directory cannot be created or listed.
  // `log` receives one line per dropped file (event, details); stderr when empty.
  using LogFn = std::function<void(absl::string_view event, absl::string_view details)>;
  static absl::StatusOr<std::unique_ptr<DiskTier>> Create(std::string dir, std::string tags,
                                                          int64_t capacity_bytes,
                                                          LogFn log = nullptr);

  StoreTier tier() const override { return StoreTier::kDisk; }
  absl::Status Put(CheckpointBlob blob, std::vector<CheckpointBlob>* evicted) override;
  bool LongestHeld(absl::Span<const PrefixKey> candidates, PrefixKey* best) const override;
  absl::StatusOr<CheckpointBlob> Take(const PrefixKey& key) override;
  TierUse use() const override;

  // The file that holds (or would hold) `key`.
  std::string PathOf(const PrefixKey& key) const;
  // Keys held, most recently used first (tests).
  std::vector<PrefixKey> KeysByRecency() const;

 private:
  struct File {
    PrefixKey key;
    int64_t bytes = 0;  // blob bytes charged (packed + aux)
  };
  DiskTier(std::string dir, std::string tags, int64_t capacity_bytes, LogFn log)
      : dir_(std::move(dir)),
        tags_(std::move(tags)),
        capacity_bytes_(capacity_bytes),
        log_(std::move(log)) {}
  void Log(absl::string_view event, absl::string_view details) const;
  absl::Status Reindex();
  void Remove(std::list<File>::iterator it);

  const std::string dir_;
  const std::string tags_;
  const int64_t capacity_bytes_;
  const LogFn log_;
  int64_t bytes_ = 0;
  int64_t evictions_ = 0;
  int64_t dropped_corrupt_ = 0;
  std::list<File> lru_;  // front = most recently used
  absl::flat_hash_map<PrefixKey, std::list<File>::iterator> index_;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_DISK_TIER_H_
