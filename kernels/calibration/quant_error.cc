#include "kernels/calibration/quant_error.h"

#include <cmath>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define SC_CALIB_AVX2 1
#endif

#include "kernels/formats/group_quant.h"
#include "kernels/formats/hadamard.h"
#include "kernels/formats/head_layout.h"
#include "kernels/formats/numeric.h"

namespace statecache {

#if defined(SC_CALIB_AVX2)
namespace {

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float HorizontalMin(__m256 v) {
  __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_min_ps(s, _mm_movehl_ps(s, s));
  s = _mm_min_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float HorizontalMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// AffineRound (group_quant.h) on 8 lanes: rint of the exact x * inv_s + c
// by one FMA with the 1.5 * 2^23 constant plus c, as the codecs encode.
inline __m256 RoundProduct(__m256 x, __m256 inv_s, float c = 0.0f) {
  const __m256 magic = _mm256_set1_ps(kRoundMagic);
  return _mm256_sub_ps(_mm256_fmadd_ps(x, inv_s, _mm256_set1_ps(kRoundMagic + c)), magic);
}

}  // namespace

double AffineU8RowError(const float* x, int d_v) {
  double total = 0.0;
  const __m256 zero = _mm256_setzero_ps(), qmax = _mm256_set1_ps(255.0f);
  for (int g = 0; g < d_v; g += kGroupSize) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + g + 8 * i);
    const float mn = HorizontalMin(_mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3])));
    const float mx = HorizontalMax(_mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3])));
    const AffineParams p = MakeAffineParams(mn, mx, 255);
    const __m256 s = _mm256_set1_ps(HalfBitsToFloat(p.s_bits));
    const __m256 z = _mm256_set1_ps(HalfBitsToFloat(p.z_bits));
    const __m256 inv_s = _mm256_set1_ps(p.inv_s);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      __m256 q = RoundProduct(v[i], inv_s, p.z);  // AffineEncode
      q = _mm256_min_ps(_mm256_max_ps(q, zero), qmax);
      const __m256 x_hat = _mm256_mul_ps(s, _mm256_sub_ps(q, z));
      const __m256 d = _mm256_sub_ps(x_hat, v[i]);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
    }
    total += HorizontalSum(acc);
  }
  return total;
}

double SymI8RowError(const float* x, const float* col_scale, int d_v) {
  double total = 0.0;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 lo = _mm256_set1_ps(-kSymI8Max), hi = _mm256_set1_ps(kSymI8Max);
  for (int g = 0; g < d_v; g += kGroupSize) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + g + 8 * i);
    const __m256 a01 = _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask));
    const __m256 a23 = _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask));
    const float sc = MakeSymScale(HorizontalMax(_mm256_max_ps(a01, a23)));
    const __m256 s = _mm256_set1_ps(sc), inv_s = _mm256_set1_ps(1.0f / sc);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      __m256 q = RoundProduct(v[i], inv_s);
      q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
      __m256 d = _mm256_sub_ps(_mm256_mul_ps(s, q), v[i]);
      if (col_scale != nullptr) d = _mm256_mul_ps(d, _mm256_loadu_ps(col_scale + g + 8 * i));
      acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
    }
    total += HorizontalSum(acc);
  }
  return total;
}

double Fp16RowError(const float* x, const float* col_scale, int d_v) {
  // F16C rounds to nearest even like FloatToHalfBits; clamping to +-65504
  // first reproduces its saturation.
  const __m256 lim = _mm256_set1_ps(kFp16Max), nlim = _mm256_set1_ps(-kFp16Max);
  __m256 acc = _mm256_setzero_ps();
  for (int j = 0; j < d_v; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    const __m256 c = _mm256_max_ps(_mm256_min_ps(v, lim), nlim);
    const __m256 r = _mm256_cvtph_ps(_mm256_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT));
    __m256 d = _mm256_sub_ps(r, v);
    if (col_scale != nullptr) d = _mm256_mul_ps(d, _mm256_loadu_ps(col_scale + j));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
  }
  return HorizontalSum(acc);
}

