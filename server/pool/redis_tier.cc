#include "server/pool/redis_tier.h"

#include <hiredis/hiredis.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
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

timeval Tv(int ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisTier>> RedisTier::Create(std::string tags,
                                                             RedisTierOptions options) {
  if (options.host.empty() || options.port < 1 || options.port > 65535 || options.ttl_s < 1 ||
      options.timeout_ms < 1 || options.breaker_failures < 1 || options.breaker_cooldown_ms < 0) {
    return absl::InvalidArgumentError("redis tier: bad options");
  }
  return std::unique_ptr<RedisTier>(new RedisTier(std::move(tags), std::move(options)));
}

absl::Status RedisTier::ParseAddress(const std::string& address, RedisTierOptions* options) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("redis address not host:port: ", address));
  }
  options->host = address.substr(0, colon);
  options->port = port;
  return absl::OkStatus();
}

RedisTier::RedisTier(std::string tags, RedisTierOptions options)
    : tags_(std::move(tags)),
      key_prefix_(absl::StrCat("sc:", absl::Hex(Fnv1a(tags_), absl::kZeroPad16), ":")),
      options_(std::move(options)) {}

RedisTier::~RedisTier() {
  if (ctx_ != nullptr) redisFree(ctx_);
}

std::string RedisTier::RedisKey(const PrefixKey& key) const {
  return absl::StrCat(key_prefix_, absl::Hex(key.hash, absl::kZeroPad16), ":", key.num_tokens,
                      ":", static_cast<int>(key.kind), ":", absl::BytesToHexString(key.digest));
}

void RedisTier::Fail() const {
  ++errors_;
  if (ctx_ != nullptr) {
    redisFree(ctx_);
    ctx_ = nullptr;
  }
  if (++consecutive_failures_ >= options_.breaker_failures) {
    open_until_ = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(options_.breaker_cooldown_ms);
    consecutive_failures_ = 0;
  }
}

void RedisTier::Succeed() const { consecutive_failures_ = 0; }

redisContext* RedisTier::Conn() const {
  if (std::chrono::steady_clock::now() < open_until_) return nullptr;
  if (ctx_ != nullptr) return ctx_;
  redisContext* c = redisConnectWithTimeout(options_.host.c_str(), options_.port,
                                            Tv(options_.timeout_ms));
  if (c == nullptr || c->err != 0 || redisSetTimeout(c, Tv(options_.timeout_ms)) != REDIS_OK) {
    if (c != nullptr) redisFree(c);
    Fail();
    return nullptr;
  }
  ctx_ = c;
  return ctx_;
}

absl::Status RedisTier::Put(CheckpointBlob blob, std::vector<CheckpointBlob>* /*evicted*/) {
  redisContext* c = Conn();
  if (c == nullptr) return absl::OkStatus();
  const std::string k = RedisKey(blob.key);
  const std::string v = EncodeCheckpointBlob(tags_, blob);
  const std::string ttl = absl::StrCat(options_.ttl_s);
  const char* argv[] = {"SET", k.data(), v.data(), "EX", ttl.data()};
  const size_t lens[] = {3, k.size(), v.size(), 2, ttl.size()};
  auto* r = static_cast<redisReply*>(redisCommandArgv(c, 5, argv, lens));
  if (r == nullptr || r->type == REDIS_REPLY_ERROR) {
    if (r != nullptr) freeReplyObject(r);
    Fail();
    return absl::OkStatus();
  }
  freeReplyObject(r);
  Succeed();
  ++puts_;
  return absl::OkStatus();
}

bool RedisTier::LongestHeld(absl::Span<const PrefixKey> candidates, PrefixKey* best) const {
  if (candidates.empty()) return false;
  redisContext* c = Conn();
  if (c == nullptr) return false;
  for (const PrefixKey& key : candidates) {
    const std::string k = RedisKey(key);
    const char* argv[] = {"EXISTS", k.data()};
    const size_t lens[] = {6, k.size()};
    if (redisAppendCommandArgv(c, 2, argv, lens) != REDIS_OK) {
      Fail();
      return false;
    }
  }
  bool found = false;
  for (const PrefixKey& key : candidates) {
    void* raw = nullptr;
    if (redisGetReply(c, &raw) != REDIS_OK || raw == nullptr) {
      Fail();
      return false;
    }
    auto* r = static_cast<redisReply*>(raw);
    const bool held = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
    freeReplyObject(r);
    if (held && (!found || key.num_tokens > best->num_tokens)) {
      *best = key;
      found = true;
    }
  }
  Succeed();
  return found;
}

absl::StatusOr<CheckpointBlob> RedisTier::Take(const PrefixKey& key) {
  redisContext* c = Conn();
  if (c == nullptr) return absl::NotFoundError("redis tier unavailable");
  const std::string k = RedisKey(key);
  const char* get[] = {"GET", k.data()};
  const size_t get_lens[] = {3, k.size()};
  const char* del[] = {"DEL", k.data()};
  const size_t del_lens[] = {3, k.size()};
  if (redisAppendCommandArgv(c, 2, get, get_lens) != REDIS_OK ||
      redisAppendCommandArgv(c, 2, del, del_lens) != REDIS_OK) {
    Fail();
    return absl::NotFoundError("redis tier unavailable");
  }
  void* raw_get = nullptr;
  void* raw_del = nullptr;
  if (redisGetReply(c, &raw_get) != REDIS_OK || redisGetReply(c, &raw_del) != REDIS_OK) {
    if (raw_get != nullptr) freeReplyObject(raw_get);
    Fail();
    return absl::NotFoundError("redis tier unavailable");
  }
  freeReplyObject(raw_del);
  auto* r = static_cast<redisReply*>(raw_get);
  if (r->type != REDIS_REPLY_STRING) {
    freeReplyObject(r);
    Succeed();
    return absl::NotFoundError("not held in redis");
  }
  std::string image(r->str, r->len);
  freeReplyObject(r);
  Succeed();
  absl::StatusOr<CheckpointBlob> blob = DecodeCheckpointBlob(tags_, image);
  if (!blob.ok() || blob->key != key) {
    ++dropped_corrupt_;
    return absl::DataLossError(absl::StrCat("redis checkpoint ", k, " corrupt: ",
                                            blob.ok() ? "key mismatch" : blob.status().message()));
  }
  return blob;
}

TierUse RedisTier::use() const {
  TierUse u;
  u.entries = 0;  // not tracked: Redis holds what it holds (TTL)
  u.dropped_corrupt = dropped_corrupt_;
  return u;
}

}  // namespace statecache
