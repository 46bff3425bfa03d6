// Test data for the pool's tests: prefix keys of token runs and distinct
// pseudo-random byte patterns (not constant fills, so a copy of the wrong
// entry or a shifted copy is caught).
//
//   const PrefixKey k = KeyOfRun(/*first_token=*/100, /*n=*/8);  // tokens 100..107
//   const std::string bytes = PatternBytes(/*seed=*/3, slot_bytes);
#ifndef STATECACHE_SERVER_POOL_TESTING_TEST_KEYS_H_
#define STATECACHE_SERVER_POOL_TESTING_TEST_KEYS_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "server/pool/prefix_key.h"

namespace statecache {

// The FNV-1a chained key of tokens first_token, first_token + 1, ...,
// first_token + n - 1 (KeyOfTokens).
inline PrefixKey KeyOfRun(int32_t first_token, int n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = first_token + i;
  return KeyOfTokens(tokens);
}

// n bytes drawn from std::mt19937(seed): equal seeds give equal bytes.
inline std::string PatternBytes(int seed, int64_t n) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::string s(static_cast<size_t>(n), '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_TESTING_TEST_KEYS_H_
