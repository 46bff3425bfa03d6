#include "client/model/linear.h"

#include <algorithm>
#include <cstring>

namespace statecache {

namespace {

typedef float V8 __attribute__((vector_size(32)));

inline V8 Load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float Sum8(V8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// Rows [n0, n1) x tokens [t0, t1) of y. Register tile: 2 tokens x 4 rows.
__attribute__((target_clones("arch=haswell", "default"))) void Tile(
    const float* x, int64_t t0, int64_t t1, int64_t k, const float* w, int64_t n0, int64_t n1,
    int64_t n, float* y) {
  const int64_t k8 = k & ~int64_t{7};
  int64_t t = t0;
  for (; t + 1 < t1; t += 2) {
    const float* x0 = x + t * k;
    const float* x1 = x0 + k;
    int64_t r = n0;
    for (; r + 3 < n1; r += 4) {
      const float* w0 = w + r * k;
      const float* w1 = w0 + k;
      const float* w2 = w1 + k;
      const float* w3 = w2 + k;
      V8 a00 = {}, a01 = {}, a02 = {}, a03 = {}, a10 = {}, a11 = {}, a12 = {}, a13 = {};
      for (int64_t i = 0; i < k8; i += 8) {
        const V8 xa = Load8(x0 + i), xb = Load8(x1 + i);
        const V8 b0 = Load8(w0 + i), b1 = Load8(w1 + i), b2 = Load8(w2 + i), b3 = Load8(w3 + i);
        a00 += xa * b0; a01 += xa * b1; a02 += xa * b2; a03 += xa * b3;
        a10 += xb * b0; a11 += xb * b1; a12 += xb * b2; a13 += xb * b3;
      }
      float s[2][4] = {{Sum8(a00), Sum8(a01), Sum8(a02), Sum8(a03)},
                       {Sum8(a10), Sum8(a11), Sum8(a12), Sum8(a13)}};
      for (int64_t i = k8; i < k; ++i) {
        s[0][0] += x0[i] * w0[i]; s[0][1] += x0[i] * w1[i];
        s[0][2] += x0[i] * w2[i]; s[0][3] += x0[i] * w3[i];
        s[1][0] += x1[i] * w0[i]; s[1][1] += x1[i] * w1[i];
        s[1][2] += x1[i] * w2[i]; s[1][3] += x1[i] * w3[i];
      }
      for (int j = 0; j < 4; ++j) {
        y[t * n + r + j] = s[0][j];
        y[(t + 1) * n + r + j] = s[1][j];
      }
    }
    for (; r < n1; ++r) {
      const float* wr = w + r * k;
      V8 a0 = {}, a1 = {};
      for (int64_t i = 0; i < k8; i += 8) {
        const V8 b = Load8(wr + i);
        a0 += Load8(x0 + i) * b;
        a1 += Load8(x1 + i) * b;
      }
      float s0 = Sum8(a0), s1 = Sum8(a1);
      for (int64_t i = k8; i < k; ++i) {
        s0 += x0[i] * wr[i];
        s1 += x1[i] * wr[i];
      }
      y[t * n + r] = s0;
      y[(t + 1) * n + r] = s1;
    }
  }
  for (; t < t1; ++t) {  // last odd token: 1 x 4 tiles
    const float* x0 = x + t * k;
    int64_t r = n0;
    for (; r + 3 < n1; r += 4) {
      const float* w0 = w + r * k;
      const float* w1 = w0 + k;
      const float* w2 = w1 + k;
      const float* w3 = w2 + k;
      V8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int64_t i = 0; i < k8; i += 8) {
        const V8 xa = Load8(x0 + i);
        a0 += xa * Load8(w0 + i); a1 += xa * Load8(w1 + i);
        a2 += xa * Load8(w2 + i); a3 += xa * Load8(w3 + i);
      }
      float s[4] = {Sum8(a0), Sum8(a1), Sum8(a2), Sum8(a3)};
      for (int64_t i = k8; i < k; ++i) {
        s[0] += x0[i] * w0[i]; s[1] += x0[i] * w1[i];
        s[2] += x0[i] * w2[i]; s[3] += x0[i] * w3[i];
      }
      for (int j = 0; j < 4; ++j) y[t * n + r + j] = s[j];
    }
    for (; r < n1; ++r) {
      const float* wr = w + r * k;
      V8 a0 = {};
      for (int64_t i = 0; i < k8; i += 8) a0 += Load8(x0 + i) * Load8(wr + i);
      float s0 = Sum8(a0);
      for (int64_t i = k8; i < k; ++i) s0 += x0[i] * wr[i];
      y[t * n + r] = s0;
    }
  }
}

}  // namespace

void MatMulTransposed(ThreadPool* pool, const float* x, int64_t t, int64_t k, const float* w,
                      int64_t n, float* y) {
  if (t <= 0 || n <= 0) return;
  // Blocks of 64 output rows x 64 tokens: a W block (64 x K floats, 128 KiB at
  // K = 512) stays in L2 while the token block streams over it.
  constexpr int64_t kRowBlock = 64;
  constexpr int64_t kTokBlock = 64;
  const int64_t tok_blocks = (t + kTokBlock - 1) / kTokBlock;
  // For a single token, smaller row blocks give the threads enough items.
  const int64_t row_block = t == 1 ? 16 : kRowBlock;
  const int64_t rb = (n + row_block - 1) / row_block;
  auto run = [&](int64_t item) {
    const int64_t ri = item % rb;
    const int64_t ti = item / rb;
    const int64_t n0 = ri * row_block, n1 = std::min(n, n0 + row_block);
    const int64_t t0 = ti * kTokBlock, t1 = std::min(t, t0 + kTokBlock);
    Tile(x, t0, t1, k, w, n0, n1, n, y);
  };
  const int64_t items = rb * tok_blocks;
  if (pool == nullptr || static_cast<int64_t>(t) * n * k < (int64_t{1} << 16)) {
    for (int64_t i = 0; i < items; ++i) run(i);
  } else {
    pool->ParallelFor(items, run);
  }
}

}  // namespace statecache
