// RedisTier: checkpoints in a Redis node or a Redis Cluster (hiredis through
// RedisRouter), the remote tier below the disk tier. See checkpoint_tier.h
// for the contract.
//
// Key: "sc:" + 16 hex digits of a hash of the tags + ":" + hash (hex) + ":" +
// num_tokens + ":" + kind + ":" + hex(digest) (every PrefixKey field; the
// server already salts keys by tenant). One key per checkpoint, so keys carry
// no {hash tag} and spread over a cluster's nodes. Value: the blob image of
// checkpoint_blob.h (tags + CRC), stored with SET ... EX ttl_s.
//
// Shared by servers: Take leaves the key in Redis (STRLEN, then GET +
// EXPIRE ttl_s pipelined: a hit refreshes the TTL), so every server sharing
// the node can restore the same checkpoint; Redis' TTL (and its maxmemory
// policy) bound its life. The blob's CRC, tags and key are checked on every
// Take; a corrupt or foreign blob is deleted (DEL), counted in
// dropped_corrupt and reported as kDataLoss, never returned.
// Put of a blob with `remote_written` set (a copy was already written
// through, checkpoint_store.h) first sends EXPIRE ttl_s: when the key is
// still there its TTL is refreshed and the bytes are not sent again
// (resends_skipped()); when it expired (EXPIRE replies 0) the blob is SET.
//
// LongestHeld asks Redis (EXISTS per candidate, pipelined per node), so
// servers sharing Redis find each other's checkpoints. There is no local
// index and no LRU budget; Put never evicts into `evicted`. use().entries /
// bytes count the blobs this server SET (a refresh or a Take changes
// nothing; a corrupt blob it deletes is subtracted); Redis expires them
// without telling this server.
//
// Redis down or slow only turns hits into misses. Timeouts: connect and the
// small commands (EXISTS, STRLEN, EXPIRE, DEL) have `timeout_ms`; a SET or
// GET of n bytes has timeout_ms + n / min_transfer_mib_per_s (a floor plus
// the transfer at the slowest acceptable bandwidth), so large checkpoints
// are not dropped by a timeout meant for lookups. A failure drops that
// node's connection and counts in use().errors; after `breaker_failures`
// consecutive failures the node is skipped for `breaker_cooldown_ms` (its
// keys: LongestHeld false, Take kNotFound, Put dropped). Put reports success
// even when the write failed (the blob is dropped, as the last tier's
// evictions are).
//
// Thread-safe (one lock around every call): the checkpoint store and its
// write-through writer call it outside the store's lock.
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
  // Connect and small commands (EXISTS / STRLEN / EXPIRE / DEL), milliseconds;
  // also the floor of a transfer's timeout.
  int timeout_ms = 20;
  // The slowest transfer accepted, MiB/s: a SET / GET of n bytes times out
  // after timeout_ms + n / (min_transfer_mib_per_s * 2^20) seconds. 64 MiB/s
  // is about a third of the slowest loopback rate measured on a loaded
  // 2-core machine (docs/BENCHMARKS.md, "Remote (Redis) checkpoint tier").
  double min_transfer_mib_per_s = 64;
  int breaker_failures = 3;
  int breaker_cooldown_ms = 1000;
};

class RedisTier : public CheckpointTier {
 public:
  // kInvalidArgument naming the option for an empty host, a port outside
  // 1..65535, ttl_s < 1, timeout_ms < 1, min_transfer_mib_per_s <= 0,
  // breaker_failures < 1 or breaker_cooldown_ms < 0. Does not connect (the first command does).
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
  // Puts of `remote_written` blobs whose key was still held (TTL refreshed,
  // bytes not sent again).
  int64_t resends_skipped() const ABSL_LOCKS_EXCLUDED(mu_);
  // The timeout of a SET / GET moving `bytes`, milliseconds.
  int TransferTimeoutMs(int64_t bytes) const;
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
  int64_t entries_ ABSL_GUARDED_BY(mu_) = 0;  // SET by this server minus deleted corrupt, >= 0
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;    // their blob bytes, >= 0
  int64_t dropped_corrupt_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t resends_skipped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_REDIS_TIER_H_