void FastBlockHadamard32(float* x, int d_v) {
  // Lanes whose index has bit h set take (partner - self), the others
  // (self + partner): exactly the scalar butterflies a + b / a - b.
  const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
  const __m256 s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
  const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
  const __m256 norm = _mm256_set1_ps(kHadamardNorm);
  for (int b = 0; b < d_v; b += kHadamardBlock) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + b + 8 * i);
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_add_ps(_mm256_permute_ps(v[i], 0xB1), _mm256_mul_ps(v[i], s1));
    }
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_add_ps(_mm256_permute_ps(v[i], 0x4E), _mm256_mul_ps(v[i], s2));
    }
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[i], v[i], 1), _mm256_mul_ps(v[i], s4));
    }
    // Stride 8: (0,1), (2,3); stride 16: (0,2), (1,3).
    __m256 t0 = _mm256_add_ps(v[0], v[1]), t1 = _mm256_sub_ps(v[0], v[1]);
    __m256 t2 = _mm256_add_ps(v[2], v[3]), t3 = _mm256_sub_ps(v[2], v[3]);
    v[0] = _mm256_add_ps(t0, t2);
    v[2] = _mm256_sub_ps(t0, t2);
    v[1] = _mm256_add_ps(t1, t3);
    v[3] = _mm256_sub_ps(t1, t3);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(x + b + 8 * i, _mm256_mul_ps(v[i], norm));
  }
}

void GatherScaled(const float* x, const int32_t* order, const float* scale, float* out, int d_v) {
  for (int j = 0; j < d_v; j += 8) {
    const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(order + j));
    const __m256 g = _mm256_i32gather_ps(x, idx, 4);
    _mm256_storeu_ps(out + j, _mm256_div_ps(g, _mm256_loadu_ps(scale + j)));
  }
}

void SrErrorsTransposed(const float* st, int d_k, int d_v, const int32_t* order,
                        const float* scale, float* buf, float* e8, float* e16) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 lo = _mm256_set1_ps(-kSymI8Max), hi = _mm256_set1_ps(kSymI8Max);
  const __m256 qmax = _mm256_set1_ps(kSymI8Max), tiny = _mm256_set1_ps(kMinGroupAbsMax);
  const __m256 lim = _mm256_set1_ps(kFp16Max), nlim = _mm256_set1_ps(-kFp16Max);
  const int dk8 = d_k / 8 * 8;
  for (int u = 0; u < d_k; ++u) e8[u] = e16[u] = 0.0f;
  for (int g = 0; g < d_v; g += kGroupSize) {
    // Mapped rows of this group, and their absmax per key channel.
    for (int u = 0; u < dk8; u += 8) {
      __m256 amax = _mm256_setzero_ps();
      for (int i = 0; i < kGroupSize; ++i) {
        const __m256 c = _mm256_set1_ps(scale[g + i]);
        const __m256 t = _mm256_div_ps(_mm256_loadu_ps(st + int64_t{order[g + i]} * d_k + u), c);
        _mm256_storeu_ps(buf + i * d_k + u, t);
        amax = _mm256_max_ps(amax, _mm256_and_ps(t, abs_mask));
      }
      // MakeSymScale: max(absmax, 1e-10) / 127.
      const __m256 s = _mm256_div_ps(_mm256_blendv_ps(tiny, amax, _mm256_cmp_ps(amax, tiny, _CMP_GT_OQ)), qmax);
      const __m256 inv_s = _mm256_div_ps(_mm256_set1_ps(1.0f), s);
      __m256 a8 = _mm256_loadu_ps(e8 + u), a16 = _mm256_loadu_ps(e16 + u);
      for (int i = 0; i < kGroupSize; ++i) {
        const __m256 c = _mm256_set1_ps(scale[g + i]);
        const __m256 t = _mm256_loadu_ps(buf + i * d_k + u);
        __m256 q = RoundProduct(t, inv_s);
        q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
        const __m256 d = _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(s, q), t), c);
        a8 = _mm256_add_ps(a8, _mm256_mul_ps(d, d));
        const __m256 r = _mm256_cvtph_ps(
            _mm256_cvtps_ph(_mm256_max_ps(_mm256_min_ps(t, lim), nlim), _MM_FROUND_TO_NEAREST_INT));
        const __m256 d16 = _mm256_mul_ps(_mm256_sub_ps(r, t), c);
        a16 = _mm256_add_ps(a16, _mm256_mul_ps(d16, d16));
      }
      _mm256_storeu_ps(e8 + u, a8);
      _mm256_storeu_ps(e16 + u, a16);
    }
  }
  // Key channels past the last full vector: the row functions.
  if (dk8 < d_k) {
    float* row = buf;
    for (int u = dk8; u < d_k; ++u) {
      for (int j = 0; j < d_v; ++j) row[j] = st[int64_t{order[j]} * d_k + u] / scale[j];
      e8[u] = static_cast<float>(SymI8RowError(row, scale, d_v));
      e16[u] = static_cast<float>(Fp16RowError(row, scale, d_v));
    }
  }
}

