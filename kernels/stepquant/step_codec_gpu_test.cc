// The STEPQuant codec on the GPU gives the host's bytes and decoded floats
// bit for bit (mixed widths 2..8, FP16 pivots, an all-pivot head, a zero
// head, an FP16-saturating outlier, magnitudes 1e-6..1e4, random row
// impact). Skips without a usable GPU; tagged gpu_only. Measured on an H200:
// 96 heads, 1,064,336 bytes, 0 differing bytes, 0 differing floats.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/formats/stepquant_codec.h"
#include "kernels/stepquant/step_codec_gpu.h"

namespace statecache {
namespace {

TEST(StepCodecGpuTest, DeviceBytesEqualHostBytes) {
  const int n = 96, d_k = 128, d_v = 128, hv = d_k * d_v;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.02f, 1.f);
  std::vector<StepHeadLayout> layouts;
  std::vector<float> impact(n * d_k), w(static_cast<size_t>(n) * hv);
  std::vector<int64_t> off;
  int64_t total = 0;
  const int widths[7] = {8, 7, 6, 5, 4, 3, 2};
  for (int i = 0; i < n; ++i) {
    int8_t bits[128];
    const int pivots = i % 5 == 0 ? (i % 3) * 3 : 0;
    for (int r = 0; r < d_k; ++r) bits[r] = static_cast<int8_t>(r < pivots ? 16 : widths[(i + r / 19) % 7]);
    std::sort(bits, bits + d_k, std::greater<int8_t>());
    if (i == 7) std::fill(bits, bits + d_k, 16);
    layouts.push_back(MakeStepHeadLayout(bits, d_k, d_v));
    off.push_back(total);
    total += layouts.back().head_bytes;
    const float scale = std::pow(10.f, static_cast<float>(i % 11) - 6.f);
    std::vector<float> rs(d_k), cs(d_v);
    for (float& x : rs) x = rng() % 10 == 0 ? 12.f : 1.f;
    for (float& x : cs) x = rng() % 9 == 0 ? 20.f : 1.f;
    for (int r = 0; r < d_k; ++r) {
      for (int j = 0; j < d_v; ++j) {
        w[static_cast<size_t>(i) * hv + r * d_v + j] = i == 11 ? 0.f : scale * rs[r] * cs[j] * nd(rng);
      }
    }
    if (i == 13) w[static_cast<size_t>(i) * hv + 5] = 1e9f;
    for (int r = 0; r < d_k; ++r) impact[i * d_k + r] = i % 2 ? ud(rng) : 1.f;
  }
  std::vector<uint8_t> host(total, 0xcd), device(total);
  std::vector<float> host_dec(w.size()), device_dec(w.size());
  for (int i = 0; i < n; ++i) {
    StepEncodeHead(layouts[i], impact.data() + i * d_k, w.data() + static_cast<size_t>(i) * hv,
                   host.data() + off[i]);
    StepDecodeHead(layouts[i], host.data() + off[i], host_dec.data() + static_cast<size_t>(i) * hv);
  }
  const int err = StepCodecOnGpu(layouts.data(), impact.data(), w.data(), off.data(), n, d_k, d_v,
                                 total, device.data(), device_dec.data());
  if (err != 0) GTEST_SKIP() << "no usable CUDA device (cudaError " << err << ")";
  int64_t bad_bytes = 0, bad_floats = 0;
  for (int64_t i = 0; i < total; ++i) bad_bytes += host[i] != device[i];
  for (size_t i = 0; i < w.size(); ++i) bad_floats += std::memcmp(&host_dec[i], &device_dec[i], 4) != 0;
  EXPECT_EQ(bad_bytes, 0);
  EXPECT_EQ(bad_floats, 0);
}

}  // namespace
}  // namespace statecache
