#include "server/pool/prefix_key.h"

// KeySalter resumes a saved SHA-256 state (SHA256_CTX).
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/evp.h>
#include <openssl/sha.h>

#include <cstring>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace statecache {
namespace {

// SHA-256 of data[0..n) into out[32]. One digest context per thread and one
// algorithm fetch per process: OpenSSL 3's one-shot SHA256() fetches the
// algorithm on every call, about 4x slower for the short messages here.
void Sha256(const void* data, size_t n, uint8_t* out) {
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  struct CtxFree {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
  };
  thread_local std::unique_ptr<EVP_MD_CTX, CtxFree> ctx(EVP_MD_CTX_new());
  if (md != nullptr && ctx != nullptr && EVP_DigestInit_ex2(ctx.get(), md, nullptr) == 1 &&
      EVP_DigestUpdate(ctx.get(), data, n) == 1 &&
      EVP_DigestFinal_ex(ctx.get(), out, nullptr) == 1) {
    return;
  }
  SHA256(static_cast<const uint8_t*>(data), n, out);  // same digest, slower path
}

}  // namespace

std::string PrefixKey::DebugString() const {
  switch (kind) {
    case PrefixKeyKind::kFnv64:
      if (digest.empty()) return absl::StrFormat("%016x@%d", hash, num_tokens);
      return absl::StrFormat("%016x/%s@%d", hash,
                             absl::BytesToHexString(absl::string_view(digest).substr(0, 8)),
                             num_tokens);
    case PrefixKeyKind::kSha256:
      return absl::StrFormat("sha256:%s@%d",
                             absl::BytesToHexString(absl::string_view(digest).substr(0, 8)),
                             num_tokens);
    case PrefixKeyKind::kEngine:
      return absl::StrFormat("engine:%s@%d",
                             absl::BytesToHexString(absl::string_view(digest).substr(0, 8)),
                             num_tokens);
  }
  return absl::StrFormat("kind%d@%d", static_cast<int>(kind), num_tokens);
}

uint64_t ChainHashStep(uint64_t previous, int32_t token) {
  uint64_t h = 14695981039346656037ULL;
  auto add = [&h](uint8_t b) { h = (h ^ b) * 1099511628211ULL; };
  for (int i = 0; i < 8; ++i) add(static_cast<uint8_t>(previous >> (8 * i)));
  const uint32_t t = static_cast<uint32_t>(token);
  for (int i = 0; i < 4; ++i) add(static_cast<uint8_t>(t >> (8 * i)));
  return h;
}

std::vector<PrefixKey> ChainPrefixKeys(absl::Span<const int32_t> tokens) {
  std::vector<PrefixKey> keys;
  keys.reserve(tokens.size());
  uint64_t h = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    h = ChainHashStep(h, tokens[i]);
    keys.push_back(PrefixKey{h, static_cast<int64_t>(i + 1)});
  }
  return keys;
}

PrefixKey KeyOfTokens(absl::Span<const int32_t> tokens) {
  uint64_t h = 0;
  for (int32_t t : tokens) h = ChainHashStep(h, t);
  return PrefixKey{h, static_cast<int64_t>(tokens.size())};
}

std::array<uint8_t, kSha256DigestBytes> Sha256ChainStep(
    const std::array<uint8_t, kSha256DigestBytes>& previous, int32_t token) {
  uint8_t buf[kSha256DigestBytes + 4];
  std::memcpy(buf, previous.data(), kSha256DigestBytes);
  const uint32_t t = static_cast<uint32_t>(token);
  for (int i = 0; i < 4; ++i) buf[kSha256DigestBytes + i] = static_cast<uint8_t>(t >> (8 * i));
  std::array<uint8_t, kSha256DigestBytes> out;
  Sha256(buf, sizeof(buf), out.data());
  return out;
}

