// PrefixKey: the key of a prefix-cache checkpoint, a hash chain over tokens
// or an engine's block hash (proto/statecache/v1/statecache.proto, enum
// PrefixKeyKind, has the exact definitions; clients compute the same).
//
//   kFnv64  (legacy default):   h_0 = 0
//                                h_i = FNV-1a-64(le64(h_{i-1}) || le32(token_i))
//           (offset basis 14695981039346656037, prime 1099511628211, over
//           those 12 bytes); the key of the first n tokens is {h_n, n}. Not
//           collision-resistant.
//   kSha256:                     d_0 = 32 zero bytes
//                                d_i = SHA-256(d_{i-1} || le32(token_i))
//           the key of the first n tokens is {digest = d_n, n}.
//   kEngine:                     digest = the engine's opaque block hash
//           (1..64 bytes) of a prefix of n tokens.
//
// The chains let a worker name every prefix of a conversation without
// sending its tokens again; extending a prefix by one token costs one step.
//
// Wire keys are unsalted. Before a key reaches a CheckpointStore the server
// salts it with the owning tenant (SaltKey): the stored key keeps kind,
// hash and length, and its 32-byte digest binds the tenant's salt to the
// wire key, so equal wire keys of two tenants never compare equal:
//   kFnv64:             digest = salt (exact: the salt and the 64-bit hash
//                       are compared as they are; no digest per key);
//   kSha256 / kEngine:  digest = SHA-256(B || kind || le64(hash) ||
//                       le64(num_tokens) || le32(|digest|) || digest), B the
//                       64-byte block salt || "statecache.prefix-key.v2"
//                       zero-padded, compressed once per tenant (KeySalter),
//                       so a 32-byte digest costs one SHA-256 compression.
// with salt = TenantSalt(tenant). Keys stored by servers that salted with
// SHA-256(salt || key) in one message (v1) never equal these (DiskTier
// files of v1 keys are dropped by their tags, see ModelRegistry).
//
//   std::vector<PrefixKey> keys = ChainPrefixKeys(tokens);  // keys[i]: first i+1 tokens
//   std::vector<PrefixKey> strong = ChainSha256PrefixKeys(tokens);
//   PrefixKey stored = SaltKey(tenant, strong.back());
//   KeySalter salter(tenant);  // many keys of one tenant
//   PrefixKey same = salter.Salt(strong.back());
#ifndef STATECACHE_SERVER_POOL_PREFIX_KEY_H_
#define STATECACHE_SERVER_POOL_PREFIX_KEY_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace statecache {

// Values equal the wire enum statecache.v1.PrefixKeyKind.
enum class PrefixKeyKind : uint8_t { kFnv64 = 0, kSha256 = 1, kEngine = 2 };

inline constexpr int kSha256DigestBytes = 32;
inline constexpr int kMaxEngineDigestBytes = 64;

struct PrefixKey {
  uint64_t hash = 0;       // h_n (kFnv64), 0 otherwise
  int64_t num_tokens = 0;  // n
  PrefixKeyKind kind = PrefixKeyKind::kFnv64;
  // kSha256: d_n (32 bytes); kEngine: the engine's bytes; kFnv64: empty
  // (wire keys) or the tenant salt digest (stored keys, SaltKey).
  std::string digest;

  bool operator==(const PrefixKey& o) const {
    return hash == o.hash && num_tokens == o.num_tokens && kind == o.kind && digest == o.digest;
  }
  bool operator!=(const PrefixKey& o) const { return !(*this == o); }
  template <typename H>
  friend H AbslHashValue(H h, const PrefixKey& k) {
    return H::combine(std::move(h), k.hash, k.num_tokens, static_cast<uint8_t>(k.kind),
                      k.digest);
  }
  // kFnv64 wire key: "0123456789abcdef@12"; otherwise "<kind>:<first 8 digest
  // bytes in hex>@12" ("sha256:...", "engine:...").
  std::string DebugString() const;
};

// h_i from h_{i-1} and token_i (kFnv64).
uint64_t ChainHashStep(uint64_t previous, int32_t token);

// kFnv64 keys of every prefix: result[i] is the key of tokens[0..i].
std::vector<PrefixKey> ChainPrefixKeys(absl::Span<const int32_t> tokens);

// kFnv64 key of the whole sequence ({0, 0} for an empty one).
PrefixKey KeyOfTokens(absl::Span<const int32_t> tokens);

// d_i from d_{i-1} and token_i (kSha256).
std::array<uint8_t, kSha256DigestBytes> Sha256ChainStep(
    const std::array<uint8_t, kSha256DigestBytes>& previous, int32_t token);

// kSha256 keys of every prefix: result[i] is the key of tokens[0..i].
std::vector<PrefixKey> ChainSha256PrefixKeys(absl::Span<const int32_t> tokens);

// kSha256 key of the whole sequence (n = 0 and d_0 for an empty one).
PrefixKey Sha256KeyOfTokens(absl::Span<const int32_t> tokens);

// The stored form of wire key `key` for `tenant` ("" in single-tenant mode),
// as above: kind, hash and num_tokens unchanged, a 32-byte digest.
// Deterministic, so two servers salting one tenant's key agree (a shared
// tier).
PrefixKey SaltKey(absl::string_view tenant, const PrefixKey& key);
// SaltKey of each key (one salt derivation for all).
std::vector<PrefixKey> SaltKeys(absl::string_view tenant, absl::Span<const PrefixKey> keys);

// SHA-256("statecache.prefix-key.salt.v1" || 0x00 || le32(|tenant|) || tenant).
std::array<uint8_t, kSha256DigestBytes> TenantSalt(absl::string_view tenant);

// SaltKey for many keys of one tenant: the salt and the SHA-256 state after
// the block B derived once. Thread-compatible (Salt is const).
class KeySalter {
 public:
  explicit KeySalter(absl::string_view tenant);
  ~KeySalter();
  KeySalter(const KeySalter&) = delete;
  KeySalter& operator=(const KeySalter&) = delete;
  PrefixKey Salt(const PrefixKey& key) const;

 private:
  struct Midstate;  // prefix_key.cc (an OpenSSL SHA256_CTX)
  std::string salt_;  // TenantSalt(tenant), 32 bytes
  std::unique_ptr<Midstate> midstate_;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_PREFIX_KEY_H_