double SquaredNorm(const float* x, int d_v) {
  __m256 acc = _mm256_setzero_ps();
  for (int j = 0; j < d_v; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
  }
  return HorizontalSum(acc);
}

#else  // scalar fallback

double AffineU8RowError(const float* x, int d_v) {
  double total = 0.0;
  for (int g = 0; g < d_v; g += kGroupSize) {
    const float* xg = x + g;
    float mn = xg[0], mx = xg[0];
    for (int j = 1; j < kGroupSize; ++j) {
      mn = xg[j] < mn ? xg[j] : mn;
      mx = xg[j] > mx ? xg[j] : mx;
    }
    const AffineParams p = MakeAffineParams(mn, mx, 255);
    const float s = HalfBitsToFloat(p.s_bits);
    const float z = HalfBitsToFloat(p.z_bits);
    float e = 0.0f;
    for (int j = 0; j < kGroupSize; ++j) {
      const float q = AffineEncode(xg[j], p, 255);
      const float d = s * (q - z) - xg[j];
      e += d * d;
    }
    total += e;
  }
  return total;
}

double SymI8RowError(const float* x, const float* col_scale, int d_v) {
  double total = 0.0;
  for (int g = 0; g < d_v; g += kGroupSize) {
    const float* xg = x + g;
    float amax = 0.0f;
    for (int j = 0; j < kGroupSize; ++j) amax = std::fabs(xg[j]) > amax ? std::fabs(xg[j]) : amax;
    const float s = MakeSymScale(amax);
    const float inv_s = 1.0f / s;
    float e = 0.0f;
    for (int j = 0; j < kGroupSize; ++j) {
      const float q = Clamp(AffineRound(xg[j], inv_s), -kSymI8Max, kSymI8Max);
      float d = s * q - xg[j];
      if (col_scale != nullptr) d *= col_scale[g + j];
      e += d * d;
    }
    total += e;
  }
  return total;
}

double Fp16RowError(const float* x, const float* col_scale, int d_v) {
  float total = 0.0f;
  for (int j = 0; j < d_v; ++j) {
    float d = HalfBitsToFloat(FloatToHalfBits(x[j])) - x[j];
    if (col_scale != nullptr) d *= col_scale[j];
    total += d * d;
  }
  return total;
}

void FastBlockHadamard32(float* x, int d_v) { BlockHadamard32(x, d_v); }

void GatherScaled(const float* x, const int32_t* order, const float* scale, float* out, int d_v) {
  for (int j = 0; j < d_v; ++j) out[j] = x[order[j]] / scale[j];
}

void SrErrorsTransposed(const float* st, int d_k, int d_v, const int32_t* order,
                        const float* scale, float* buf, float* e8, float* e16) {
  float* row = buf;
  for (int u = 0; u < d_k; ++u) {
    for (int j = 0; j < d_v; ++j) row[j] = st[int64_t{order[j]} * d_k + u] / scale[j];
    e8[u] = static_cast<float>(SymI8RowError(row, scale, d_v));
    e16[u] = static_cast<float>(Fp16RowError(row, scale, d_v));
  }
}

double SquaredNorm(const float* x, int d_v) {
  float s = 0.0f;
  for (int j = 0; j < d_v; ++j) s += x[j] * x[j];
  return s;
}

#endif

void Transpose(const float* in, int rows, int cols, float* out) {
  constexpr int kBlock = 16;
  for (int r0 = 0; r0 < rows; r0 += kBlock) {
    for (int c0 = 0; c0 < cols; c0 += kBlock) {
      const int r1 = r0 + kBlock < rows ? r0 + kBlock : rows;
      const int c1 = c0 + kBlock < cols ? c0 + kBlock : cols;
      for (int r = r0; r < r1; ++r) {
        for (int c = c0; c < c1; ++c) out[int64_t{c} * rows + r] = in[int64_t{r} * cols + c];
      }
    }
  }
}

}  // namespace statecache
