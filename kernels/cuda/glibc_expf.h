// expf exactly as glibc computes it (glibc >= 2.28, sysdeps/ieee754/flt-32/
// e_expf.c, the FMA variant that x86-64 CPUs with FMA dispatch to), for host
// and device. The CPU backend's HeadStep takes the decay with std::exp(float),
// i.e. glibc expf, which is not correctly rounded (0.502 ulp): a device
// (float)exp((double)g) disagrees on ~0.03% of gates. The STEPQuant CUDA
// kernel uses GlibcExpf so its decays, and hence its packed bytes, equal the
// CPU backend's (glibc_expf_test checks it against std::exp on the host).
//
// Algorithm: k = round(x * 32 / ln2), r = x * 32 / ln2 - k,
// 2^(k/32) from a 32-entry table, 2^(r/32) by a degree-3 polynomial in double,
// one rounding to float at the end.
//
//   float a = GlibcExpf(-0.1f);  // == std::exp(-0.1f) on glibc x86-64
#ifndef STATECACHE_KERNELS_CUDA_GLIBC_EXPF_H_
#define STATECACHE_KERNELS_CUDA_GLIBC_EXPF_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/common/host_device.h"

namespace statecache {

SC_HD uint64_t GlibcDoubleBits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
#endif
}

SC_HD double GlibcBitsToDouble(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, 8);
  return d;
#endif
}

SC_HD float GlibcExpf(float x) {
  // bits(2^(i/32)) - (i << 47), as glibc's __exp2f_data.tab.
  const uint64_t tab[32] = {
      0x3ff0000000000000ULL, 0x3fefd9b0d3158574ULL, 0x3fefb5586cf9890fULL, 0x3fef9301d0125b51ULL,
      0x3fef72b83c7d517bULL, 0x3fef54873168b9aaULL, 0x3fef387a6e756238ULL, 0x3fef1e9df51fdee1ULL,
      0x3fef06fe0a31b715ULL, 0x3feef1a7373aa9cbULL, 0x3feedea64c123422ULL, 0x3feece086061892dULL,
      0x3feebfdad5362a27ULL, 0x3feeb42b569d4f82ULL, 0x3feeab07dd485429ULL, 0x3feea47eb03a5585ULL,
      0x3feea09e667f3bcdULL, 0x3fee9f75e8ec5f74ULL, 0x3feea11473eb0187ULL, 0x3feea589994cce13ULL,
      0x3feeace5422aa0dbULL, 0x3feeb737b0cdc5e5ULL, 0x3feec49182a3f090ULL, 0x3feed503b23e255dULL,
      0x3feee89f995ad3adULL, 0x3feeff76f2fb5e47ULL, 0x3fef199bdd85529cULL, 0x3fef3720dcef9069ULL,
      0x3fef5818dcfba487ULL, 0x3fef7c97337b9b5fULL, 0x3fefa4afa2a490daULL, 0x3fefd0765b6e4540ULL,
  };
  if (x != x) return x + x;                                  // NaN
  if (x > 0x1.62e42ep6f) return INFINITY;                    // overflow
  if (x < -0x1.9fe368p6f) return 0.0f;                       // underflow (and -inf)
  const double kInvLn2N = 0x1.71547652b82fep+0 * 32;
  const double kShift = 0x1.8p+52;
  const double c0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32;
  const double c1 = 0x1.ebfce50fac4f3p-3 / 32 / 32;
  const double c2 = 0x1.62e42ff0c52d6p-1 / 32;
  const double z = kInvLn2N * static_cast<double>(x);
  double kd = z + kShift;
  const uint64_t ki = GlibcDoubleBits(kd);
  kd -= kShift;
  const double r = z - kd;
  const double s = GlibcBitsToDouble(tab[ki % 32] + (ki << 47));
  const double p = fma(c0, r, c1);
  const double r2 = r * r;
  double y = fma(c2, r, 1.0);
  y = fma(p, r2, y);
  y = y * s;
  return static_cast<float>(y);
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_GLIBC_EXPF_H_
