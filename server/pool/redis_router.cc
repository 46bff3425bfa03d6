#include "server/pool/redis_router.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace statecache {
namespace {

constexpr int kSlots = 16384;

timeval Tv(int ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

uint16_t Crc16(absl::string_view s) {  // CRC16-XMODEM (poly 0x1021, init 0), as Redis Cluster
  uint16_t crc = 0;
  for (unsigned char c : s) {
    crc ^= static_cast<uint16_t>(c) << 8;
    for (int b = 0; b < 8; ++b) {
      crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

RedisReply Convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_NIL:
      out.type = RedisReply::Type::kNil;
      break;
    default:
      out.type = RedisReply::Type::kArray;
      break;
  }
  return out;
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381": true and the
// target when `error` is that redirect.
bool ParseRedirect(absl::string_view error, absl::string_view word, RedisAddress* to) {
  if (!absl::ConsumePrefix(&error, word) || !absl::ConsumePrefix(&error, " ")) return false;
  const size_t space = error.find(' ');
  if (space == absl::string_view::npos) return false;
  return ParseRedisAddress(error.substr(space + 1), "redirect", to).ok();
}

}  // namespace

std::string RedisAddress::ToString() const { return absl::StrCat(host, ":", port); }

absl::Status ParseRedisAddress(absl::string_view text, absl::string_view field, RedisAddress* out) {
  const size_t colon = text.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(text.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", text, "' is not host:port (port 1..65535)"));
  }
  out->host = std::string(text.substr(0, colon));
  out->port = port;
  return absl::OkStatus();
}

absl::Status ParseRedisAddressList(absl::string_view text, absl::string_view field,
                                   std::vector<RedisAddress>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    RedisAddress a;
    absl::Status s = ParseRedisAddress(absl::StripAsciiWhitespace(part), field, &a);
    if (!s.ok()) return s;
    out->push_back(std::move(a));
  }
  if (out->empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": no address"));
  return absl::OkStatus();
}

int RedisKeySlot(absl::string_view key) {
  const size_t open = key.find('{');
  if (open != absl::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != absl::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) % kSlots;
}

RedisRouter::RedisRouter(RedisRouterOptions options) : options_(std::move(options)) {
  for (const RedisAddress& a : options_.seeds) NodeIndex(a);
  if (options_.cluster) slot_owner_.assign(kSlots, -1);
}

RedisRouter::~RedisRouter() {
  for (Node& n : nodes_) {
    if (n.ctx != nullptr) redisFree(n.ctx);
  }
}

int RedisRouter::NodeIndex(const RedisAddress& address) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].address.host == address.host && nodes_[i].address.port == address.port) {
      return static_cast<int>(i);
    }
  }
  nodes_.push_back(Node{address});
  return static_cast<int>(nodes_.size()) - 1;
}

int RedisRouter::OwnerOf(absl::string_view key) const {
  if (!options_.cluster) return 0;
  return slot_owner_[RedisKeySlot(key)];
}

void RedisRouter::Fail(int i) {
  Node& n = nodes_[i];
  ++errors_;
  if (n.ctx != nullptr) {
    redisFree(n.ctx);
    n.ctx = nullptr;
  }
  if (++n.consecutive_failures >= options_.breaker_failures) {
    n.open_until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.breaker_cooldown_ms);
    n.consecutive_failures = 0;
  }
  if (options_.cluster) refresh_due_ = true;  // a failover may have moved its slots
}

redisContext* RedisRouter::Conn(int i) {
  Node& n = nodes_[i];
  if (std::chrono::steady_clock::now() < n.open_until) return nullptr;
  if (n.ctx != nullptr) return n.ctx;
  redisContext* c =
      redisConnectWithTimeout(n.address.host.c_str(), n.address.port, Tv(options_.timeout_ms));
  if (c == nullptr || c->err != 0 || redisSetTimeout(c, Tv(options_.timeout_ms)) != REDIS_OK) {
    if (c != nullptr) redisFree(c);
    Fail(i);
    return nullptr;
  }
  n.ctx = c;
  n.ctx_timeout_ms = options_.timeout_ms;
  return c;
}

bool RedisRouter::LoadSlots(int node) {
  ++requests_;
  redisContext* c = Conn(node);
  if (c == nullptr) return false;
  auto* r = static_cast<redisReply*>(redisCommand(c, "CLUSTER SLOTS"));
  if (r == nullptr) {
    Fail(node);
    return false;
  }
  bool ok = r->type == REDIS_REPLY_ARRAY;
  std::vector<int> owner(kSlots, -1);
  for (size_t i = 0; ok && i < r->elements; ++i) {
    const redisReply* range = r->element[i];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
        range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER ||
        range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2 ||
        range->element[2]->element[0]->type != REDIS_REPLY_STRING ||
        range->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
      ok = false;
      break;
    }
    const long long lo = range->element[0]->integer, hi = range->element[1]->integer;
    if (lo < 0 || hi >= kSlots || lo > hi) {
      ok = false;
      break;
    }
    const redisReply* master = range->element[2];
    RedisAddress a{std::string(master->element[0]->str, master->element[0]->len),
                   static_cast<int>(master->element[1]->integer)};
    if (a.host.empty() || a.host == "?") a.host = nodes_[node].address.host;  // "the node asked"
    const int idx = NodeIndex(a);
    std::fill(owner.begin() + lo, owner.begin() + hi + 1, idx);
  }
  freeReplyObject(r);
  if (!ok) {
    ++errors_;
    return false;
  }
  nodes_[node].consecutive_failures = 0;
  slot_owner_ = std::move(owner);
  return true;
}

