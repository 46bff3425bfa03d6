#include "kernels/cpu/head_step.h"

#include <cmath>

namespace statecache {

void HeadStep(Arch arch, int d_k, int d_v, const HeadStepInputs& in, float* w, float* o,
              float* scratch) {
  float* __restrict kv = scratch;  // S_bar^T k, then beta * delta
  for (int j = 0; j < d_v; ++j) kv[j] = 0.0f;
  const float gdn_decay = arch == Arch::kGdn ? std::exp(in.g[0]) : 0.0f;
  for (int r = 0; r < d_k; ++r) {
    float* __restrict row = w + r * d_v;
    const float a = arch == Arch::kGdn ? gdn_decay : std::exp(in.g[r]);
    const float kr = in.k[r];
    for (int j = 0; j < d_v; ++j) {
      row[j] *= a;
      kv[j] += kr * row[j];
    }
  }
  for (int j = 0; j < d_v; ++j) {
    kv[j] = in.beta * (in.v[j] - kv[j]);
    o[j] = 0.0f;
  }
  for (int r = 0; r < d_k; ++r) {
    float* __restrict row = w + r * d_v;
    const float kr = in.k[r];
    const float qr = in.q[r];
    for (int j = 0; j < d_v; ++j) {
      row[j] += kr * kv[j];
      o[j] += qr * row[j];
    }
  }
}

}  // namespace statecache
