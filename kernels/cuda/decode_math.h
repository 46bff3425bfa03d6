// The exact FP32 arithmetic of the CUDA recurrence kernels, as serial
// __host__ __device__ code: the CUDA kernels compute these operations in this
// order, so a host program running ReferenceHeadStep on the same inputs gets
// the same bits (the GPU tests rely on it).
//
// Differences from the CPU backend's HeadStep (kernels/cpu/head_step.h) are
// only in rounding: (1) exp(g) is DecayExp below (portable, <= 2 ulp) instead
// of std::exp; (2) products are fused (FMA); (3) the sums over key rows use
// the kernel's tree (DecodeTiling) instead of a serial loop. The math is that
// of DESIGN.md section 2 on the stored-order working state (section 7):
//
//   a_r = exp(g) (GDN) or exp(g_r) (KDA), qs_r = scale * q_r
//   db_j = beta (v'_j - sum_r (k_r a_r) w_rj)
//   w_rj = fma(k_r, db_j, a_r w_rj)
//   o'_j = fma(qk, db_j, sum_r (qs_r a_r) w_rj),  qk = sum_r qs_r k_r
//
// Decay folding: a kernel decodes the stored head for the first token of a
// call with that token's a folded into the dequantization (DecodeHead's
// row_scale: s' = a_r * s for a quantized row, a_r * x for an FP row, one
// rounding each), and runs that token with a = 1 (x * 1 is exact), saving
// one multiply per state value. The GPU tests' reference does the same.
//
// Tiling (the kernel's thread map, which fixes the summation tree): column
// stripes of 32 values; each warp owns one stripe and 64 consecutive rows
// (4 steps of 16 rows); lane = 2 * rl + cl holds rows (wr*4 + i)*16 + rl,
// i = 0..3, and the 16 columns stripe*32 + cl*16 + c. A column sum is, per
// lane, a serial fma chain over i; then a butterfly over rl (pairs differing
// in rl bit 3, then 2, 1, 0); then a serial sum over the row warps wr. The
// readout uses o' = S_new^T qs = S_bar^T qs + (qs . k) db, so both sums read
// the state once, before the update.
//
//   DecodeTiling t = MakeDecodeTiling(128, 128);   // 4 stripes x 2 row warps
#ifndef STATECACHE_KERNELS_CUDA_DECODE_MATH_H_
#define STATECACHE_KERNELS_CUDA_DECODE_MATH_H_

#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/formats/numeric.h"

