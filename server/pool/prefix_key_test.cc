#include "server/pool/prefix_key.h"

#include <vector>

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

}  // namespace
}  // namespace statecache
