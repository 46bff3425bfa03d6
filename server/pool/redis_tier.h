// RedisTier: checkpoints in one Redis node (hiredis), the remote tier below
// the disk tier. See checkpoint_tier.h for the contract.
//
// Key: "sc:" + 16 hex digits of a hash of the tags + ":" + hash (hex) + ":" +
// num_tokens + ":" + kind + ":" + hex(digest) (every PrefixKey field; the
// server already salts keys by tenant). Value: the blob image of
// checkpoint_blob.h (tags + CRC), stored with SET ... EX ttl_s. Take GETs
// and DELs the key and decodes it; a corrupt or foreign blob is deleted, counted in
// dropped_corrupt and reported as kDataLoss, never returned.
//
// LongestHeld asks Redis (one pipelined EXISTS per candidate), so servers
// sharing a node find each other's checkpoints. There is no local index and
// no LRU budget: Redis' TTL (and its maxmemory policy) bound what it holds;
// Put never evicts into `evicted`.
//
// Redis down or slow only turns hits into misses: every connect / command
// has `timeout_ms`; a failure drops the connection and counts in errors();
// after `breaker_failures` consecutive failures Redis is skipped for
// `breaker_cooldown_ms` (LongestHeld false, Take kNotFound, Put returns OK
// without storing). Put reports success even when the write failed (the
// blob is dropped, as the last tier's evictions are).
#ifndef STATECACHE_SERVER_POOL_REDIS_TIER_H_
#define STATECACHE_SERVER_POOL_REDIS_TIER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/pool/checkpoint_tier.h"

struct redisContext;

namespace statecache {

struct RedisTierOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  int64_t ttl_s = 3600;
  int timeout_ms = 20;
  int breaker_failures = 3;
  int breaker_cooldown_ms = 1000;
};

class RedisTier : public CheckpointTier {
 public:
  // kInvalidArgument for an empty host, a port outside 1..65535, ttl_s < 1 or
  // timeout_ms < 1. Does not connect (the first command does).
  static absl::StatusOr<std::unique_ptr<RedisTier>> Create(std::string tags,
                                                           RedisTierOptions options);
  // "host:port" -> options.host / options.port; kInvalidArgument otherwise.
  static absl::Status ParseAddress(const std::string& address, RedisTierOptions* options);
  ~RedisTier() override;

  // Reported as the disk tier on the wire (no remote StoreTier value yet).
  StoreTier tier() const override { return StoreTier::kDisk; }
  absl::Status Put(CheckpointBlob blob, std::vector<CheckpointBlob>* evicted) override;
  bool LongestHeld(absl::Span<const PrefixKey> candidates, PrefixKey* best) const override;
  absl::StatusOr<CheckpointBlob> Take(const PrefixKey& key) override;
  TierUse use() const override;

  // The Redis key of `key` (tests corrupt values through it).
  std::string RedisKey(const PrefixKey& key) const;
  // Failed connects / commands so far.
  int64_t errors() const { return errors_; }

 private:
  RedisTier(std::string tags, RedisTierOptions options);
  // A live connection, or nullptr (breaker open or connect failed).
  redisContext* Conn() const;
  void Fail() const;
  void Succeed() const;

  const std::string tags_;
  const std::string key_prefix_;
  const RedisTierOptions options_;
  mutable redisContext* ctx_ = nullptr;
  mutable int64_t errors_ = 0;
  mutable int consecutive_failures_ = 0;
  mutable std::chrono::steady_clock::time_point open_until_{};
  int64_t puts_ = 0;
  int64_t dropped_corrupt_ = 0;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_REDIS_TIER_H_