std::vector<PrefixKey> ChainSha256PrefixKeys(absl::Span<const int32_t> tokens) {
  std::vector<PrefixKey> keys;
  keys.reserve(tokens.size());
  std::array<uint8_t, kSha256DigestBytes> d{};
  for (size_t i = 0; i < tokens.size(); ++i) {
    d = Sha256ChainStep(d, tokens[i]);
    PrefixKey k;
    k.num_tokens = static_cast<int64_t>(i + 1);
    k.kind = PrefixKeyKind::kSha256;
    k.digest.assign(reinterpret_cast<const char*>(d.data()), d.size());
    keys.push_back(std::move(k));
  }
  return keys;
}

PrefixKey Sha256KeyOfTokens(absl::Span<const int32_t> tokens) {
  std::array<uint8_t, kSha256DigestBytes> d{};
  for (int32_t t : tokens) d = Sha256ChainStep(d, t);
  PrefixKey k;
  k.num_tokens = static_cast<int64_t>(tokens.size());
  k.kind = PrefixKeyKind::kSha256;
  k.digest.assign(reinterpret_cast<const char*>(d.data()), d.size());
  return k;
}

std::array<uint8_t, kSha256DigestBytes> TenantSalt(absl::string_view tenant) {
  static constexpr char kDomain[] = "statecache.prefix-key.salt.v1";
  std::string msg(kDomain, sizeof(kDomain));  // includes the terminating 0x00
  for (int i = 0; i < 4; ++i) msg.push_back(static_cast<char>(tenant.size() >> (8 * i)));
  msg.append(tenant.data(), tenant.size());
  std::array<uint8_t, kSha256DigestBytes> salt;
  Sha256(msg.data(), msg.size(), salt.data());
  return salt;
}

// The low-level SHA-256 interface (deprecated in OpenSSL 3, still built):
// EVP has no cheap way to resume a saved state, and KeySalter's one
// compression per key is the point.
struct KeySalter::Midstate {
  SHA256_CTX ctx;
};

KeySalter::KeySalter(absl::string_view tenant) : midstate_(std::make_unique<Midstate>()) {
  const std::array<uint8_t, kSha256DigestBytes> salt = TenantSalt(tenant);
  salt_.assign(reinterpret_cast<const char*>(salt.data()), salt.size());
  static constexpr char kDomain[] = "statecache.prefix-key.v2";
  uint8_t block[64] = {};
  std::memcpy(block, salt.data(), salt.size());
  std::memcpy(block + kSha256DigestBytes, kDomain, sizeof(kDomain) - 1);
  SHA256_Init(&midstate_->ctx);
  SHA256_Update(&midstate_->ctx, block, sizeof(block));  // one compression
}

KeySalter::~KeySalter() = default;

PrefixKey KeySalter::Salt(const PrefixKey& key) const {
  PrefixKey salted;
  salted.hash = key.hash;
  salted.num_tokens = key.num_tokens;
  salted.kind = key.kind;
  if (key.kind == PrefixKeyKind::kFnv64) {
    salted.digest = salt_;  // (hash, num_tokens, salt) compared exactly
    return salted;
  }
  // 21 bytes + the digest: one more compression for digests up to 34 bytes.
  uint8_t head[1 + 8 + 8 + 4];
  uint8_t* p = head;
  auto put_le = [&p](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) *p++ = static_cast<uint8_t>(v >> (8 * i));
  };
  *p++ = static_cast<uint8_t>(key.kind);
  put_le(key.hash, 8);
  put_le(static_cast<uint64_t>(key.num_tokens), 8);
  put_le(key.digest.size(), 4);
  SHA256_CTX c = midstate_->ctx;
  SHA256_Update(&c, head, sizeof(head));
  SHA256_Update(&c, key.digest.data(), key.digest.size());
  uint8_t out[kSha256DigestBytes];
  SHA256_Final(out, &c);
  salted.digest.assign(reinterpret_cast<const char*>(out), sizeof(out));
  return salted;
}

PrefixKey SaltKey(absl::string_view tenant, const PrefixKey& key) {
  return KeySalter(tenant).Salt(key);
}

std::vector<PrefixKey> SaltKeys(absl::string_view tenant, absl::Span<const PrefixKey> keys) {
  const KeySalter salter(tenant);
  std::vector<PrefixKey> out;
  out.reserve(keys.size());
  for (const PrefixKey& k : keys) out.push_back(salter.Salt(k));
  return out;
}

}  // namespace statecache
