#include "kernels/testing/test_pool.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace statecache {

std::vector<uint8_t> TestPool::Bytes() const {
  std::vector<uint8_t> out(bytes());
  EXPECT_TRUE(backend->CopyOut(out.data(), view.base, bytes()).ok());
  return out;
}

void TestPool::SetBytes(const std::vector<uint8_t>& b) {
  ASSERT_EQ(static_cast<int64_t>(b.size()), bytes());
  ASSERT_TRUE(backend->CopyIn(view.base, b.data(), bytes()).ok());
}

TestPool MakeTestPool(Backend& backend, const StateLayout& layout, int slots) {
  TestPool p;
  p.backend = &backend;
  absl::StatusOr<std::unique_ptr<BackendBuffer>> buf = backend.Allocate(layout.slot_bytes() * slots);
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (buf.ok()) p.buf = std::move(buf).value();
  absl::StatusOr<std::unique_ptr<PreparedModel>> m = backend.Prepare(layout);
  EXPECT_TRUE(m.ok()) << m.status();
  if (m.ok()) p.model = std::move(m).value();
  p.view = PoolView{p.buf != nullptr ? p.buf->data() : nullptr, slots, layout.geometry().layers,
                    layout.geometry().h_v, layout.head_layout().head_bytes};
  return p;
}

StateLayout RandomStepQuantLayout(
    const ModelGeometry& geo, StateFormat f, uint32_t seed,
    const std::function<std::vector<int8_t>(int64_t head, std::mt19937& rng)>& head_bits) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  std::vector<int32_t> perm;
  std::vector<int8_t> bits;
  std::vector<float> impact;
  for (int64_t h = 0; h < geo.HeadsPerSlot(); ++h) {
    std::vector<int32_t> p(geo.d_k);
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
    perm.insert(perm.end(), p.begin(), p.end());
    const std::vector<int8_t> b = head_bits(h, rng);
    bits.insert(bits.end(), b.begin(), b.end());
    for (int r = 0; r < geo.d_k; ++r) impact.push_back(u(rng));
  }
  absl::StatusOr<StateLayout> l = StateLayout::CreateStepQuant(geo, {f, 0}, perm, bits, impact);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

StateLayout MixedStepQuantLayout(const ModelGeometry& geo, StateFormat f, uint32_t seed,
                                 bool pivot_head_per_layer,
                                 const std::vector<int>& candidate_bits) {
  const std::vector<int>& cand = candidate_bits;
  return RandomStepQuantLayout(geo, f, seed, [&](int64_t h, std::mt19937& rng) {
    std::vector<int8_t> b(geo.d_k);
    if (geo.arch == Arch::kGdn) {
      const bool pivot = (pivot_head_per_layer ? h % geo.h_v : h) == 1;
      std::fill(b.begin(), b.end(), pivot ? 16 : cand[h % cand.size()]);
    } else {
      for (int r = 0; r < geo.d_k; ++r) b[r] = r < 2 ? 16 : cand[rng() % cand.size()];
      std::sort(b.begin(), b.end(), std::greater<int8_t>());
    }
    return b;
  });
}

}  // namespace statecache