namespace statecache {

inline constexpr int kTileRowsPerStep = 16;  // rows covered by one warp step
inline constexpr int kTileSteps = 4;         // row steps per warp (rows per lane)
inline constexpr int kTileRowsPerWarp = kTileRowsPerStep * kTileSteps;
inline constexpr int kTileColsPerLane = 16;
inline constexpr int kTileStripe = 32;       // columns per warp (= one quant group / H32 block)
inline constexpr int kMaxTileThreads = 256;  // CTA size limit of the kernels

struct DecodeTiling {
  int stripes = 0;    // d_v / 32
  int row_warps = 0;  // ceil(d_k / 64)
  int warps = 0;      // stripes * row_warps (warp w: stripe w % stripes, row warp w / stripes)
  int threads = 0;
};

SC_HD DecodeTiling MakeDecodeTiling(int d_k, int d_v) {
  DecodeTiling t;
  t.stripes = d_v / kTileStripe;
  t.row_warps = (d_k + kTileRowsPerWarp - 1) / kTileRowsPerWarp;
  t.warps = t.stripes * t.row_warps;
  t.threads = 32 * t.warps;
  return t;
}

// exp(x) for -104 <= x <= 88: Cody-Waite reduction by ln 2 and the Cephes
// expf polynomial, all in FMA / IEEE ops (<= 2 ulp against exp).
SC_HD float DecayExpInRange(float x) {
  const float n = RoundEven(x * 1.44269504088896341f);
  float r = Fma(n, -0.693359375f, x);
  r = Fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = Fma(p, r, 1.3981999507e-3f);
  p = Fma(p, r, 8.3334519073e-3f);
  p = Fma(p, r, 4.1665795894e-2f);
  p = Fma(p, r, 1.6666665459e-1f);
  p = Fma(p, r, 5.0000001201e-1f);
  const float y = Fma(p, r * r, r) + 1.0f;
  // y * 2^n in two exact power-of-two steps (n in [-150, 127]).
  const int ni = static_cast<int>(n);
  const int n1 = ni < -100 ? ni + 64 : ni;
  const float s1 = BitsToFloat(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = ni < -100 ? BitsToFloat(static_cast<uint32_t>(127 - 64) << 23) : 1.0f;
  return (y * s1) * s2;
}

// exp(x) for the decay gates, identical bits on host and device: 0 below
// -104, saturated at x = 88, DecayExpInRange in between. Branch-free (the
// range ends are selects; below -104 the value of the clamped input is
// computed and dropped), so a warp's lanes never diverge in it.
SC_HD float DecayExp(float x) {
  const float e = DecayExpInRange(x < -104.0f ? -104.0f : (x > 88.0f ? 88.0f : x));
  return x < -104.0f ? 0.0f : e;
}

// Sums the 16 lane partials p[rl] of one warp in the kernel's butterfly order.
SC_HD float WarpTreeSum(const float* p) {
  float t1[8], t2[4], t3[2];
  for (int x = 0; x < 8; ++x) t1[x] = p[x] + p[x | 8];
  for (int x = 0; x < 4; ++x) t2[x] = t1[x] + t1[x | 4];
  for (int x = 0; x < 2; ++x) t3[x] = t2[x] + t2[x | 2];
  return t3[0] + t3[1];
}

// One token of the recurrence on the working state w[d_k][d_v] (stored order,
// transformed value domain), in the kernel's exact arithmetic.
//   a[d_k]: decay per stored row; k[d_k]; qs[d_k] = scale * q (stored order);
//   vp[d_v] = M^T v; op[d_v] receives o' = w_new^T qs (map back with M^-T).
// Both row sums read the state before the update, so the kernel needs one
// reduction phase: with ka_r = k_r a_r and qa_r = qs_r a_r,
//   kS_j = sum_r ka_r w_rj,  qS_j = sum_r qa_r w_rj,  qk = sum_r qs_r k_r,
//   db_j = beta (v'_j - kS_j),  w_rj = fma(k_r, db_j, a_r w_rj),
//   o'_j = fma(qk, db_j, qS_j)        (= sum_r qs_r w_new_rj).
SC_HD void ReferenceHeadStep(int d_k, int d_v, const float* a, const float* k, const float* qs,
                             float beta, const float* vp, float* w, float* op) {
  const DecodeTiling t = MakeDecodeTiling(d_k, d_v);
  // Row sums of one column (or of qs*k when col < 0) in the kernel's tree.
  auto tree = [&](int col, bool use_q) {
    float total = 0.0f;
    for (int wr = 0; wr < t.row_warps; ++wr) {
      float p[16];
      for (int rl = 0; rl < 16; ++rl) {
        float acc = 0.0f;
        for (int i = 0; i < kTileSteps; ++i) {
          const int r = (wr * kTileSteps + i) * kTileRowsPerStep + rl;
          if (r >= d_k) continue;
          if (col < 0) {
            acc = Fma(qs[r], k[r], acc);
          } else {
            const float c = use_q ? qs[r] * a[r] : k[r] * a[r];
            acc = Fma(c, w[r * d_v + col], acc);
          }
        }
        p[rl] = acc;
      }
      const float s = WarpTreeSum(p);
      total = wr == 0 ? s : total + s;
    }
    return total;
  };
  const float qk = tree(-1, false);
  for (int j = 0; j < d_v; ++j) {
    const float ks = tree(j, false);
    const float qsum = tree(j, true);
    const float db = beta * (vp[j] - ks);
    for (int r = 0; r < d_k; ++r) w[r * d_v + j] = Fma(k[r], db, a[r] * w[r * d_v + j]);
    op[j] = Fma(qk, db, qsum);
  }
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_DECODE_MATH_H_
