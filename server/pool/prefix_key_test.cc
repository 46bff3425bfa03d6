#include "server/pool/prefix_key.h"

#include <openssl/sha.h>

#include <array>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

// FNV-1a 64 over 12 bytes written out independently of prefix_key.cc.
uint64_t Reference(uint64_t prev, int32_t token) {
  unsigned char bytes[12];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(prev >> (8 * i));
  for (int i = 0; i < 4; ++i) bytes[8 + i] = static_cast<unsigned char>(uint32_t(token) >> (8 * i));
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char b : bytes) {
    h ^= b;
    h *= 0x100000001b3ULL;
  }
  return h;
}

TEST(PrefixKeyTest, ChainMatchesDefinition) {
  const std::vector<int32_t> tokens = {72, 101, 108, -1, 0, 1 << 30};
  const std::vector<PrefixKey> keys = ChainPrefixKeys(tokens);
  ASSERT_EQ(keys.size(), tokens.size());
  uint64_t h = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    h = Reference(h, tokens[i]);
    EXPECT_EQ(keys[i].hash, h) << i;
    EXPECT_EQ(keys[i].num_tokens, static_cast<int64_t>(i + 1));
  }
  EXPECT_EQ(KeyOfTokens(tokens), keys.back());
  EXPECT_EQ(KeyOfTokens({}), (PrefixKey{0, 0}));
}

TEST(PrefixKeyTest, KnownValue) {
  // Pinned (computed independently in Python) so that clients in other
  // languages can check their implementation.
  EXPECT_EQ(ChainHashStep(0, 1), 0xb46d04d1c6daa804ULL);
  EXPECT_EQ(KeyOfTokens({1, 2, 3}).hash, 0xaccf2087cdf1ef5dULL);
}

TEST(PrefixKeyTest, OrderAndLengthMatter) {
  EXPECT_NE(KeyOfTokens({1, 2}), KeyOfTokens({2, 1}));
  EXPECT_NE(KeyOfTokens({0}), KeyOfTokens({0, 0}));
}

TEST(PrefixKeyTest, Sha256KnownValues) {
  // Pinned (hashlib in Python: d = sha256(d + struct.pack("<i", t))).
  const std::vector<PrefixKey> keys = ChainSha256PrefixKeys({1, 2, 3});
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(absl::BytesToHexString(keys[0].digest),
            "71c99cc3bc21757feed5b712744ebb0f770d5c41d99189f9457495747bf11050");
  EXPECT_EQ(absl::BytesToHexString(keys[2].digest),
            "f2032b5b5b68166de50faefebf08f31965507f5555eb836098863a12700dade7");
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(keys[i].kind, PrefixKeyKind::kSha256);
    EXPECT_EQ(keys[i].hash, 0u);
    EXPECT_EQ(keys[i].num_tokens, static_cast<int64_t>(i + 1));
  }
  EXPECT_EQ(Sha256KeyOfTokens({1, 2, 3}), keys[2]);
  EXPECT_EQ(Sha256KeyOfTokens({}).num_tokens, 0);
}

TEST(PrefixKeyTest, KindsNeverCompareEqual) {
  const PrefixKey fnv = KeyOfTokens({1, 2, 3});
  const PrefixKey sha = Sha256KeyOfTokens({1, 2, 3});
  PrefixKey engine;
  engine.kind = PrefixKeyKind::kEngine;
  engine.num_tokens = 3;
  engine.digest = sha.digest;  // same bytes, other kind
  EXPECT_NE(fnv, sha);
  EXPECT_NE(sha, engine);
  EXPECT_NE(SaltKey("", sha), SaltKey("", engine));
}

TEST(PrefixKeyTest, SaltSeparatesTenants) {
  for (const PrefixKey& key : std::vector<PrefixKey>{KeyOfTokens({5, 6}), Sha256KeyOfTokens({5, 6})}) {
    const PrefixKey a = SaltKey("tenant-a", key);
    const PrefixKey b = SaltKey("tenant-b", key);
    const PrefixKey none = SaltKey("", key);
    EXPECT_NE(a, b);
    EXPECT_NE(a, none);
    EXPECT_NE(a, key);
    EXPECT_EQ(a, SaltKey("tenant-a", key));  // deterministic
    EXPECT_EQ(a.kind, key.kind);
    EXPECT_EQ(a.hash, key.hash);
    EXPECT_EQ(a.num_tokens, key.num_tokens);
    EXPECT_EQ(a.digest.size(), 32u);
  }
  // The tenant id is length-prefixed: ("ab", key) and ("a", key') never
  // share a message.
  EXPECT_NE(SaltKey("ab", KeyOfTokens({1})), SaltKey("a", KeyOfTokens({1})));
}

std::string Sha256Of(const std::string& msg) {
  uint8_t out[32];
  SHA256(reinterpret_cast<const uint8_t*>(msg.data()), msg.size(), out);
  return std::string(reinterpret_cast<const char*>(out), 32);
}

