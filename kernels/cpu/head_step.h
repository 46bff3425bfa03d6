// The FP32 recurrence of one head for one token, on a working state in
// stored order (DESIGN.md sections 2 and 7). This is the CPU reference: the
// CUDA kernels compute the same arithmetic (up to summation order).
//
//   S_bar = diag(exp(g)) S;  delta = beta (v - S_bar^T k);
//   S = S_bar + k delta^T;   o = S^T q_scaled
//
// All vectors are in stored order: q, k and (KDA) g gathered by the layout's
// key permutation, v already mapped to the stored value domain (M^T v), and o
// returned in the stored value domain (map back with ValueFromStored).
#ifndef STATECACHE_KERNELS_CPU_HEAD_STEP_H_
#define STATECACHE_KERNELS_CPU_HEAD_STEP_H_

#include "kernels/layout/geometry.h"

namespace statecache {

struct HeadStepInputs {
  const float* q = nullptr;  // [d_k], already multiplied by the readout scale
  const float* k = nullptr;  // [d_k]
  const float* g = nullptr;  // GDN: g[0]; KDA: [d_k]
  float beta = 0.0f;
  const float* v = nullptr;  // [d_v]
};

// Updates w[d_k][d_v] in place and writes o[d_v]. `scratch` holds d_v floats.
void HeadStep(Arch arch, int d_k, int d_v, const HeadStepInputs& in, float* w, float* o,
              float* scratch);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CPU_HEAD_STEP_H_
