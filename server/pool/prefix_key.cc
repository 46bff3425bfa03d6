#include "server/pool/prefix_key.h"

#include <openssl/sha.h>

#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace statecache {
namespace {

void AppendLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
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
  SHA256(buf, sizeof(buf), out.data());
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

PrefixKey SaltKey(absl::string_view tenant, const PrefixKey& key) {
  static constexpr char kDomain[] = "statecache.prefix-key.salt.v1";
  std::string msg(kDomain, sizeof(kDomain));  // includes the terminating 0x00
  AppendLe(&msg, tenant.size(), 4);
  msg.append(tenant.data(), tenant.size());
  msg.push_back(static_cast<char>(key.kind));
  AppendLe(&msg, key.hash, 8);
  AppendLe(&msg, static_cast<uint64_t>(key.num_tokens), 8);
  AppendLe(&msg, key.digest.size(), 4);
  msg.append(key.digest);
  uint8_t out[kSha256DigestBytes];
  SHA256(reinterpret_cast<const uint8_t*>(msg.data()), msg.size(), out);
  PrefixKey salted = key;
  salted.digest.assign(reinterpret_cast<const char*>(out), sizeof(out));
  return salted;
}

}  // namespace statecache
