// Round-trip cost of the Redis checkpoint tier for one checkpoint of B
// bytes against a running Redis node (or cluster): Put (encode + SET),
// LongestHeld over 8 candidates (pipelined EXISTS), Take (STRLEN, then GET +
// EXPIRE + decode with CRC; the key stays until its TTL). Default tier
// options (timeouts scaled by size). Prints one line (best of `runs` per call).
//
//   redis-server --port 6399 --save '' &
//   bazel run -c opt //server/pool:redis_tier_bench -- 127.0.0.1:6399 16777216
//   bazel run -c opt //server/pool:redis_tier_bench -- cluster=h:p,h:p,h:p 16777216
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "server/pool/redis_tier.h"

int main(int argc, char** argv) {
  using namespace statecache;
  if (argc < 3) {
    std::fprintf(stderr, "usage: redis_tier_bench host:port|cluster=h:p,... bytes [runs]\n");
    return 2;
  }
  const std::string target = argv[1];
  const long bytes = std::atol(argv[2]);
  const int runs = argc > 3 ? std::atoi(argv[3]) : 5;
  RedisTierOptions o;  // the server's defaults
  absl::Status parsed =
      absl::StartsWith(target, "cluster=")
          ? ParseRedisAddressList(target.substr(8), "cluster", &o.cluster_seeds)
          : RedisTier::ParseAddress(target, &o);
  if (!parsed.ok() || bytes < 1) {
    std::fprintf(stderr, "%s\n", parsed.ToString().c_str());
    return 2;
  }
  auto tier = RedisTier::Create("bench-tags", o);
  if (!tier.ok()) return 1;
  CheckpointBlob blob;
  blob.packed.resize(static_cast<size_t>(bytes));
  for (size_t i = 0; i < blob.packed.size(); ++i) blob.packed[i] = static_cast<char>(i * 131);
  blob.aux = {std::string(4096, 'a')};
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  double best_put = 1e9, best_held = 1e9, best_take = 1e9;
  for (int run = 0; run < runs; ++run) {
    blob.key = PrefixKey{0x1234 + static_cast<uint64_t>(run), 1000 + run};
    std::vector<PrefixKey> candidates;
    for (int c = 0; c < 8; ++c) candidates.push_back(PrefixKey{blob.key.hash, 100 + c * 100 + run});
    candidates.back() = blob.key;
    std::vector<CheckpointBlob> evicted;
    const auto t0 = std::chrono::steady_clock::now();
    (void)(*tier)->Put(blob, &evicted);
    const auto t1 = std::chrono::steady_clock::now();
    PrefixKey found;
    const bool held = (*tier)->LongestHeld(candidates, &found);
    const auto t2 = std::chrono::steady_clock::now();
    auto taken = (*tier)->Take(blob.key);
    const auto t3 = std::chrono::steady_clock::now();
    if (!held || found != blob.key || !taken.ok() || taken->packed != blob.packed) {
      std::fprintf(stderr, "round trip failed (errors=%lld)\n",
                   static_cast<long long>((*tier)->errors()));
      return 1;
    }
    best_put = std::min(best_put, ms(t0, t1));
    best_held = std::min(best_held, ms(t1, t2));
    best_take = std::min(best_take, ms(t2, t3));
  }
  std::printf("target=%s bytes=%ld put_ms=%.2f longest_held_8_ms=%.3f take_ms=%.2f\n",
              target.c_str(), bytes, best_put, best_held, best_take);
  return 0;
}
