// Tenants: who may call statecached, and how much each caller may use.
//
// A tenants file maps bearer tokens to tenants, storing only the SHA-256 of
// each token (hex), so the file leaks no credential. Every model (and with it
// every slot and checkpoint) belongs to the tenant that registered it; other
// tenants cannot see it (server/statecache_service.cc).
//
// File format (one directive per line, '#' starts a comment, fields are
// whitespace separated, numbers are decimal; 0 or absent = unlimited):
//
//   tenant <name> [max_slots=N] [max_state_bytes=N] [max_checkpoint_bytes=N]
//                 [max_models=N] [requests_per_second=R] [burst=N]
//   token <name> sha256:<64 lowercase hex digits>
//
//   # printf %s "$TOKEN" | sha256sum   gives the hex digest of a token
//   tenant team-a max_slots=64 max_checkpoint_bytes=1073741824 requests_per_second=5000
//   token team-a sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//
// Tenant names are [A-Za-z0-9._-]{1,64}; a token line must name a tenant
// declared above it; a digest may appear only once.
//
// Quotas (kResourceExhausted naming the quota when exceeded):
//  - max_slots: live slots over all the tenant's models (AllocateSlots);
//  - max_state_bytes / max_checkpoint_bytes: slot / checkpoint arena bytes its
//    models reserve (RegisterModel; within the checkpoint arena the LRU
//    evicts, so Snapshot never fails for the byte quota itself);
//  - max_models: registered models;
//  - requests_per_second / burst: a token bucket over every RPC and every
//    UpdateStream message (burst defaults to max(1, requests_per_second)).
//
// Thread-safe.
//
//   ASSIGN_OR_RETURN(auto dir, TenantDirectory::Load("/etc/statecache/tenants"));
//   ASSIGN_OR_RETURN(Tenant* t, dir->Authenticate(token));
//   RETURN_IF_ERROR(t->Admit(absl::Now()));
#ifndef STATECACHE_SERVER_AUTH_TENANTS_H_
#define STATECACHE_SERVER_AUTH_TENANTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace statecache {

// Lowercase hex SHA-256 of `data` (OpenSSL libcrypto).
std::string Sha256Hex(absl::string_view data);

struct TenantQuota {
  int64_t max_slots = 0;             // 0 = unlimited
  int64_t max_state_bytes = 0;       // 0 = unlimited
  int64_t max_checkpoint_bytes = 0;  // 0 = unlimited
  int64_t max_models = 0;            // 0 = unlimited
  double requests_per_second = 0;    // 0 = unlimited
  double burst = 0;                  // bucket size; 0 = max(1, requests_per_second)
};

class Tenant {
 public:
  Tenant(std::string name, TenantQuota quota);
  Tenant(const Tenant&) = delete;
  Tenant& operator=(const Tenant&) = delete;

  // "" for the single tenant of the unauthenticated development mode.
  const std::string& name() const { return name_; }
  const TenantQuota& quota() const { return quota_; }

  // Takes one request from the rate bucket. kResourceExhausted
  // "quota requests_per_second: ..." when it is empty.
  absl::Status Admit(absl::Time now) ABSL_LOCKS_EXCLUDED(rate_mu_);

  // Serializes the check-then-allocate sequences of quota'd operations
  // (RegisterModel, AllocateSlots) of this tenant.
  absl::Mutex& allocation_mu() { return allocation_mu_; }

 private:
  const std::string name_;
  TenantQuota quota_;  // burst resolved in the constructor
  absl::Mutex rate_mu_;
  double bucket_ ABSL_GUARDED_BY(rate_mu_);
  absl::Time refilled_ ABSL_GUARDED_BY(rate_mu_);
  absl::Mutex allocation_mu_;
};

class TenantDirectory {
 public:
  // Parses a tenants file (format above). kInvalidArgument naming
  // `source`:line and the bad field.
  static absl::StatusOr<std::unique_ptr<TenantDirectory>> Parse(absl::string_view text,
                                                                absl::string_view source);
  // Reads and parses `path` (kNotFound / kPermissionDenied when unreadable).
  static absl::StatusOr<std::unique_ptr<TenantDirectory>> Load(const std::string& path);

  // The tenant owning `token` (its SHA-256 is looked up). kUnauthenticated
  // for an empty or unknown token (the message never echoes the token).
  absl::StatusOr<Tenant*> Authenticate(absl::string_view token) const;

  // The tenant called `name`, or nullptr.
  Tenant* Find(absl::string_view name) const;

  std::vector<std::string> TenantNames() const;
  int64_t token_count() const { return static_cast<int64_t>(by_digest_.size()); }

 private:
  TenantDirectory() = default;
  absl::flat_hash_map<std::string, std::unique_ptr<Tenant>> tenants_;
  absl::flat_hash_map<std::string, Tenant*> by_digest_;  // hex SHA-256 -> tenant
};

// The bearer token of an "authorization" metadata value ("Bearer <token>",
// scheme case-insensitive). kUnauthenticated when malformed.
absl::StatusOr<std::string> ParseBearer(absl::string_view authorization);

}  // namespace statecache

#endif  // STATECACHE_SERVER_AUTH_TENANTS_H_
