#include "server/pool/redis_tier.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/pool/checkpoint_blob.h"

namespace statecache {
namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

RedisRouterOptions RouterOptions(const RedisTierOptions& o) {
  RedisRouterOptions r;
  if (o.cluster_seeds.empty()) {
    r.seeds = {RedisAddress{o.host, o.port}};
  } else {
    r.seeds = o.cluster_seeds;
    r.cluster = true;
  }
  r.timeout_ms = o.timeout_ms;
  r.breaker_failures = o.breaker_failures;
  r.breaker_cooldown_ms = o.breaker_cooldown_ms;
  return r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisTier>> RedisTier::Create(std::string tags,
                                                             RedisTierOptions options) {
  auto bad = [](absl::string_view field, auto value) {
    return absl::InvalidArgumentError(absl::StrCat("redis tier: ", field, " ", value, " invalid"));
  };
  if (options.cluster_seeds.empty()) {
    if (options.host.empty()) return bad("host", "(empty)");
    if (options.port < 1 || options.port > 65535) return bad("port", options.port);
  }
  for (const RedisAddress& a : options.cluster_seeds) {
    if (a.host.empty() || a.port < 1 || a.port > 65535) return bad("cluster seed", a.ToString());
  }
  if (options.ttl_s < 1) return bad("ttl_s", options.ttl_s);
  if (options.timeout_ms < 1) return bad("timeout_ms", options.timeout_ms);
  if (!(options.min_transfer_mib_per_s > 0)) {
    return bad("min_transfer_mib_per_s", options.min_transfer_mib_per_s);
  }
  if (options.breaker_failures < 1) return bad("breaker_failures", options.breaker_failures);
  if (options.breaker_cooldown_ms < 0)
    return bad("breaker_cooldown_ms", options.breaker_cooldown_ms);
  return std::unique_ptr<RedisTier>(new RedisTier(std::move(tags), std::move(options)));
}

absl::Status RedisTier::ParseAddress(const std::string& address, RedisTierOptions* options) {
  RedisAddress a;
  absl::Status s = ParseRedisAddress(address, "redis_checkpoint_address", &a);
  if (!s.ok()) return s;
  options->host = a.host;
  options->port = a.port;
  return absl::OkStatus();
}

RedisTier::RedisTier(std::string tags, RedisTierOptions options)
    : tags_(std::move(tags)),
      key_prefix_(absl::StrCat("sc:", absl::Hex(Fnv1a(tags_), absl::kZeroPad16), ":")),
      options_(std::move(options)),
      router_(std::make_unique<RedisRouter>(RouterOptions(options_))) {}

std::string RedisTier::RedisKey(const PrefixKey& key) const {
  return absl::StrCat(key_prefix_, absl::Hex(key.hash, absl::kZeroPad16), ":", key.num_tokens, ":",
                      static_cast<int>(key.kind), ":", absl::BytesToHexString(key.digest));
}

int RedisTier::TransferTimeoutMs(int64_t bytes) const {
  const double ms = options_.timeout_ms +
                    1000.0 * static_cast<double>(bytes) /
                        (options_.min_transfer_mib_per_s * 1024.0 * 1024.0);
  return static_cast<int>(std::min(ms, 3600.0 * 1000));
}

absl::Status RedisTier::Put(CheckpointBlob blob, std::vector<CheckpointBlob>* /*evicted*/) {
  const std::string k = RedisKey(blob.key);
  const std::string ttl = absl::StrCat(options_.ttl_s);
  if (blob.remote_written) {  // written through already: refresh, resend only when gone
    absl::MutexLock lock(&mu_);
    const std::vector<RedisReply> r = router_->Run({{"EXPIRE", k, ttl}});
    if (r[0].type == RedisReply::Type::kFailed) return absl::OkStatus();  // dropped
    if (r[0].type == RedisReply::Type::kInteger && r[0].integer == 1) {
      ++resends_skipped_;
      return absl::OkStatus();
    }
  }
  const std::string v = EncodeCheckpointBlob(tags_, blob);
  absl::MutexLock lock(&mu_);
  const std::vector<RedisReply> r =
      router_->Run({{"SET", k, v, "EX", ttl}}, TransferTimeoutMs(static_cast<int64_t>(v.size())));
  if (r[0].type == RedisReply::Type::kStatus) {
    ++entries_;
    bytes_ += blob.bytes();
  }
  return absl::OkStatus();
}

bool RedisTier::LongestHeld(absl::Span<const PrefixKey> candidates, PrefixKey* best) const {
  if (candidates.empty()) return false;
  std::vector<std::string> keys;
  keys.reserve(candidates.size());
  for (const PrefixKey& key : candidates) keys.push_back(RedisKey(key));
  std::vector<RedisRouter::Command> cmds;
  for (const std::string& k : keys) cmds.push_back({"EXISTS", k});
  absl::MutexLock lock(&mu_);
  const std::vector<RedisReply> r = router_->Run(cmds);
  bool found = false;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const bool held = r[i].type == RedisReply::Type::kInteger && r[i].integer > 0;
    if (held && (!found || candidates[i].num_tokens > best->num_tokens)) {
      *best = candidates[i];
      found = true;
    }
  }
  return found;
}

absl::StatusOr<CheckpointBlob> RedisTier::Take(const PrefixKey& key) {
  const std::string k = RedisKey(key);
  const std::string ttl = absl::StrCat(options_.ttl_s);
  absl::MutexLock lock(&mu_);
  // STRLEN first: the GET's timeout scales with the value's size.
  std::vector<RedisReply> r = router_->Run({{"STRLEN", k}});
  if (r[0].type == RedisReply::Type::kFailed) return absl::NotFoundError("redis tier unavailable");
  if (r[0].type != RedisReply::Type::kInteger || r[0].integer <= 0) {
    return absl::NotFoundError("not held in redis");
  }
  r = router_->Run({{"GET", k}, {"EXPIRE", k, ttl}}, TransferTimeoutMs(r[0].integer));
  if (r[0].type == RedisReply::Type::kFailed) return absl::NotFoundError("redis tier unavailable");
  if (r[0].type != RedisReply::Type::kString) return absl::NotFoundError("not held in redis");
  absl::StatusOr<CheckpointBlob> blob = DecodeCheckpointBlob(tags_, r[0].str);
  if (!blob.ok() || blob->key != key) {
    router_->Run({{"DEL", k}});  // never served again, here or on another server
    ++dropped_corrupt_;
    entries_ = std::max<int64_t>(0, entries_ - 1);
    bytes_ = std::max<int64_t>(0, bytes_ - static_cast<int64_t>(r[0].str.size()));
    return absl::DataLossError(absl::StrCat("redis checkpoint ", k, " corrupt: ",
                                            blob.ok() ? "key mismatch" : blob.status().message()));
  }
  blob->remote_written = true;  // it stays in Redis
  return blob;
}

int64_t RedisTier::resends_skipped() const {
  absl::MutexLock lock(&mu_);
  return resends_skipped_;
}

int64_t RedisTier::errors() const {
  absl::MutexLock lock(&mu_);
  return router_->errors();
}

std::string RedisTier::NodeOf(const PrefixKey& key) const {
  const std::string k = RedisKey(key);
  absl::MutexLock lock(&mu_);
  return router_->NodeOf(k);
}

TierUse RedisTier::use() const {
  absl::MutexLock lock(&mu_);
  TierUse u;
  u.entries = entries_;
  u.bytes = bytes_;
  u.dropped_corrupt = dropped_corrupt_;
  u.requests = router_->requests();
  u.request_micros = router_->request_micros();
  u.errors = router_->errors();
  return u;
}

}  // namespace statecache
