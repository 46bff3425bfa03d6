// The CPU backend with stepquant-6 / -4 layouts (variable head sizes, pivots,
// key permutation, row impact): the damp contract - byte determinism across
// thread counts, pack/unpack round trips, prefill == decode bytes, untouched
// slots, bad input - plus accuracy against an FP32 replay.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/formats/stepquant_codec.h"
#include "kernels/stepquant/calibration.h"
#include "kernels/testing/test_pool.h"
#include "kernels/testing/token_batch.h"
#include "kernels/trajectory/synthetic.h"

namespace statecache {
namespace {

// kernels/testing's STEPQuant layout with this test's pivot heads (head 1 of
// the slot).
StateLayout MixedLayout(const ModelGeometry& geo, StateFormat f, uint32_t seed) {
  return MixedStepQuantLayout(geo, f, seed, /*pivot_head_per_layer=*/false,
                              StepQuantCandidateBits(f));
}

const ModelGeometry kGdnSmall{Arch::kGdn, 2, 2, 4, 64, 64};
const ModelGeometry kKdaSmall{Arch::kKda, 2, 3, 3, 64, 32};

class StepCpuTest : public ::testing::TestWithParam<std::tuple<ModelGeometry, StateFormat>> {};

TEST_P(StepCpuTest, HeadsSitAtTheLayoutOffsets) {
  const auto [geo, f] = GetParam();
  const StateLayout layout = MixedLayout(geo, f, 1);
  auto backend = CpuBackend::Create({2});
  TestPool pool = MakeTestPool(*backend, layout, 2);
  // Pack a state whose heads are distinct, then decode each head directly
  // from the bytes at slot + head_offset with its own StepHeadLayout.
  std::vector<float> states(2 * geo.HeadsPerSlot() * geo.d_k * geo.d_v);
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (float& x : states) x = n(rng);
  const int32_t slots[2] = {1, 0};
  ASSERT_TRUE(backend->PackStates(*pool.model, pool.view, slots, 2, states.data()).ok());
  const int64_t hv = int64_t{geo.d_k} * geo.d_v;
  std::vector<float> w(hv);
  for (int layer = 0; layer < geo.layers; ++layer) {
    for (int h = 0; h < geo.h_v; ++h) {
      const uint8_t* head = pool.view.slot(1) + layout.head_offset(layer, h);
      StepDecodeHead(layout.step_head(layer, h), head, w.data());
      // Stored row r = key channel perm[r] of state 0 (slot 1).
      const int32_t* perm = layout.key_perm(layer, h);
      const float* src = states.data() + (int64_t{layer} * geo.h_v + h) * hv;
      double e = 0, r2 = 0;
      for (int r = 0; r < geo.d_k; ++r) {
        for (int j = 0; j < geo.d_v; ++j) {
          const double d = w[r * geo.d_v + j] - src[perm[r] * geo.d_v + j];
          e += d * d;
          r2 += double{src[perm[r] * geo.d_v + j]} * src[perm[r] * geo.d_v + j];
        }
      }
      EXPECT_LT(std::sqrt(e / r2), 0.25) << layer << " " << h;
    }
  }
  // Bytes past the last head of a slot (stride padding) stay zero.
  const int64_t end = layout.head_offsets().back() +
                      layout.step_head(geo.layers - 1, geo.h_v - 1).head_bytes;
  for (int64_t i = end; i < layout.slot_bytes(); ++i) ASSERT_EQ(pool.view.slot(0)[i], 0) << i;
}

TEST_P(StepCpuTest, PackUnpackRoundTripsAndIsDeterministic) {
  const auto [geo, f] = GetParam();
  const StateLayout layout = MixedLayout(geo, f, 3);
  auto b1 = CpuBackend::Create({1});
  auto b2 = CpuBackend::Create({2});
  TestPool p1 = MakeTestPool(*b1, layout, 3), p2 = MakeTestPool(*b2, layout, 3);
  std::vector<float> states(3 * geo.HeadsPerSlot() * geo.d_k * geo.d_v);
  std::mt19937 rng(4);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (float& x : states) x = n(rng);
  const int32_t slots[3] = {2, 0, 1};
  ASSERT_TRUE(b1->PackStates(*p1.model, p1.view, slots, 3, states.data()).ok());
  ASSERT_TRUE(b2->PackStates(*p2.model, p2.view, slots, 3, states.data()).ok());
  EXPECT_EQ(p1.Bytes(), p2.Bytes());
  std::vector<float> back(states.size());
  ASSERT_TRUE(b1->UnpackStates(*p1.model, p1.view, slots, 3, back.data()).ok());
  double e = 0, r = 0;
  for (size_t i = 0; i < states.size(); ++i) {
    e += (double{back[i]} - states[i]) * (back[i] - states[i]);
    r += double{states[i]} * states[i];
  }
  const double rrmse = std::sqrt(e / r);
  EXPECT_GT(rrmse, 0.0);
  EXPECT_LT(rrmse, f == StateFormat::kStepQuant6 ? 0.08 : 0.15);  // widths {4,6,8} / {3,4,6,8} mixed
  // Packing the unpacked states again is byte-stable after one more round.
  ASSERT_TRUE(b2->PackStates(*p2.model, p2.view, slots, 3, back.data()).ok());
  std::vector<float> back2(states.size());
  ASSERT_TRUE(b2->UnpackStates(*p2.model, p2.view, slots, 3, back2.data()).ok());
  double e2 = 0;
  for (size_t i = 0; i < states.size(); ++i) e2 += (double{back2[i]} - back[i]) * (back2[i] - back[i]);
  EXPECT_LT(std::sqrt(e2 / r), rrmse);
  // Zeroed slots unpack to exact zeros.
  ASSERT_TRUE(b1->ZeroSlots(p1.view, slots, 1).ok());
  ASSERT_TRUE(b1->UnpackStates(*p1.model, p1.view, slots, 1, back.data()).ok());
  for (int64_t i = 0; i < geo.HeadsPerSlot() * geo.d_k * geo.d_v; ++i) ASSERT_EQ(back[i], 0.0f);
}

TEST_P(StepCpuTest, DecodeIsByteDeterministicAndPrefillOfOneTokenMatches) {
  const auto [geo, f] = GetParam();
  const StateLayout layout = MixedLayout(geo, f, 5);
  auto b1 = CpuBackend::Create({1});
  auto b2 = CpuBackend::Create({2});
  TestPool p1 = MakeTestPool(*b1, layout, 4), p2 = MakeTestPool(*b2, layout, 4), p3 = MakeTestPool(*b1, layout, 4);
  const int steps = 6, batch = 3;
  TokenBatch in = RandomTokenBatch(geo, steps * batch, 6);
  const int32_t slots[3] = {3, 0, 2};
  std::vector<float> o1(batch * geo.h_v * geo.d_v), o2(o1.size()), o3(o1.size());
  for (int t = 0; t < steps; ++t) {
    for (int layer = 0; layer < geo.layers; ++layer) {
      ASSERT_TRUE(b1->DecodeUpdate(*p1.model, p1.view, layer, DecodeInputsFor(in, geo, slots, batch, o1.data(), t * batch)).ok());
      ASSERT_TRUE(b2->DecodeUpdate(*p2.model, p2.view, layer, DecodeInputsFor(in, geo, slots, batch, o2.data(), t * batch)).ok());
      EXPECT_EQ(o1, o2);
      // Prefill of one token per slot = one decode step.
      for (int b = 0; b < batch; ++b) {
        const TokenBatch& x = in;
        const int row = t * batch + b;
        PrefillInputs pin{1, 1, &slots[b], DType::kFp32,
                          x.q.data() + int64_t{row} * geo.h_qk * geo.d_k,
                          x.k.data() + int64_t{row} * geo.h_qk * geo.d_k,
                          x.v.data() + int64_t{row} * geo.h_v * geo.d_v,
                          x.g.data() + int64_t{row} * geo.h_v * geo.GateWidth(),
                          x.beta.data() + int64_t{row} * geo.h_v,
                          o3.data() + int64_t{b} * geo.h_v * geo.d_v};
        ASSERT_TRUE(b1->Prefill(*p3.model, p3.view, layer, pin).ok());
      }
      EXPECT_EQ(o1, o3);
    }
  }
  EXPECT_EQ(p1.Bytes(), p2.Bytes());
  EXPECT_EQ(p1.Bytes(), p3.Bytes());
}

TEST_P(StepCpuTest, SlotsOutsideTheBatchAndSkippedEntriesAreUntouched) {
  const auto [geo, f] = GetParam();
  const StateLayout layout = MixedLayout(geo, f, 7);
  auto backend = CpuBackend::Create({2});
  TestPool pool = MakeTestPool(*backend, layout, 5);
  const int32_t all[5] = {0, 1, 2, 3, 4};
  TokenBatch warm = RandomTokenBatch(geo, 5, 1);
  std::vector<float> o(5 * geo.h_v * geo.d_v);
  for (int layer = 0; layer < geo.layers; ++layer) {
    ASSERT_TRUE(backend->DecodeUpdate(*pool.model, pool.view, layer, DecodeInputsFor(warm, geo, all, 5, o.data())).ok());
  }
  const std::vector<uint8_t> before = pool.Bytes();
  const int32_t batch[3] = {3, -1, 1};
  TokenBatch in = RandomTokenBatch(geo, 3, 2);
  std::fill(o.begin(), o.end(), 7.0f);
  ASSERT_TRUE(backend->DecodeUpdate(*pool.model, pool.view, 1, DecodeInputsFor(in, geo, batch, 3, o.data())).ok());
  const std::vector<uint8_t> after = pool.Bytes();
  const int64_t sb = pool.view.slot_bytes();
  for (int s : {0, 2, 4}) {
    EXPECT_TRUE(std::equal(after.begin() + s * sb, after.begin() + (s + 1) * sb, before.begin() + s * sb)) << s;
  }
  // In the updated slots only layer 1's heads changed.
  const int64_t layer1 = layout.head_offset(1, 0);
  for (int s : {1, 3}) {
    EXPECT_TRUE(std::equal(after.begin() + s * sb, after.begin() + s * sb + layer1, before.begin() + s * sb)) << s;
    EXPECT_FALSE(std::equal(after.begin() + s * sb, after.begin() + (s + 1) * sb, before.begin() + s * sb)) << s;
  }
  for (int j = 0; j < geo.h_v * geo.d_v; ++j) EXPECT_EQ(o[geo.h_v * geo.d_v + j], 0.0f);
  EXPECT_NE(o[0], 7.0f);
}

TEST_P(StepCpuTest, DecodeTracksTheFp32Recurrence) {
  const auto [geo, f] = GetParam();
  const StateLayout layout = MixedLayout(geo, f, 9);
  const StateLayout fp32 = *StateLayout::Identity(geo, {StateFormat::kFp32, 0});
  auto backend = CpuBackend::Create({2});
  TestPool a = MakeTestPool(*backend, layout, 1), b = MakeTestPool(*backend, fp32, 1);
  const int steps = 40;
  TokenBatch in = RandomTokenBatch(geo, steps, 10);
  const int32_t slot = 0;
  std::vector<float> oa(geo.h_v * geo.d_v), ob(oa.size());
  double e = 0, r = 0;
  for (int t = 0; t < steps; ++t) {
    ASSERT_TRUE(backend->DecodeUpdate(*a.model, a.view, 0, DecodeInputsFor(in, geo, &slot, 1, oa.data(), t)).ok());
    ASSERT_TRUE(backend->DecodeUpdate(*b.model, b.view, 0, DecodeInputsFor(in, geo, &slot, 1, ob.data(), t)).ok());
    for (size_t i = 0; i < oa.size(); ++i) {
      e += (double{oa[i]} - ob[i]) * (oa[i] - ob[i]);
      r += double{ob[i]} * ob[i];
    }
  }
  const double rrmse = std::sqrt(e / r);
  EXPECT_GT(rrmse, 0.0);
  EXPECT_LT(rrmse, f == StateFormat::kStepQuant6 ? 0.15 : 0.3) << FormatName(f);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, StepCpuTest,
    ::testing::Combine(::testing::Values(kGdnSmall, kKdaSmall),
                       ::testing::Values(StateFormat::kStepQuant6, StateFormat::kStepQuant4)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).arch == Arch::kGdn ? "gdn" : "kda") + "_" +
             (std::get<1>(info.param) == StateFormat::kStepQuant6 ? "sq6" : "sq4");
    });

