// Cost of prefix keys for one LookupPrefix of a long context: the FNV-1a and
// SHA-256 chains over N tokens, and the tenant salt of every candidate key
// (what ops::LookupPrefix adds before the store). Prints one line per run.
//
//   bazel run -c opt //server/pool:prefix_key_bench -- 131072
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "server/pool/prefix_key.h"

int main(int argc, char** argv) {
  using statecache::PrefixKey;
  const long n = argc > 1 ? std::atol(argv[1]) : 131072;
  std::vector<int32_t> tokens(n > 0 ? n : 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7919 % 151000);
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  for (int run = 0; run < 3; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<PrefixKey> fnv = statecache::ChainPrefixKeys(tokens);
    const auto t1 = std::chrono::steady_clock::now();
    const std::vector<PrefixKey> sha = statecache::ChainSha256PrefixKeys(tokens);
    const auto t2 = std::chrono::steady_clock::now();
    const std::vector<PrefixKey> fnv_salted = statecache::SaltKeys("tenant", fnv);
    const auto t3 = std::chrono::steady_clock::now();
    const std::vector<PrefixKey> sha_salted = statecache::SaltKeys("tenant", sha);
    const auto t4 = std::chrono::steady_clock::now();
    std::printf("tokens=%zu fnv_chain_ms=%.1f sha256_chain_ms=%.1f salt_fnv_ms=%.1f "
                "salt_sha256_ms=%.1f\n",
                tokens.size(), ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t3, t4));
    if (fnv_salted.size() != sha_salted.size()) return 1;
  }
  return 0;
}
