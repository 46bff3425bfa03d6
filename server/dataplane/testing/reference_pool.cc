#include "server/dataplane/testing/reference_pool.h"

#include "gtest/gtest.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/formats/format.h"

namespace statecache {
namespace dataplane_testing {

ModelGeometry TestGeometry() {
  ModelGeometry g;
  g.arch = Arch::kGdn;
  g.layers = 2;
  g.h_qk = 2;
  g.h_v = 4;
  g.d_k = 32;
  g.d_v = 32;
  return g;
}

TokenBatch MakeTestStep(std::mt19937* rng) {
  return RandomTokenBatch(TestGeometry(), kTestSlots, (*rng)());
}

ReferencePool::ReferencePool() {
  const ModelGeometry geo = TestGeometry();
  backend_ = *CreateBackend("cpu");
  layout_ = std::make_unique<StateLayout>(*StateLayout::Identity(geo, *ParseFormatSpec("damp:8")));
  prepared_ = *backend_->Prepare(*layout_);
  arena_ = *backend_->Allocate(kTestSlots * layout_->slot_bytes());
  view_.base = arena_->data();
  view_.num_slots = kTestSlots;
  view_.layers = geo.layers;
  view_.heads = geo.h_v;
  view_.head_bytes = layout_->head_layout().head_bytes;
}

std::vector<float> ReferencePool::Update(int layer, const TokenBatch& s,
                                         std::vector<int32_t> slots) {
  const ModelGeometry geo = TestGeometry();
  std::vector<float> o(int64_t{kTestSlots} * geo.h_v * geo.d_v);
  const DecodeInputs in = DecodeInputsFor(s, geo, slots.data(), kTestSlots, o.data());
  EXPECT_TRUE(backend_->DecodeUpdate(*prepared_, view_, layer, in).ok());
  return o;
}

std::string ReferencePool::Packed(int slot) const {
  return std::string(reinterpret_cast<const char*>(view_.slot(slot)), layout_->slot_bytes());
}

}  // namespace dataplane_testing
}  // namespace statecache