void RedisRouter::MaybeRefresh() {
  if (!options_.cluster || !refresh_due_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool loaded = last_refresh_ != std::chrono::steady_clock::time_point{};
  if (loaded && now - last_refresh_ < std::chrono::milliseconds(options_.breaker_cooldown_ms)) {
    return;
  }
  last_refresh_ = now;
  for (size_t i = 0; i < nodes_.size(); ++i) {  // seeds first, then nodes learnt
    if (LoadSlots(static_cast<int>(i))) {
      refresh_due_ = false;
      return;
    }
  }
}

std::string RedisRouter::NodeOf(absl::string_view key) {
  MaybeRefresh();
  const int owner = OwnerOf(key);
  return owner < 0 ? "" : nodes_[owner].address.ToString();
}

std::vector<RedisReply> RedisRouter::Run(const std::vector<Command>& commands, int timeout_ms) {
  if (timeout_ms <= 0) timeout_ms = options_.timeout_ms;
  std::vector<RedisReply> out(commands.size());
  MaybeRefresh();
  std::vector<size_t> pending(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) pending[i] = i;
  std::vector<int> ask(commands.size(), -1);  // node named by an ASK reply
  for (int round = 0; round <= options_.max_redirects && !pending.empty(); ++round) {
    // Commands by node, in the order given.
    std::vector<std::vector<size_t>> by_node(nodes_.size());
    for (size_t i : pending) {
      const int node = ask[i] >= 0 ? ask[i] : OwnerOf(commands[i][1]);
      if (node >= 0) by_node[node].push_back(i);  // unmapped slot: stays kFailed
    }
    std::vector<size_t> again;
    for (size_t node = 0; node < by_node.size(); ++node) {
      const std::vector<size_t>& batch = by_node[node];
      if (batch.empty()) continue;
      if (std::chrono::steady_clock::now() < nodes_[node].open_until) continue;  // kFailed
      const auto start = std::chrono::steady_clock::now();
      ++requests_;
      redisContext* c = Conn(static_cast<int>(node));
      if (c == nullptr) continue;  // kFailed replies
      bool sent = true;
      if (nodes_[node].ctx_timeout_ms != timeout_ms) {
        sent = redisSetTimeout(c, Tv(timeout_ms)) == REDIS_OK;
        if (sent) nodes_[node].ctx_timeout_ms = timeout_ms;
      }
      for (size_t i : batch) {
        std::vector<const char*> argv;
        std::vector<size_t> lens;
        for (absl::string_view a : commands[i]) {
          argv.push_back(a.data());
          lens.push_back(a.size());
        }
        if (ask[i] >= 0 && redisAppendCommand(c, "ASKING") != REDIS_OK) sent = false;
        if (redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()) !=
            REDIS_OK) {
          sent = false;
        }
      }
      bool failed = !sent;
      for (size_t k = 0; k < batch.size() && !failed; ++k) {
        const size_t i = batch[k];
        void* raw = nullptr;
        if (ask[i] >= 0) {  // the ASKING reply
          if (redisGetReply(c, &raw) != REDIS_OK || raw == nullptr) {
            failed = true;
            break;
          }
          freeReplyObject(raw);
          raw = nullptr;
          ask[i] = -1;
        }
        if (redisGetReply(c, &raw) != REDIS_OK || raw == nullptr) {
          failed = true;
          break;
        }
        RedisReply reply = Convert(static_cast<redisReply*>(raw));
        freeReplyObject(raw);
        RedisAddress to;
        if (options_.cluster && reply.type == RedisReply::Type::kError &&
            ParseRedirect(reply.str, "MOVED", &to)) {
          slot_owner_[RedisKeySlot(commands[i][1])] = NodeIndex(to);
          refresh_due_ = true;
          again.push_back(i);
        } else if (options_.cluster && reply.type == RedisReply::Type::kError &&
                   ParseRedirect(reply.str, "ASK", &to)) {
          ask[i] = NodeIndex(to);
          again.push_back(i);
        } else {
          if (reply.type == RedisReply::Type::kError) ++errors_;  // e.g. OOM, WRONGTYPE
          out[i] = std::move(reply);
        }
      }
      request_micros_ += std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now() - start)
                             .count();
      if (failed) {
        Fail(static_cast<int>(node));
      } else {
        nodes_[node].consecutive_failures = 0;
      }
    }
    std::sort(again.begin(), again.end());  // keep the given order across nodes
    pending = std::move(again);
  }
  if (!pending.empty()) ++errors_;  // out of redirects: kFailed
  return out;
}

}  // namespace statecache
