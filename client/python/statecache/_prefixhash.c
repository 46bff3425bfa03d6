/* Prefix-key hash chain of proto PrefixKey (statecache/prefix.py), in C for
 * speed; loaded with ctypes (no Python API, so one binary serves every
 * interpreter). Same definition as server/pool/prefix_key.h:
 *
 *   h_i = FNV-1a-64(le64(h_{i-1}) || le32(token_i))
 */
#include <stddef.h>
#include <stdint.h>

#define FNV_OFFSET_BASIS 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

/* out[i] = h_{i+1} of the chain that starts at h0 and goes over
 * tokens[0..n); out must hold n values. Thread-safe. */
void statecache_prefix_chain(uint64_t h0, const int32_t* tokens, size_t n, uint64_t* out) {
  uint64_t h = h0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t x = FNV_OFFSET_BASIS;
    for (int b = 0; b < 8; ++b) {
      x = (x ^ ((h >> (8 * b)) & 0xff)) * FNV_PRIME;
    }
    const uint32_t t = (uint32_t)tokens[i];
    for (int b = 0; b < 4; ++b) {
      x = (x ^ ((t >> (8 * b)) & 0xff)) * FNV_PRIME;
    }
    h = x;
    out[i] = h;
  }
}