std::string Le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

std::string SaltOf(const std::string& tenant) {
  const std::array<uint8_t, kSha256DigestBytes> salt = TenantSalt(tenant);
  return std::string(reinterpret_cast<const char*>(salt.data()), salt.size());
}

// The v2 construction, spelled out: FNV keys carry the salt itself; other
// kinds SHA-256(B || kind || le64 hash || le64 n || le32 |digest| || digest).
TEST(PrefixKeyTest, SaltedDigestsFollowTheV2Construction) {
  const std::string salt = SaltOf("tenant-a");
  const PrefixKey fnv = KeyOfTokens({5, 6, 7});
  EXPECT_EQ(SaltKey("tenant-a", fnv).digest, salt);
  std::string block = salt + "statecache.prefix-key.v2";
  block.resize(64, '\0');
  PrefixKey engine;
  engine.kind = PrefixKeyKind::kEngine;
  engine.num_tokens = 48;
  engine.digest = std::string(64, '\x5a');  // two compressions after B
  for (const PrefixKey& key : {Sha256KeyOfTokens({5, 6, 7}), engine}) {
    const std::string want =
        Sha256Of(block + Le(static_cast<uint8_t>(key.kind), 1) + Le(key.hash, 8) +
                 Le(key.num_tokens, 8) + Le(key.digest.size(), 4) + key.digest);
    EXPECT_EQ(SaltKey("tenant-a", key).digest, want) << key.DebugString();
  }
}

// Same tenant equal, tenants apart, for every kind and many keys at once;
// SaltKeys equals SaltKey one by one.
TEST(PrefixKeyTest, SaltKeysSeparatesTenantsAndKeepsATenantsKeysApart) {
  std::vector<int32_t> tokens(200);
  for (int i = 0; i < 200; ++i) tokens[i] = i * 31 % 97;
  for (const std::vector<PrefixKey>& keys :
       {ChainPrefixKeys(tokens), ChainSha256PrefixKeys(tokens)}) {
    const std::vector<PrefixKey> a = SaltKeys("tenant-a", keys);
    const std::vector<PrefixKey> a2 = SaltKeys("tenant-a", keys);
    const std::vector<PrefixKey> b = SaltKeys("tenant-b", keys);
    ASSERT_EQ(a.size(), keys.size());
    absl::flat_hash_set<PrefixKey> all;
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(a[i], a2[i]);
      EXPECT_EQ(a[i], SaltKey("tenant-a", keys[i]));
      EXPECT_NE(a[i], b[i]);
      all.insert(a[i]);
      all.insert(b[i]);
    }
    EXPECT_EQ(all.size(), 2 * keys.size());  // no two stored keys collide
  }
}

// Client-chosen digests cannot line two tenants' stored keys up: a digest
// shifted by the XOR of the two salts (what would defeat a salt XORed into
// the digest) still lands elsewhere.
TEST(PrefixKeyTest, ChosenDigestsDoNotCrossTenants) {
  const std::string sa = SaltOf("tenant-a"), sb = SaltOf("tenant-b");
  for (PrefixKeyKind kind : {PrefixKeyKind::kSha256, PrefixKeyKind::kEngine}) {
    PrefixKey ka;
    ka.kind = kind;
    ka.num_tokens = 9;
    ka.digest = Sha256KeyOfTokens({1, 2}).digest;
    PrefixKey kb = ka;
    for (size_t i = 0; i < kb.digest.size(); ++i) kb.digest[i] ^= sa[i] ^ sb[i];
    EXPECT_NE(SaltKey("tenant-a", ka), SaltKey("tenant-b", kb));
    EXPECT_NE(SaltKey("tenant-a", ka), SaltKey("tenant-b", ka));
  }
}

// Keys stored under v1 (one SHA-256 over salt || key) never equal v2 keys:
// checkpoints of v1 servers cannot be found under another prefix.
TEST(PrefixKeyTest, V1SaltedKeysNeverEqualV2Keys) {
  const std::string salt = SaltOf("tenant-a");
  for (const PrefixKey& key : {KeyOfTokens({3, 4}), Sha256KeyOfTokens({3, 4})}) {
    PrefixKey v1 = key;
    v1.digest = Sha256Of(salt + Le(static_cast<uint8_t>(key.kind), 1) + Le(key.hash, 8) +
                         Le(key.num_tokens, 8) + Le(key.digest.size(), 4) + key.digest);
    EXPECT_NE(v1, SaltKey("tenant-a", key));
  }
}

TEST(PrefixKeyTest, DebugStrings) {
  EXPECT_EQ(KeyOfTokens({1, 2, 3}).DebugString(), "accf2087cdf1ef5d@3");
  EXPECT_EQ(Sha256KeyOfTokens({1, 2, 3}).DebugString(), "sha256:f2032b5b5b68166d@3");
}

}  // namespace
}  // namespace statecache