TEST(StepCpuErrorsTest, BadInputIsRejectedAndNothingIsWritten) {
  const ModelGeometry geo = kKdaSmall;
  const StateLayout layout = MixedLayout(geo, StateFormat::kStepQuant4, 11);
  auto backend = CpuBackend::Create({2});
  TestPool pool = MakeTestPool(*backend, layout, 3);
  const int32_t slots[2] = {0, 2};
  TokenBatch good = RandomTokenBatch(geo, 2, 1);
  std::vector<float> o(2 * geo.h_v * geo.d_v);
  ASSERT_TRUE(backend->DecodeUpdate(*pool.model, pool.view, 0, DecodeInputsFor(good, geo, slots, 2, o.data())).ok());
  const std::vector<uint8_t> before = pool.Bytes();
  TokenBatch nan_v = good;
  nan_v.v.back() = std::nanf("");
  absl::Status s = backend->DecodeUpdate(*pool.model, pool.view, 0, DecodeInputsFor(nan_v, geo, slots, 2, o.data()));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("v["), absl::string_view::npos) << s;
  // A pool sized for the nominal head instead of the layout's stride.
  PoolView wrong = pool.view;
  wrong.head_bytes = MakeHeadLayout({StateFormat::kStepQuant4, 0}, geo.d_k, geo.d_v).head_bytes;
  if (wrong.head_bytes != pool.view.head_bytes) {
    s = backend->DecodeUpdate(*pool.model, wrong, 0, DecodeInputsFor(good, geo, slots, 2, o.data()));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("pool"), absl::string_view::npos) << s;
  }
  const int32_t dup[2] = {2, 2};
  s = backend->DecodeUpdate(*pool.model, pool.view, 0, DecodeInputsFor(good, geo, dup, 2, o.data()));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> states(geo.HeadsPerSlot() * geo.d_k * geo.d_v, 0.0f);
  states[5] = INFINITY;
  s = backend->PackStates(*pool.model, pool.view, slots, 1, states.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Bytes(), before);
}

// The whole flow on synthetic trajectories: calibrate, then decode.
TEST(StepCpuCalibratedTest, CalibratedLayoutRunsOnTheBackend) {
  SyntheticOptions so;
  so.geometry = kKdaSmall;
  so.tokens = 128;
  absl::StatusOr<Trajectory> t = MakeSyntheticTrajectory(so);
  ASSERT_TRUE(t.ok());
  StepQuantOptions opts;
  opts.pivot_fraction = 0.02;
  absl::StatusOr<StepQuantCalibration> cal = CalibrateStepQuant({*t}, {StateFormat::kStepQuant6, 0}, opts);
  ASSERT_TRUE(cal.ok()) << cal.status();
  auto backend = CpuBackend::Create({2});
  TestPool pool = MakeTestPool(*backend, cal->layout, 1);
  TokenBatch in = RandomTokenBatch(kKdaSmall, 1, 3);
  const int32_t slot = 0;
  std::vector<float> o(kKdaSmall.h_v * kKdaSmall.d_v);
  EXPECT_TRUE(backend->DecodeUpdate(*pool.model, pool.view, 1, DecodeInputsFor(in, kKdaSmall, &slot, 1, o.data())).ok());
}

}  // namespace
}  // namespace statecache
