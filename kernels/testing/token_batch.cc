#include "kernels/testing/token_batch.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace statecache {

TokenBatch RandomTokenBatch(const ModelGeometry& geo, int rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  TokenBatch b;
  auto unit = [&](std::vector<float>& x, int64_t count, int dim) {
    x.resize(count * dim);
    for (int64_t i = 0; i < count; ++i) {
      double s = 0;
      for (int j = 0; j < dim; ++j) s += std::pow(x[i * dim + j] = n(rng), 2);
      for (int j = 0; j < dim; ++j) x[i * dim + j] /= static_cast<float>(std::sqrt(s));
    }
  };
  unit(b.q, int64_t{rows} * geo.h_qk, geo.d_k);
  unit(b.k, int64_t{rows} * geo.h_qk, geo.d_k);
  b.v.resize(int64_t{rows} * geo.h_v * geo.d_v);
  for (float& x : b.v) x = n(rng);
  b.g.resize(int64_t{rows} * geo.h_v * geo.GateWidth());
  for (float& x : b.g) x = std::log(0.8f + 0.2f * u(rng));
  b.beta.resize(int64_t{rows} * geo.h_v);
  for (float& x : b.beta) x = 0.2f + 0.6f * u(rng);
  return b;
}

DecodeInputs DecodeInputsFor(const TokenBatch& b, const ModelGeometry& geo, const int32_t* slots,
                             int batch, float* o, int row) {
  return DecodeInputs{batch,
                      slots,
                      DType::kFp32,
                      b.q.data() + int64_t{row} * geo.h_qk * geo.d_k,
                      b.k.data() + int64_t{row} * geo.h_qk * geo.d_k,
                      b.v.data() + int64_t{row} * geo.h_v * geo.d_v,
                      b.g.data() + int64_t{row} * geo.h_v * geo.GateWidth(),
                      b.beta.data() + int64_t{row} * geo.h_v,
                      o};
}

std::vector<bool> UsedSlots(int num_slots, const std::vector<int32_t>& slots) {
  std::vector<bool> used(num_slots, false);
  for (int32_t s : slots) {
    if (s >= 0) used[s] = true;
  }
  return used;
}

ShuffledBatch MakeShuffledBatch(int num_slots, int batch, uint32_t seed, int first, int gap) {
  std::vector<int32_t> all(num_slots);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  ShuffledBatch b;
  b.slots.assign(all.begin(), all.begin() + batch);
  for (int i = first; i < batch; i += gap) b.slots[i] = -1;
  b.used = UsedSlots(num_slots, b.slots);
  return b;
}

}  // namespace statecache
