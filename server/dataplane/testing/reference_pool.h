// Shared fixtures of the data-plane tests (tests/dataplane:dataplane_test,
// tests/dataplane:async_submit_test): the test model's geometry, random
// per-step inputs, and the in-process reference every served path is
// compared with bit for bit.
//
//   ReferencePool ref;                       // CPU backend, damp:8, kTestSlots slots
//   TokenBatch s = MakeTestStep(&rng);
//   std::vector<float> o = ref.Update(/*layer=*/0, s);
//   EXPECT_EQ(served_packed_slot, ref.Packed(0));
#ifndef STATECACHE_SERVER_DATAPLANE_TESTING_REFERENCE_POOL_H_
#define STATECACHE_SERVER_DATAPLANE_TESTING_REFERENCE_POOL_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend/backend.h"
#include "kernels/layout/geometry.h"
#include "kernels/layout/state_layout.h"
#include "kernels/testing/token_batch.h"

namespace statecache {
namespace dataplane_testing {

// Slots per update in the tests.
inline constexpr int kTestSlots = 3;

// GDN, 2 layers, 2 key / 4 value heads, 32 x 32.
ModelGeometry TestGeometry();

// One step's inputs for kTestSlots slots, natural layout.
TokenBatch MakeTestStep(std::mt19937* rng);

// The same backend code (CPU, damp:8, identity layout) on a private pool of
// kTestSlots slots.
class ReferencePool {
 public:
  ReferencePool();
  // One decode update of `layer` on `slots`; returns o.
  std::vector<float> Update(int layer, const TokenBatch& s,
                            std::vector<int32_t> slots = {0, 1, 2});
  // The packed bytes of `slot`.
  std::string Packed(int slot) const;

 private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StateLayout> layout_;
  std::unique_ptr<PreparedModel> prepared_;
  std::unique_ptr<BackendBuffer> arena_;
  PoolView view_;
};

}  // namespace dataplane_testing
}  // namespace statecache

#endif  // STATECACHE_SERVER_DATAPLANE_TESTING_REFERENCE_POOL_H_
