#include "client/ctl/serve_bench_routing.h"

#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/routing/hash_ring.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

constexpr int kMaxInstances = 8;

std::string Endpoint(int i) { return absl::StrCat("statecached-", i); }

// [key] -> instance index on a ring of instances 0..n-1.
absl::StatusOr<std::vector<int>> RingOwners(const std::vector<std::string>& keys, int n) {
  std::vector<std::string> endpoints;
  for (int i = 0; i < n; ++i) endpoints.push_back(Endpoint(i));
  ASSIGN_OR_RETURN(HashRing ring, HashRing::Create(std::move(endpoints)));
  std::vector<int> out;
  for (const std::string& k : keys) out.push_back(ring.RouteIndex(k));
  return out;
}

}  // namespace

absl::StatusOr<std::vector<ServeSetup>> ParseServeSetups(absl::string_view text) {
  std::vector<ServeSetup> out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, '+');
    ServeSetup s;
    if (!absl::SimpleAtoi(parts[0], &s.instances) || s.instances < 1 ||
        s.instances > kMaxInstances) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--setups: '", item, "': want N[+host][+redis] with N in 1..", kMaxInstances));
    }
    std::set<absl::string_view> seen;
    for (size_t i = 1; i < parts.size(); ++i) {
      if (!seen.insert(parts[i]).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("--setups: '", item, "': '+", parts[i], "' twice"));
      }
      if (parts[i] == "host") {
        s.host = true;
      } else if (parts[i] == "redis") {
        s.redis = true;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "--setups: '", item, "': unknown part '+", parts[i], "' (want +host, +redis)"));
      }
    }
    s.name = absl::StrCat(s.instances, s.host ? "+host" : "", s.redis ? "+redis" : "");
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<ConversationRouter> ConversationRouter::Create(std::vector<std::string> keys,
                                                              RouterOptions options) {
  if (keys.empty()) return absl::InvalidArgumentError("keys: no conversations");
  if (options.instances < 1 || options.instances > kMaxInstances) {
    return absl::InvalidArgumentError(
        absl::StrCat("instances: ", options.instances, " (want 1..", kMaxInstances, ")"));
  }
  if (options.join_after < 0) {
    return absl::InvalidArgumentError(absl::StrCat("join_after: ", options.join_after, " < 0"));
  }
  ConversationRouter r;
  r.options_ = options;
  if (options.mode == RouteMode::kRing) {
    ASSIGN_OR_RETURN(r.after_, RingOwners(keys, options.instances));
    if (options.instances > 1 && options.join_after > 0) {
      ASSIGN_OR_RETURN(r.before_, RingOwners(keys, options.instances - 1));
    } else {
      r.before_ = r.after_;
    }
  }
  return r;
}

int ConversationRouter::Route(int step, int conversation) const {
  if (options_.mode == RouteMode::kRoundRobin) return step % options_.instances;
  return step < options_.join_after ? before_[conversation] : after_[conversation];
}

int ConversationRouter::moved() const {
  int n = 0;
  for (size_t i = 0; i < after_.size(); ++i) n += before_[i] != after_[i];
  return n;
}

std::string ConversationRouter::Describe() const {
  if (options_.instances == 1) return "one instance";
  if (options_.mode == RouteMode::kRoundRobin) {
    return absl::StrCat("round robin over ", options_.instances, " instances (no affinity)");
  }
  if (options_.join_after == 0) {
    return absl::StrCat("hash ring over ", options_.instances, " instances");
  }
  return absl::StrCat("hash ring over ", options_.instances, " instances; ",
                      Endpoint(options_.instances - 1), " joins after step ",
                      options_.join_after, " (", moved(), " of ", after_.size(),
                      " conversations move)");
}

absl::StatusOr<std::optional<ModelGeometry>> ParseStateGeometry(absl::string_view name) {
  if (name == "model") return std::optional<ModelGeometry>();
  if (name == "qwen3.6") {
    ModelGeometry g;
    g.arch = Arch::kGdn;
    g.layers = 30;
    g.h_qk = 16;
    g.h_v = 32;
    g.d_k = 128;
    g.d_v = 128;
    return std::optional<ModelGeometry>(g);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--state_geometry: '", name, "' (want model or qwen3.6)"));
}

int64_t ConvWindowBytesPerLayer(const ModelGeometry& g) {
  return int64_t{3} * (2 * g.h_qk * g.d_k + g.h_v * g.d_v) * 2;
}

}  // namespace statecache
