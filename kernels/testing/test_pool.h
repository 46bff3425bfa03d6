// Backend test fixtures: a slot pool on a backend, and a calibrated-looking
// STEPQuant layout.
//
//   TestPool pool = MakeTestPool(*backend, layout, /*slots=*/4);
//   backend->DecodeUpdate(*pool.model, pool.view, layer, inputs);
//   std::vector<uint8_t> bytes = pool.Bytes();   // through the backend's CopyOut
#ifndef STATECACHE_KERNELS_TESTING_TEST_POOL_H_
#define STATECACHE_KERNELS_TESTING_TEST_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "kernels/backend/backend.h"
#include "kernels/layout/geometry.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

// A pool of slots for one layout on one backend, with its prepared model.
struct TestPool {
  Backend* backend = nullptr;
  std::unique_ptr<BackendBuffer> buf;
  std::unique_ptr<PreparedModel> model;
  PoolView view;
  int64_t bytes() const { return view.num_slots * view.slot_bytes(); }
  // The pool's bytes, and overwriting them (a size mismatch fails the test).
  std::vector<uint8_t> Bytes() const;
  void SetBytes(const std::vector<uint8_t>& b);
};

// Allocates `slots` slots and prepares `layout` (a failure fails the test).
TestPool MakeTestPool(Backend& backend, const StateLayout& layout, int slots);

// A STEPQuant layout with random key permutations and row impact in
// (0.05, 1], and per head the key rows' widths from head_bits(head, rng)
// (called in head order, between the head's permutation and its impact
// draws from the same generator).
StateLayout RandomStepQuantLayout(
    const ModelGeometry& geo, StateFormat f, uint32_t seed,
    const std::function<std::vector<int8_t>(int64_t head, std::mt19937& rng)>& head_bits);

// A calibrated-looking STEPQuant layout: random key permutations and row
// impact in (0.05, 1]; GDN one width per head from `candidate_bits` (the
// format's candidates, StepQuantCandidateBits) with FP16 pivot heads, KDA
// mixed-width rows with two pivot rows per head. Pivot heads: head 1 of the
// slot, or with `pivot_head_per_layer` head 1 of every layer.
StateLayout MixedStepQuantLayout(const ModelGeometry& geo, StateFormat f, uint32_t seed,
                                 bool pivot_head_per_layer,
                                 const std::vector<int>& candidate_bits);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_TESTING_TEST_POOL_H_
