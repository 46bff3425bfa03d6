// RedisTier: checkpoints in a Redis node or a Redis Cluster (hiredis through
// RedisRouter), the remote tier below the disk tier. See checkpoint_tier.h
// for the contract.
//
// Key: "sc:" + 16 hex digits of a hash of the tags + ":" + hash (hex) + ":" +
// num_tokens + ":" + kind + ":" + hex(digest) (every PrefixKey field; the
// server already salts keys by tenant). One key per checkpoint, so keys carry
// no {hash tag} and spread over a cluster's nodes. Value: the blob image of
// checkpoint_blob.h (tags + CRC), stored with SET ... EX ttl_s. Take GETs
// and DELs the key and decodes it; a corrupt or foreign blob is deleted,
// counted in dropped_corrupt and reported as kDataLoss, never returned.
//
// LongestHeld asks Redis (EXISTS per candidate, pipelined per node), so
// servers sharing Redis find each other's checkpoints. There is no local
// index and no LRU budget: Redis' TTL (and its maxmemory policy) bound what
// it holds; Put never evicts into `evicted`. use() counts what this server
// wrote minus what it took (checkpoint_tier.h, TierUse).
//
// Redis down or slow only turns hits into misses: every connect / command
// has `timeout_ms`; a failure drops that node's connection and counts in
// use().errors; after `breaker_failures` consecutive failures the node is
// skipped for `breaker_cooldown_ms` (its keys: LongestHeld false, Take
// kNotFound, Put dropped). Put reports success even when the write failed
// (the blob is dropped, as the last tier's evictions are).
//
// Thread-safe (one lock around every call): the checkpoint store writes to
// it outside its own lock while other calls look up under it.
#ifndef STATECACHE_SERVER_POOL_REDIS_TIER_H_
#define STATECACHE_SERVER_POOL_REDIS_TIER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/pool/checkpoint_tier.h"
#include "server/pool/redis_router.h"

namespace statecache {

struct RedisTierOptions {
  // Single mode: host:port. Cluster mode (`cluster_seeds` non-empty): host /
  // port are unused and the slot map is asked of the seeds.
  std::string host = "127.0.0.1";
  int port = 6379;
  std::vector<RedisAddress> cluster_seeds;
  int64_t ttl_s = 3600;
  // Per connect / pipeline; must cover one checkpoint's SET / GET (docs/BENCHMARKS.md).
  int timeout_ms = 20;
  int breaker_failures = 3;
  int breaker_cooldown_ms = 1000;
};

class RedisTier : public CheckpointTier {
 public:
  // kInvalidArgument naming the option for an empty host, a port outside
  // 1..65535, ttl_s < 1, timeout_ms < 1, breaker_failures < 1 or
  // breaker_cooldown_ms < 0. Does not connect (the first command does).
  static absl::StatusOr<std::unique_ptr<RedisTier>> Create(std::string tags,
                                                           RedisTierOptions options);
  // "host:port" -> options.host / options.port; kInvalidArgument otherwise.
  static absl::Status ParseAddress(const std::string& address, RedisTierOptions* options);

  StoreTier tier() const override { return StoreTier::kRemote; }
  absl::Status Put(CheckpointBlob blob, std::vector<CheckpointBlob>* evicted) override;
  bool LongestHeld(absl::Span<const PrefixKey> candidates, PrefixKey* best) const override;
  absl::StatusOr<CheckpointBlob> Take(const PrefixKey& key) override;
  TierUse use() const override;

  // The Redis key of `key` (tests corrupt values through it).
  std::string RedisKey(const PrefixKey& key) const;
  // Failed connects / commands so far (= use().errors).
  int64_t errors() const ABSL_LOCKS_EXCLUDED(mu_);
  // The node ("host:port") holding `key` by the current slot map (tests).
  std::string NodeOf(const PrefixKey& key) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  RedisTier(std::string tags, RedisTierOptions options);

  const std::string tags_;
  const std::string key_prefix_;
  const RedisTierOptions options_;
  mutable absl::Mutex mu_;
  // Non-const calls from const methods, always under mu_.
  const std::unique_ptr<RedisRouter> router_ ABSL_PT_GUARDED_BY(mu_);
  int64_t entries_ ABSL_GUARDED_BY(mu_) = 0;  // written minus taken, >= 0
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;    // blob bytes written minus taken, >= 0
  int64_t dropped_corrupt_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_REDIS_TIER_H_
