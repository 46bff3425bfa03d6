#include "server/auth/tenants.h"

#include <openssl/evp.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace statecache {

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

Tenant::Tenant(std::string name, TenantQuota quota) : name_(std::move(name)), quota_(quota) {
  if (quota_.burst <= 0) quota_.burst = std::max(1.0, quota_.requests_per_second);
  bucket_ = quota_.burst;
  refilled_ = absl::Now();
}

absl::Status Tenant::Admit(absl::Time now) {
  if (quota_.requests_per_second <= 0) return absl::OkStatus();
  absl::MutexLock lock(&rate_mu_);
  const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - refilled_));
  refilled_ = std::max(refilled_, now);
  bucket_ = std::min(quota_.burst, bucket_ + elapsed * quota_.requests_per_second);
  if (bucket_ < 1.0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "quota requests_per_second: tenant '", name_, "' exceeds ", quota_.requests_per_second,
        " requests/s (burst ", quota_.burst, "); retry later"));
  }
  bucket_ -= 1.0;
  return absl::OkStatus();
}

namespace {

bool ValidTenantName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

bool IsLowerHex(absl::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

absl::StatusOr<std::unique_ptr<TenantDirectory>> TenantDirectory::Parse(absl::string_view text,
                                                                        absl::string_view source) {
  std::unique_ptr<TenantDirectory> dir(new TenantDirectory());
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    auto bad = [&](auto... parts) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", parts...));
    };
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty()) continue;
    if (f[0] == "tenant") {
      if (f.size() < 2 || !ValidTenantName(f[1])) {
        return bad("tenant: name must match [A-Za-z0-9._-]{1,64}");
      }
      const std::string name(f[1]);
      if (dir->tenants_.contains(name)) return bad("tenant '", name, "' declared twice");
      TenantQuota q;
      for (size_t i = 2; i < f.size(); ++i) {
        std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(f[i], '=');
        int64_t* ints[] = {&q.max_slots, &q.max_state_bytes, &q.max_checkpoint_bytes,
                           &q.max_models};
        const char* int_names[] = {"max_slots", "max_state_bytes", "max_checkpoint_bytes",
                                   "max_models"};
        bool known = false;
        for (int j = 0; j < 4; ++j) {
          if (kv.first != int_names[j]) continue;
          known = true;
          if (!absl::SimpleAtoi(kv.second, ints[j]) || *ints[j] < 0) {
            return bad(kv.first, ": '", kv.second, "' is not a non-negative integer");
          }
        }
        double* reals[] = {&q.requests_per_second, &q.burst};
        const char* real_names[] = {"requests_per_second", "burst"};
        for (int j = 0; j < 2; ++j) {
          if (kv.first != real_names[j]) continue;
          known = true;
          if (!absl::SimpleAtod(kv.second, reals[j]) || !(*reals[j] >= 0) || *reals[j] > 1e12) {
            return bad(kv.first, ": '", kv.second, "' is not a non-negative number");
          }
        }
        if (!known) return bad("unknown quota '", kv.first, "'");
      }
      dir->tenants_[name] = std::make_unique<Tenant>(name, q);
    } else if (f[0] == "token") {
      if (f.size() != 3) return bad("token: want 'token <tenant> sha256:<hex>'");
      auto it = dir->tenants_.find(std::string(f[1]));
      if (it == dir->tenants_.end()) {
        return bad("token: tenant '", f[1], "' is not declared above");
      }
      absl::string_view digest = f[2];
      if (!absl::ConsumePrefix(&digest, "sha256:") || digest.size() != 64 || !IsLowerHex(digest)) {
        return bad("token: digest must be sha256:<64 lowercase hex digits> (never the token)");
      }
      if (!dir->by_digest_.emplace(std::string(digest), it->second.get()).second) {
        return bad("token: digest listed twice");
      }
    } else {
      return bad("unknown directive '", f[0], "' (want tenant or token)");
    }
  }
  if (dir->by_digest_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no token lines"));
  }
  return dir;
}

absl::StatusOr<std::unique_ptr<TenantDirectory>> TenantDirectory::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("tenants_file: cannot read '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), path);
}

absl::StatusOr<Tenant*> TenantDirectory::Authenticate(absl::string_view token) const {
  if (token.empty()) return absl::UnauthenticatedError("authorization: empty bearer token");
  auto it = by_digest_.find(Sha256Hex(token));
  if (it == by_digest_.end()) {
    return absl::UnauthenticatedError("authorization: unknown bearer token");
  }
  return it->second;
}

Tenant* TenantDirectory::Find(absl::string_view name) const {
  auto it = tenants_.find(std::string(name));
  return it == tenants_.end() ? nullptr : it->second.get();
}

std::vector<std::string> TenantDirectory::TenantNames() const {
  std::vector<std::string> names;
  for (const auto& [name, t] : tenants_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::string> ParseBearer(absl::string_view authorization) {
  absl::string_view v = absl::StripAsciiWhitespace(authorization);
  if (v.size() < 7 || !absl::EqualsIgnoreCase(v.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError(
        "authorization: want metadata 'authorization: Bearer <token>'");
  }
  v = absl::StripAsciiWhitespace(v.substr(7));
  if (v.empty()) return absl::UnauthenticatedError("authorization: empty bearer token");
  return std::string(v);
}

}  // namespace statecache
