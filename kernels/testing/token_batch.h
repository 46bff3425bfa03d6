// Test inputs for backend tests: host arrays of one layer's recurrent inputs
// for `rows` token rows, and the DecodeInputs view of one row range.
//
//   TokenBatch b = RandomTokenBatch(geometry, /*rows=*/8, /*seed=*/1);
//   DecodeInputs in = DecodeInputsFor(b, geometry, slots, batch, o.data(), row);
#ifndef STATECACHE_KERNELS_TESTING_TOKEN_BATCH_H_
#define STATECACHE_KERNELS_TESTING_TOKEN_BATCH_H_

#include <cstdint>
#include <vector>

#include "kernels/backend/backend.h"
#include "kernels/layout/geometry.h"

namespace statecache {

// q, k [rows, h_qk, d_k]; v [rows, h_v, d_v]; g [rows, h_v, GateWidth()];
// beta [rows, h_v]; FP32, natural order.
struct TokenBatch {
  std::vector<float> q, k, v, g, beta;
};

// Random inputs: q and k of unit norm per head, v ~ N(0, 1), decays
// exp(g) uniform in [0.8, 1), beta uniform in [0.2, 0.8). Deterministic in
// `seed`.
TokenBatch RandomTokenBatch(const ModelGeometry& geometry, int rows, uint32_t seed);

// FP32 DecodeInputs over `batch` rows of `b` starting at token row `row`.
DecodeInputs DecodeInputsFor(const TokenBatch& b, const ModelGeometry& geometry,
                             const int32_t* slots, int batch, float* o, int row = 0);

// used[s]: whether slot s of [0, num_slots) is among `slots` (-1 entries
// skipped).
std::vector<bool> UsedSlots(int num_slots, const std::vector<int32_t>& slots);

// A batch of `batch` distinct slots of [0, num_slots) in shuffled order
// (std::mt19937(seed) over 0..num_slots-1) with every `gap`-th entry from
// `first` on set to -1 (skipped), and which slots it updates (used[s]).
struct ShuffledBatch {
  std::vector<int32_t> slots;
  std::vector<bool> used;
};
ShuffledBatch MakeShuffledBatch(int num_slots, int batch, uint32_t seed, int first, int gap);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_TESTING_TOKEN_BATCH_H_
