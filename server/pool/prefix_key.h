// PrefixKey: the key of a prefix-cache checkpoint, a hash chain over tokens.
//
//   h_0 = 0
//   h_i = FNV-1a-64(le64(h_{i-1}) || le32(token_i))
//
// (FNV-1a with offset basis 14695981039346656037 and prime 1099511628211 over
// those 12 bytes.) The key of the first n tokens is {h_n, n}; the chain lets a
// worker name every prefix of a conversation without sending its tokens again,
// and extending a prefix by one token costs one hash step. This is the exact
// definition in proto/statecache/v1/statecache.proto; clients compute the same.
// The hash is not collision-resistant against adversaries (keys are looked up
// per model, and the length must match too).
//
//   std::vector<PrefixKey> keys = ChainPrefixKeys(tokens);  // keys[i]: first i+1 tokens
#ifndef STATECACHE_SERVER_POOL_PREFIX_KEY_H_
#define STATECACHE_SERVER_POOL_PREFIX_KEY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/types/span.h"

namespace statecache {

struct PrefixKey {
  uint64_t hash = 0;       // h_n
  int64_t num_tokens = 0;  // n

  bool operator==(const PrefixKey& o) const {
    return hash == o.hash && num_tokens == o.num_tokens;
  }
  bool operator!=(const PrefixKey& o) const { return !(*this == o); }
  template <typename H>
  friend H AbslHashValue(H h, const PrefixKey& k) {
    return H::combine(std::move(h), k.hash, k.num_tokens);
  }
  // "0123456789abcdef@12".
  std::string DebugString() const { return absl::StrFormat("%016x@%d", hash, num_tokens); }
};

// h_i from h_{i-1} and token_i.
uint64_t ChainHashStep(uint64_t previous, int32_t token);

// Keys of every prefix: result[i] is the key of tokens[0..i].
std::vector<PrefixKey> ChainPrefixKeys(absl::Span<const int32_t> tokens);

// Key of the whole sequence ({0, 0} for an empty one).
PrefixKey KeyOfTokens(absl::Span<const int32_t> tokens);

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_PREFIX_KEY_H_
