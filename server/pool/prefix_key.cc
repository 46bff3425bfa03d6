#include "server/pool/prefix_key.h"

namespace statecache {

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

}  // namespace statecache
