// The CUDA backend with stepquant-6 / stepquant-4 layouts against the CPU
// backend (issue 9): packed bytes after decode steps and prefill, outputs to
// 1e-5 relative, slots outside the batch untouched, pack / unpack bytes and
// values. Layouts are hand-built calibrated-looking maps (random key
// permutations, FP16 pivots, mixed widths, random row impact) via
// StateLayout::CreateStepQuant, at 128 x 128 (64 KiB of shared memory per
// head, two 64-row reduction chunks) and small shapes.
//
// Decode steps at 128 x 128 default to the tiled kernel
// (StepTileDecodeKernel), whose bytes follow the tile reference, not the
// CPU's order: StepTileDecodeTest checks it against that reference
// (StepDecodeHead with the decay folded in -> decode_math.h's
// ReferenceHeadStep -> StepEncodeHead with StepSumOrder::kTile) with 0
// differing bytes, outputs to 1e-5 relative, -1 entries and untouched slots,
// and every code width 2..8. The CPU-order tests (StepCudaTest decode) pin the
// fast kernel's h2 build (StepFastDecodeKernel: persistent CTAs, bulk-copy
// prefetch); StepFastDecodeBatchTest pins each of its builds (c2, c3, h2) to
// the one-CTA-per-head kernel (LaunchOptions::stepquant_fast = false) bit for bit, with
// bf16 inputs, and with more items than the persistent grid (stage reuse,
// barrier parities), -1 entries and untouched slots.
// StepTileReferenceTest runs without a GPU (the reference's CPU-side checks).
//
// Exactness: the kernels are meant to be byte-identical (same codec element
// functions, the CPU build's HeadStep arithmetic, glibc's expf via
// glibc_expf.h). The decode / prefill tests still count and print the
// differing bytes and allow at most kMaxDifferingByteFraction of the pool for
// the documented residual cases (internal/stepquant_params.h: a differently
// contracted CPU build, a host glibc on its non-FMA expf). Pack / unpack
// involve no exp and must match exactly.
// Skips (GTEST_SKIP) without a usable GPU; tagged gpu_only. On the device:
//   kernels/cuda/stage_stepquant_device.sh   (here), then
//   LD_LIBRARY_PATH=.device/stepquant_lib .device/stepquant_cuda_test
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/decode_math.h"
#include "kernels/cuda/internal/stepquant_params.h"
#include "kernels/formats/stepquant_codec.h"
#include "kernels/formats/format.h"
#include "kernels/formats/numeric.h"
#include "kernels/layout/state_layout.h"
#include "kernels/cuda/testing/gpu_backend.h"
#include "kernels/testing/test_pool.h"
#include "kernels/testing/token_batch.h"

namespace statecache {
namespace {

// kernels/testing's STEPQuant layout with this test's pivot heads (head 1 of
// every layer).
StateLayout MixedLayout(const ModelGeometry& geo, StateFormat f, uint32_t seed) {
  return MixedStepQuantLayout(geo, f, seed, /*pivot_head_per_layer=*/true,
                              StepQuantCandidateBits(f));
}

constexpr double kMaxDifferingByteFraction = 1e-3;
constexpr double kOutputRelTol = 1e-5;

// A device copy of a host vector.
template <typename T>
std::unique_ptr<BackendBuffer> ToGpu(const std::vector<T>& host) {
  std::unique_ptr<BackendBuffer> buf =
      TestGpu()->Allocate(static_cast<int64_t>(std::max<size_t>(1, host.size()) * sizeof(T))).value();
  if (!host.empty()) {
    EXPECT_TRUE(TestGpu()->CopyIn(buf->data(), host.data(), host.size() * sizeof(T)).ok());
  }
  return buf;
}
template <typename T>
std::vector<T> FromGpu(const BackendBuffer& buf, size_t n) {
  std::vector<T> out(n);
  EXPECT_TRUE(TestGpu()->CopyOut(out.data(), buf.data(), n * sizeof(T)).ok());
  return out;
}

// The batch's arrays on the device.
struct GpuBatch {
  std::unique_ptr<BackendBuffer> q, k, v, g, beta;
  explicit GpuBatch(const TokenBatch& b)
      : q(ToGpu(b.q)), k(ToGpu(b.k)), v(ToGpu(b.v)), g(ToGpu(b.g)), beta(ToGpu(b.beta)) {}
};

std::vector<float> RandomStates(const ModelGeometry& geo, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> s(int64_t{n} * geo.HeadsPerSlot() * geo.d_k * geo.d_v);
  for (float& x : s) x = 0.5f * d(rng);
  return s;
}

// DecodeInputs over device buffers: slots int32; q, k, v in dtype; g, beta
// and o fp32.
DecodeInputs GpuDecodeInputs(int batch, const BackendBuffer& slots, DType dtype,
                             const BackendBuffer& q, const BackendBuffer& k,
                             const BackendBuffer& v, const BackendBuffer& g,
                             const BackendBuffer& beta, const BackendBuffer& o) {
  return DecodeInputs{batch,
                      reinterpret_cast<const int32_t*>(slots.data()),
                      dtype,
                      q.data(),
                      k.data(),
                      v.data(),
                      reinterpret_cast<const float*>(g.data()),
                      reinterpret_cast<const float*>(beta.data()),
                      reinterpret_cast<float*>(o.data())};
}

// Packs RandomStates(seed) into every slot of `pool` with `cpu`; returns the
// pool's bytes (the starting image the tests copy into GPU pools).
std::vector<uint8_t> PackRandomStates(Backend& cpu, const TestPool& pool, const ModelGeometry& geo,
                                      int num_slots, uint32_t seed) {
  std::vector<int32_t> all(num_slots);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<float> states = RandomStates(geo, num_slots, seed);
  const absl::Status s =
      cpu.PackStates(*pool.model, pool.view, all.data(), num_slots, states.data());
  EXPECT_TRUE(s.ok()) << s;
  return pool.Bytes();
}

int64_t DifferingBytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// max_i |gpu_i - cpu_i| / max(max_i |cpu_i|, 1e-30).
double MaxRelError(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  double err = 0, mag = 1e-30;
  for (size_t i = 0; i < cpu.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(cpu[i])));
  }
  return err / mag;
}

// Bytes of slot s of a pool image.
std::vector<uint8_t> SlotBytes(const std::vector<uint8_t>& pool, int64_t slot_bytes, int s) {
  return std::vector<uint8_t>(pool.begin() + s * slot_bytes, pool.begin() + (s + 1) * slot_bytes);
}

// Expects every slot with used[s] false to hold its starting bytes; returns
// how many there are.
int ExpectUnusedSlotsUntouched(const std::vector<uint8_t>& pool, const std::vector<uint8_t>& start,
                               int64_t slot_bytes, const std::vector<bool>& used) {
  int untouched = 0;
  for (int s = 0; s < static_cast<int>(used.size()); ++s) {
    if (used[s]) continue;
    ++untouched;
    EXPECT_EQ(SlotBytes(pool, slot_bytes, s), SlotBytes(start, slot_bytes, s)) << "slot " << s;
  }
  return untouched;
}

using Param = std::tuple<ModelGeometry, StateFormat>;

// A CUDA backend whose STEPQuant decode steps launch with these switches
// (LaunchOptions; one backend per option set, kept for the process). Pools
// and models made on TestGpu() work with it: both drive device 0 in one
// context.
Backend& GpuWith(bool stepquant_fast, StepQuantVariant variant) {
  static std::map<std::pair<bool, StepQuantVariant>, std::unique_ptr<Backend>> backends;
  std::unique_ptr<Backend>& b = backends[{stepquant_fast, variant}];
  if (b == nullptr) {
    LaunchOptions o;
    o.stepquant_fast = stepquant_fast;
    o.stepquant_variant = variant;
    b = CreateCudaBackend(o).value();
  }
  return *b;
}

// The CPU-order decode kernel (the default tiled kernel has its own test).
Backend& H2Gpu() { return GpuWith(true, StepQuantVariant::kH2); }

class StepCudaTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    STATECACHE_SKIP_WITHOUT_GPU();
    std::tie(geo_, format_) = GetParam();
    layout_ = std::make_unique<StateLayout>(MixedLayout(geo_, format_, 7));
    cpu_ = CpuBackend::Create({2});
    cpu_pool_ = MakeTestPool(*cpu_, *layout_, kSlots);
    gpu_pool_ = MakeTestPool(*TestGpu(), *layout_, kSlots);
    ASSERT_NE(gpu_pool_.model, nullptr);
    // Same starting bytes in both pools: every slot packed on the CPU.
    const std::vector<float> states = RandomStates(geo_, kSlots, 11);
    const int32_t all[kSlots] = {0, 1, 2, 3};
    ASSERT_TRUE(
        cpu_->PackStates(*cpu_pool_.model, cpu_pool_.view, all, kSlots, states.data()).ok());
    start_ = cpu_pool_.Bytes();
    gpu_pool_.SetBytes(start_);
  }

  static constexpr int kSlots = 4;
  ModelGeometry geo_;
  StateFormat format_;
  std::unique_ptr<StateLayout> layout_;
  std::unique_ptr<CpuBackend> cpu_;
  TestPool cpu_pool_, gpu_pool_;
  std::vector<uint8_t> start_;
};

TEST_P(StepCudaTest, DecodeStepsMatchCpuBytes) {
  constexpr int kSteps = 8;
  const std::vector<int32_t> slots = {2, -1, 0};  // slots 1 and 3 stay out
  const int batch = static_cast<int>(slots.size());
  auto gpu_slots = ToGpu(slots);
  const int64_t o_count = int64_t{batch} * geo_.h_v * geo_.d_v;
  auto gpu_o = TestGpu()->Allocate(o_count * 4).value();
  for (int step = 0; step < kSteps; ++step) {
    const TokenBatch b = RandomTokenBatch(geo_, batch, 100 + step);
    GpuBatch gb(b);
    std::vector<float> cpu_o(o_count, -1.0f);
    ASSERT_TRUE(cpu_->DecodeUpdate(*cpu_pool_.model, cpu_pool_.view, 0,
                                   DecodeInputs{batch, slots.data(), DType::kFp32, b.q.data(),
                                                b.k.data(), b.v.data(), b.g.data(), b.beta.data(),
                                                cpu_o.data()})
                    .ok());
    const int layer = step % geo_.layers;
    if (layer != 0) {
      ASSERT_TRUE(cpu_->DecodeUpdate(*cpu_pool_.model, cpu_pool_.view, layer,
                                     DecodeInputs{batch, slots.data(), DType::kFp32, b.q.data(),
                                                  b.k.data(), b.v.data(), b.g.data(),
                                                  b.beta.data(), cpu_o.data()})
                      .ok());
    }
    absl::Status st = H2Gpu().DecodeUpdate(
        *gpu_pool_.model, gpu_pool_.view, 0,
        GpuDecodeInputs(batch, *gpu_slots, DType::kFp32, *gb.q, *gb.k, *gb.v, *gb.g, *gb.beta,
                        *gpu_o));
    ASSERT_TRUE(st.ok()) << st;
    if (layer != 0) {
      st = H2Gpu().DecodeUpdate(
          *gpu_pool_.model, gpu_pool_.view, layer,
          GpuDecodeInputs(batch, *gpu_slots, DType::kFp32, *gb.q, *gb.k, *gb.v, *gb.g,
                          *gb.beta, *gpu_o));
      ASSERT_TRUE(st.ok()) << st;
    }
    const std::vector<float> o = FromGpu<float>(*gpu_o, o_count);
    EXPECT_LE(MaxRelError(o, cpu_o), kOutputRelTol) << "step " << step;
    // The skipped entry's output is zero.
    for (int j = 0; j < geo_.h_v * geo_.d_v; ++j) {
      ASSERT_EQ(o[int64_t{geo_.h_v} * geo_.d_v + j], 0.0f);
    }
  }
  const std::vector<uint8_t> cpu_bytes = cpu_pool_.Bytes();
  const std::vector<uint8_t> gpu_bytes = gpu_pool_.Bytes();
  const int64_t diff = DifferingBytes(gpu_bytes, cpu_bytes);
  std::printf("decode %s: %lld of %lld pool bytes differ from the CPU backend\n",
              FormatSpecName({format_, 0}).c_str(), static_cast<long long>(diff),
              static_cast<long long>(gpu_bytes.size()));
  EXPECT_LE(diff, kMaxDifferingByteFraction * gpu_bytes.size());
  EXPECT_NE(gpu_bytes, start_);  // the steps did something
  const int64_t sb = gpu_pool_.view.slot_bytes();
  for (int s : {1, 3}) {
    EXPECT_EQ(SlotBytes(gpu_bytes, sb, s), SlotBytes(start_, sb, s)) << "slot " << s;
  }
}

TEST_P(StepCudaTest, PrefillMatchesCpuBytes) {
  constexpr int kTokens = 5;
  const std::vector<int32_t> slots = {3, 1};
  const int batch = static_cast<int>(slots.size());
  const TokenBatch b = RandomTokenBatch(geo_, batch * kTokens, 5);
  GpuBatch gb(b);
  auto gpu_slots = ToGpu(slots);
  const int64_t o_count = int64_t{batch} * kTokens * geo_.h_v * geo_.d_v;
  std::vector<float> cpu_o(o_count);
  auto gpu_o = TestGpu()->Allocate(o_count * 4).value();
  const int layer = geo_.layers - 1;
  ASSERT_TRUE(cpu_->Prefill(*cpu_pool_.model, cpu_pool_.view, layer,
                            PrefillInputs{batch, kTokens, slots.data(), DType::kFp32, b.q.data(),
                                          b.k.data(), b.v.data(), b.g.data(), b.beta.data(),
                                          cpu_o.data()})
                  .ok());
  const absl::Status st = TestGpu()->Prefill(
      *gpu_pool_.model, gpu_pool_.view, layer,
      PrefillInputs{batch, kTokens, static_cast<const int32_t*>(static_cast<void*>(gpu_slots->data())),
                    DType::kFp32, gb.q->data(), gb.k->data(), gb.v->data(),
                    reinterpret_cast<const float*>(gb.g->data()),
                    reinterpret_cast<const float*>(gb.beta->data()),
                    reinterpret_cast<float*>(gpu_o->data())});
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_LE(MaxRelError(FromGpu<float>(*gpu_o, o_count), cpu_o), kOutputRelTol);
  const std::vector<uint8_t> gpu_bytes = gpu_pool_.Bytes();
  const int64_t diff = DifferingBytes(gpu_bytes, cpu_pool_.Bytes());
  std::printf("prefill %s: %lld of %lld pool bytes differ from the CPU backend\n",
              FormatSpecName({format_, 0}).c_str(), static_cast<long long>(diff),
              static_cast<long long>(gpu_bytes.size()));
  EXPECT_LE(diff, kMaxDifferingByteFraction * gpu_bytes.size());
  EXPECT_NE(gpu_bytes, start_);
  const int64_t sb = gpu_pool_.view.slot_bytes();
  for (int s : {0, 2}) {
    EXPECT_EQ(SlotBytes(gpu_bytes, sb, s), SlotBytes(start_, sb, s)) << "slot " << s;
  }
}

TEST_P(StepCudaTest, PackMatchesCpuBytesExactly) {
  const std::vector<int32_t> slots = {3, -1, 0};
  const int n = static_cast<int>(slots.size());
  const std::vector<float> states = RandomStates(geo_, n, 23);
  ASSERT_TRUE(cpu_->PackStates(*cpu_pool_.model, cpu_pool_.view, slots.data(), n, states.data())
                  .ok());
  auto gpu_slots = ToGpu(slots);
  auto gpu_states = ToGpu(states);
  const absl::Status st = TestGpu()->PackStates(
      *gpu_pool_.model, gpu_pool_.view,
      static_cast<const int32_t*>(static_cast<void*>(gpu_slots->data())), n,
      reinterpret_cast<const float*>(gpu_states->data()));
  ASSERT_TRUE(st.ok()) << st;
  const std::vector<uint8_t> gpu_bytes = gpu_pool_.Bytes();
  EXPECT_EQ(DifferingBytes(gpu_bytes, cpu_pool_.Bytes()), 0);
  const int64_t sb = gpu_pool_.view.slot_bytes();
  EXPECT_NE(SlotBytes(gpu_bytes, sb, 3), SlotBytes(start_, sb, 3));
  for (int s : {1, 2}) {
    EXPECT_EQ(SlotBytes(gpu_bytes, sb, s), SlotBytes(start_, sb, s)) << "slot " << s;
  }
}

TEST_P(StepCudaTest, UnpackMatchesCpuExactly) {
  const std::vector<int32_t> slots = {2, -1, 1};
  const int n = static_cast<int>(slots.size());
  const int64_t count = int64_t{n} * geo_.HeadsPerSlot() * geo_.d_k * geo_.d_v;
  std::vector<float> cpu_states(count);
  ASSERT_TRUE(
      cpu_->UnpackStates(*cpu_pool_.model, cpu_pool_.view, slots.data(), n, cpu_states.data())
          .ok());
  auto gpu_slots = ToGpu(slots);
  auto gpu_states = ToGpu(std::vector<float>(count, 7.0f));
  const absl::Status st = TestGpu()->UnpackStates(
      *gpu_pool_.model, gpu_pool_.view,
      static_cast<const int32_t*>(static_cast<void*>(gpu_slots->data())), n,
      reinterpret_cast<float*>(gpu_states->data()));
  ASSERT_TRUE(st.ok()) << st;
  const std::vector<float> gpu = FromGpu<float>(*gpu_states, count);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < count; ++i) {
    mismatches += std::memcmp(&gpu[i], &cpu_states[i], 4) != 0;
  }
  EXPECT_EQ(mismatches, 0);
  const int64_t per_slot = geo_.HeadsPerSlot() * geo_.d_k * geo_.d_v;
  for (int64_t i = per_slot; i < 2 * per_slot; ++i) ASSERT_EQ(gpu[i], 0.0f) << i;
  EXPECT_EQ(gpu_pool_.Bytes(), start_);  // unpack writes nothing to the pool
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const ModelGeometry& g = std::get<0>(info.param);
  return absl::StrCat(g.arch == Arch::kGdn ? "Gdn" : "Kda", g.d_k, "x", g.d_v,
                      std::get<1>(info.param) == StateFormat::kStepQuant6 ? "Step6" : "Step4");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, StepCudaTest,
    ::testing::Combine(::testing::Values(ModelGeometry{Arch::kGdn, 2, 1, 4, 128, 128},
                                         ModelGeometry{Arch::kKda, 2, 2, 2, 128, 128},
                                         ModelGeometry{Arch::kKda, 2, 3, 3, 64, 32}),
                       ::testing::Values(StateFormat::kStepQuant6, StateFormat::kStepQuant4)),
    ParamName);

// Parameters of a 128 x 128 decode step whose pointers all point at `buf`
// (16-byte aligned): eligible for both fast kernels.
cuda_internal::StepKernelParams AlignedDecodeParams(uint8_t* buf) {
  cuda_internal::StepKernelParams p;
  p.d_k = p.d_v = 128;
  p.h_qk = 2;
  p.h_v = 4;
  p.tokens = 1;
  p.heads = reinterpret_cast<const StepHeadLayout*>(buf);
  p.head_offsets = reinterpret_cast<const int64_t*>(buf);
  p.pool_base = buf;
  p.slot_stride = 4096;
  p.q = p.k = p.v = buf;
  return p;
}

TEST(StepFastDecodeTest, EligibilityFollowsShapeTokensAndAlignment) {
  alignas(16) static uint8_t buf[64];
  const cuda_internal::StepKernelParams p = AlignedDecodeParams(buf);
  EXPECT_TRUE(cuda_internal::StepFastDecodeEligible(p));
  cuda_internal::StepKernelParams t = p;
  t.tokens = 2;
  EXPECT_FALSE(cuda_internal::StepFastDecodeEligible(t));
  t = p;
  t.d_k = 64;
  EXPECT_FALSE(cuda_internal::StepFastDecodeEligible(t));
  t = p;
  t.v = buf + 4;
  EXPECT_FALSE(cuda_internal::StepFastDecodeEligible(t));
  t = p;
  t.slot_stride = 4104;
  EXPECT_FALSE(cuda_internal::StepFastDecodeEligible(t));
  t = p;
  t.kda = true;
  t.g = reinterpret_cast<const float*>(buf + 8);
  EXPECT_FALSE(cuda_internal::StepFastDecodeEligible(t));
}

// The fast-kernel build of a test parameter ("h2", "c2", "c3").
StepQuantVariant VariantNamed(const std::string& v) {
  return v == "c2" ? StepQuantVariant::kC2 : v == "c3" ? StepQuantVariant::kC3 : StepQuantVariant::kH2;
}

// Many items (more than the persistent grid), shuffled slots with -1 entries,
// bf16 or fp32 inputs: every fast-kernel variant vs CPU (bytes, outputs) and
// vs the one-CTA-per-head kernel (bit for bit).
using FastParam = std::tuple<Arch, StateFormat, DType, std::string>;

class StepFastDecodeBatchTest : public ::testing::TestWithParam<FastParam> {};

TEST_P(StepFastDecodeBatchTest, MatchesCpuAndSlowKernel) {
  STATECACHE_SKIP_WITHOUT_GPU();
  const auto [arch, format, dtype, variant] = GetParam();
  const ModelGeometry geo{arch, 2, arch == Arch::kGdn ? 2 : 4, 4, 128, 128};
  const StateLayout layout = MixedLayout(geo, format, 19);
  constexpr int kSlots = 300;
  constexpr int kBatch = 280;  // 1,120 items > 2 CTAs x 132 SMs
  auto cpu = CpuBackend::Create({2});
  TestPool cpu_pool = MakeTestPool(*cpu, layout, kSlots);
  TestPool fast_pool = MakeTestPool(*TestGpu(), layout, kSlots);
  TestPool slow_pool = MakeTestPool(*TestGpu(), layout, kSlots);
  ASSERT_NE(fast_pool.model, nullptr);
  const std::vector<uint8_t> start = PackRandomStates(*cpu, cpu_pool, geo, kSlots, 29);
  fast_pool.SetBytes(start);
  slow_pool.SetBytes(start);
  // Slots: a shuffled subset, every 13th entry -1; the rest stay untouched.
  const auto [slots, used] = MakeShuffledBatch(kSlots, kBatch, 31, 5, 13);
  auto gpu_slots = ToGpu(slots);
  const int64_t o_count = int64_t{kBatch} * geo.h_v * geo.d_v;
  auto gpu_o = TestGpu()->Allocate(o_count * 4).value();
  for (int step = 0; step < 3; ++step) {
    const int layer = step % geo.layers;
    TokenBatch b = RandomTokenBatch(geo, kBatch, 200 + step);
    std::vector<uint16_t> q16, k16, v16;
    if (dtype == DType::kBf16) {
      // Round to bf16 so both backends read the same values.
      for (auto* vec : {&b.q, &b.k, &b.v}) {
        std::vector<uint16_t>& out = vec == &b.q ? q16 : vec == &b.k ? k16 : v16;
        for (float& x : *vec) {
          out.push_back(FloatToBf16Bits(x));
          x = Bf16BitsToFloat(out.back());
        }
      }
    }
    const bool bf = dtype == DType::kBf16;
    std::vector<float> cpu_o(o_count, -1.0f);
    const void* hq = bf ? static_cast<const void*>(q16.data()) : b.q.data();
    const void* hk = bf ? static_cast<const void*>(k16.data()) : b.k.data();
    const void* hv = bf ? static_cast<const void*>(v16.data()) : b.v.data();
    ASSERT_TRUE(cpu->DecodeUpdate(*cpu_pool.model, cpu_pool.view, layer,
                                  DecodeInputs{kBatch, slots.data(), dtype, hq, hk, hv, b.g.data(),
                                               b.beta.data(), cpu_o.data()})
                    .ok());
    auto dq = bf ? ToGpu(q16) : ToGpu(b.q);
    auto dk = bf ? ToGpu(k16) : ToGpu(b.k);
    auto dv = bf ? ToGpu(v16) : ToGpu(b.v);
    auto dg = ToGpu(b.g);
    auto dbeta = ToGpu(b.beta);
    std::vector<float> outs[2];
    for (int fast = 1; fast >= 0; --fast) {
      TestPool& pool = fast == 1 ? fast_pool : slow_pool;
      const absl::Status st = GpuWith(fast == 1, VariantNamed(variant)).DecodeUpdate(
          *pool.model, pool.view, layer,
          GpuDecodeInputs(kBatch, *gpu_slots, dtype, *dq, *dk, *dv, *dg, *dbeta, *gpu_o));
      ASSERT_TRUE(st.ok()) << st;
      outs[fast] = FromGpu<float>(*gpu_o, o_count);
    }
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), o_count * 4), 0) << "step " << step;
    EXPECT_LE(MaxRelError(outs[1], cpu_o), kOutputRelTol) << "step " << step;
    for (int i = 5; i < kBatch; i += 13) {
      for (int j = 0; j < geo.h_v * geo.d_v; ++j) {
        ASSERT_EQ(outs[1][int64_t{i} * geo.h_v * geo.d_v + j], 0.0f) << "entry " << i;
      }
    }
  }
  const std::vector<uint8_t> fast_bytes = fast_pool.Bytes();
  const std::vector<uint8_t> cpu_bytes = cpu_pool.Bytes();
  EXPECT_EQ(DifferingBytes(fast_bytes, slow_pool.Bytes()), 0);
  const int64_t diff = DifferingBytes(fast_bytes, cpu_bytes);
  std::printf("fast decode %s %s %s variant %s: %lld of %lld pool bytes differ from the CPU\n",
              arch == Arch::kGdn ? "gdn" : "kda", FormatSpecName({format, 0}).c_str(),
              dtype == DType::kBf16 ? "bf16" : "fp32", variant.c_str(),
              static_cast<long long>(diff),
              static_cast<long long>(fast_bytes.size()));
  EXPECT_LE(diff, kMaxDifferingByteFraction * fast_bytes.size());
  EXPECT_GT(ExpectUnusedSlotsUntouched(fast_bytes, start, fast_pool.view.slot_bytes(), used), 20);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, StepFastDecodeBatchTest,
    ::testing::Combine(::testing::Values(Arch::kGdn, Arch::kKda),
                       ::testing::Values(StateFormat::kStepQuant6, StateFormat::kStepQuant4),
                       ::testing::Values(DType::kFp32, DType::kBf16),
                       ::testing::Values(std::string("h2"), std::string("c2"), std::string("c3"))),
    [](const ::testing::TestParamInfo<FastParam>& info) {
      const std::string& v = std::get<3>(info.param);
      return absl::StrCat(std::get<0>(info.param) == Arch::kGdn ? "Gdn" : "Kda",
                          std::get<1>(info.param) == StateFormat::kStepQuant6 ? "Step6" : "Step4",
                          std::get<2>(info.param) == DType::kBf16 ? "Bf16" : "Fp32",
                          v == "c2" ? "C2" : v == "c3" ? "C3" : "H2");
    });

// ---- The tiled decode kernel (StepTileDecodeKernel) ------------------------

// A KDA layout whose heads use every width: per head 2 pivot rows, then rows
// at 8, 7, ..., 2 bits (cycled), random permutations and row impact.
StateLayout AllWidthsLayout(const ModelGeometry& geo, StateFormat f, uint32_t seed) {
  return RandomStepQuantLayout(geo, f, seed, [&](int64_t h, std::mt19937&) {
    std::vector<int8_t> b(geo.d_k);
    for (int r = 0; r < geo.d_k; ++r) {
      b[r] = r < 2 ? 16 : static_cast<int8_t>(2 + (r + h) % 7);
    }
    std::sort(b.begin(), b.end(), std::greater<int8_t>());
    return b;
  });
}

// The tile reference of one decode step of `layer` on a host pool image:
// per (item, head) with a slot, StepDecodeHead with the token's decay folded
// in (DecayExp, stored row order), decode_math.h's ReferenceHeadStep with
// a = 1, StepEncodeHead with StepSumOrder::kTile; o of -1 entries is 0.
void TileReferenceStep(const StateLayout& layout, int layer, const std::vector<int32_t>& slots,
                       const TokenBatch& b, std::vector<uint8_t>& pool, std::vector<float>& o) {
  const ModelGeometry& geo = layout.geometry();
  const int64_t slot_bytes = layout.slot_bytes();
  const int d_k = geo.d_k, d_v = geo.d_v;
  std::vector<float> w(int64_t{d_k} * d_v), a(d_k), ones(d_k, 1.0f), k(d_k), qs(d_k), op(d_v);
  for (size_t bi = 0; bi < slots.size(); ++bi) {
    for (int h = 0; h < geo.h_v; ++h) {
      const int64_t item = static_cast<int64_t>(bi) * geo.h_v + h;
      float* o_item = o.data() + item * d_v;
      if (slots[bi] < 0) {
        std::fill(o_item, o_item + d_v, 0.0f);
        continue;
      }
      uint8_t* head = pool.data() + slots[bi] * slot_bytes + layout.head_offset(layer, h);
      const StepHeadLayout& l = layout.step_head(layer, h);
      const int32_t* perm = layout.key_perm(layer, h);
      const int64_t qk = (static_cast<int64_t>(bi) * geo.h_qk + geo.KeyHeadOf(h)) * d_k;
      for (int r = 0; r < d_k; ++r) {
        const int c = perm[r];
        a[r] = DecayExp(geo.arch == Arch::kKda ? b.g[item * d_k + c] : b.g[item]);
        k[r] = b.k[qk + c];
        qs[r] = geo.EffectiveScale() * b.q[qk + c];
      }
      StepDecodeHead(l, head, w.data(), a.data());
      ReferenceHeadStep(d_k, d_v, ones.data(), k.data(), qs.data(), b.beta[item],
                        b.v.data() + item * d_v, w.data(), op.data());
      std::copy(op.begin(), op.end(), o_item);
      StepEncodeHead(l, layout.row_impact(layer, h), w.data(), head, StepSumOrder::kTile);
    }
  }
}

// Prints where up to `limit` heads of two pool images differ (slot, layer,
// head, section, byte offset in the head, both bytes): a failing device run
// then says which part of the codec disagrees.
void PrintHeadDiffs(const StateLayout& layout, const std::vector<uint8_t>& got,
                    const std::vector<uint8_t>& want, int limit) {
  const ModelGeometry& geo = layout.geometry();
  const int64_t sb = layout.slot_bytes();
  int shown = 0;
  for (int64_t s = 0; s * sb < static_cast<int64_t>(got.size()) && shown < limit; ++s) {
    for (int layer = 0; layer < geo.layers && shown < limit; ++layer) {
      for (int h = 0; h < geo.h_v && shown < limit; ++h) {
        const StepHeadLayout& l = layout.step_head(layer, h);
        const int64_t base = s * sb + layout.head_offset(layer, h);
        int64_t first = -1, count = 0;
        for (int64_t i = 0; i < l.head_bytes; ++i) {
          if (got[base + i] != want[base + i]) {
            if (first < 0) first = i;
            ++count;
          }
        }
        if (first < 0) continue;
        const char* section = first < l.codes_offset        ? "pivots"
                              : first < l.row_scale_offset  ? "codes"
                              : first < l.col_scale_offset  ? "row scales"
                                                            : "column scales";
        std::printf("  slot %lld layer %d head %d: %lld bytes differ, first at %lld (%s) "
                    "gpu %02x ref %02x; pivots %d int rows %d\n",
                    static_cast<long long>(s), layer, h, static_cast<long long>(count),
                    static_cast<long long>(first), section, got[base + first], want[base + first],
                    l.pivot_rows, l.int_rows());
        ++shown;
      }
    }
  }
}

// (arch, format, dtype, all widths)
using TileParam = std::tuple<Arch, StateFormat, DType, bool>;

class StepTileDecodeTest : public ::testing::TestWithParam<TileParam> {};

TEST_P(StepTileDecodeTest, MatchesTileReference) {
  STATECACHE_SKIP_WITHOUT_GPU();
  const auto [arch, format, dtype, all_widths] = GetParam();
  const ModelGeometry geo{arch, 2, arch == Arch::kGdn ? 2 : 4, 4, 128, 128};
  const StateLayout layout =
      all_widths ? AllWidthsLayout(geo, format, 41) : MixedLayout(geo, format, 37);
  ASSERT_FALSE(layout.head_offsets().empty());
  constexpr int kSlots = 300;
  constexpr int kBatch = 280;  // 1,120 items > 2 CTAs x 132 SMs
  auto cpu = CpuBackend::Create({2});
  TestPool cpu_pool = MakeTestPool(*cpu, layout, kSlots);
  TestPool gpu_pool = MakeTestPool(*TestGpu(), layout, kSlots);
  ASSERT_NE(gpu_pool.model, nullptr);
  const std::vector<uint8_t> start = PackRandomStates(*cpu, cpu_pool, geo, kSlots, 43);
  gpu_pool.SetBytes(start);
  std::vector<uint8_t> ref = start;
  const auto [slots, used] = MakeShuffledBatch(kSlots, kBatch, 47, 3, 11);
  auto gpu_slots = ToGpu(slots);
  const int64_t o_count = int64_t{kBatch} * geo.h_v * geo.d_v;
  auto gpu_o = TestGpu()->Allocate(o_count * 4).value();
  Backend& tile_gpu = GpuWith(true, StepQuantVariant::kTile);
  for (int step = 0; step < 3; ++step) {
    const int layer = step % geo.layers;
    TokenBatch b = RandomTokenBatch(geo, kBatch, 300 + step);
    const bool bf = dtype == DType::kBf16;
    std::vector<uint16_t> q16, k16, v16;
    if (bf) {
      for (auto* vec : {&b.q, &b.k, &b.v}) {
        std::vector<uint16_t>& out = vec == &b.q ? q16 : vec == &b.k ? k16 : v16;
        for (float& x : *vec) {
          out.push_back(FloatToBf16Bits(x));
          x = Bf16BitsToFloat(out.back());
        }
      }
    }
    auto dq = bf ? ToGpu(q16) : ToGpu(b.q);
    auto dk = bf ? ToGpu(k16) : ToGpu(b.k);
    auto dv = bf ? ToGpu(v16) : ToGpu(b.v);
    auto dg = ToGpu(b.g);
    auto dbeta = ToGpu(b.beta);
    std::vector<float> ref_o(o_count, -1.0f);
    TileReferenceStep(layout, layer, slots, b, ref, ref_o);
    const absl::Status st = tile_gpu.DecodeUpdate(
        *gpu_pool.model, gpu_pool.view, layer,
        GpuDecodeInputs(kBatch, *gpu_slots, dtype, *dq, *dk, *dv, *dg, *dbeta, *gpu_o));
    ASSERT_TRUE(st.ok()) << st;
    const std::vector<float> o = FromGpu<float>(*gpu_o, o_count);
    int64_t o_diff = 0;
    for (int64_t i = 0; i < o_count; ++i) o_diff += std::memcmp(&o[i], &ref_o[i], 4) != 0;
    EXPECT_LE(MaxRelError(o, ref_o), kOutputRelTol) << "step " << step;
    for (int i = 3; i < kBatch; i += 11) {
      for (int j = 0; j < geo.h_v * geo.d_v; ++j) {
        ASSERT_EQ(o[int64_t{i} * geo.h_v * geo.d_v + j], 0.0f) << "entry " << i;
      }
    }
    const std::vector<uint8_t> gpu_bytes = gpu_pool.Bytes();
    const int64_t diff = DifferingBytes(gpu_bytes, ref);
    std::printf("tile decode %s %s %s%s step %d: %lld of %lld pool bytes differ from the tile "
                "reference, %lld of %lld outputs not bit-equal\n",
                arch == Arch::kGdn ? "gdn" : "kda", FormatSpecName({format, 0}).c_str(),
                bf ? "bf16" : "fp32", all_widths ? " all-widths" : "", step,
                static_cast<long long>(diff), static_cast<long long>(gpu_bytes.size()),
                static_cast<long long>(o_diff), static_cast<long long>(o_count));
    if (diff != 0) PrintHeadDiffs(layout, gpu_bytes, ref, 6);
    ASSERT_EQ(diff, 0) << "step " << step;
  }
  const std::vector<uint8_t> gpu_bytes = gpu_pool.Bytes();
  EXPECT_NE(gpu_bytes, start);
  EXPECT_GT(ExpectUnusedSlotsUntouched(gpu_bytes, start, gpu_pool.view.slot_bytes(), used), 20);
}

INSTANTIATE_TEST_SUITE_P(
    Tile, StepTileDecodeTest,
    ::testing::Values(TileParam{Arch::kGdn, StateFormat::kStepQuant6, DType::kFp32, false},
                      TileParam{Arch::kGdn, StateFormat::kStepQuant4, DType::kBf16, false},
                      TileParam{Arch::kKda, StateFormat::kStepQuant6, DType::kBf16, false},
                      TileParam{Arch::kKda, StateFormat::kStepQuant4, DType::kFp32, false},
                      TileParam{Arch::kKda, StateFormat::kStepQuant4, DType::kBf16, true},
                      TileParam{Arch::kKda, StateFormat::kStepQuant6, DType::kFp32, true}),
    [](const ::testing::TestParamInfo<TileParam>& info) {
      return absl::StrCat(std::get<0>(info.param) == Arch::kGdn ? "Gdn" : "Kda",
                          std::get<1>(info.param) == StateFormat::kStepQuant6 ? "Step6" : "Step4",
                          std::get<2>(info.param) == DType::kBf16 ? "Bf16" : "Fp32",
                          std::get<3>(info.param) ? "AllWidths" : "");
    });

// The tiled kernel is the default for eligible decode steps; the variant
// names still select the CPU-order builds.
TEST(StepTileDecodeEligibilityTest, NeedsAlignedHeadTable) {
  alignas(16) static uint8_t buf[64];
  const cuda_internal::StepKernelParams p = AlignedDecodeParams(buf);
  EXPECT_TRUE(cuda_internal::StepTileDecodeEligible(p));
  cuda_internal::StepKernelParams t = p;
  t.heads = reinterpret_cast<const StepHeadLayout*>(buf + 8);
  EXPECT_FALSE(cuda_internal::StepTileDecodeEligible(t));
  t = p;
  t.tokens = 2;
  EXPECT_FALSE(cuda_internal::StepTileDecodeEligible(t));
  // Two stages of the largest head plus scratch fit two CTAs per SM (228 KiB).
  EXPECT_LE(2 * (cuda_internal::TileSharedBytes() + 1024), 228 * 1024);
}

// ---- The tile reference on the host (no GPU needed) ---------------------------

// Random working state with a few large rows / columns (row x column outliers).
std::vector<float> OutlierState(int d_k, int d_v, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> w(int64_t{d_k} * d_v);
  for (int r = 0; r < d_k; ++r) {
    for (int j = 0; j < d_v; ++j) {
      w[r * d_v + j] = n(rng) * (r % 17 == 3 ? 20.0f : 1.0f) * (j % 29 == 5 ? 8.0f : 1.0f);
    }
  }
  return w;
}

TEST(StepTileReferenceTest, DefaultArgumentsKeepTheCpuCodec) {
  const ModelGeometry geo{Arch::kKda, 1, 2, 2, 128, 128};
  const StateLayout layout = AllWidthsLayout(geo, StateFormat::kStepQuant4, 5);
  const StepHeadLayout& l = layout.step_head(0, 1);
  const std::vector<float> w = OutlierState(128, 128, 9);
  std::vector<uint8_t> a(l.head_bytes), b(l.head_bytes);
  StepEncodeHead(l, layout.row_impact(0, 1), w.data(), a.data());
  StepEncodeHead(l, layout.row_impact(0, 1), w.data(), b.data(), StepSumOrder::kSerial);
  EXPECT_EQ(a, b);
  std::vector<float> x(w.size()), y(w.size()), z(w.size());
  StepDecodeHead(l, a.data(), x.data());
  const std::vector<float> ones(128, 1.0f);
  StepDecodeHead(l, a.data(), y.data(), ones.data());
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0);
  // A row scale multiplies each row's scale (integer rows) or value (pivots)
  // once: decay 0.5 is exact, so it halves every value.
  const std::vector<float> half(128, 0.5f);
  StepDecodeHead(l, a.data(), z.data(), half.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(z[i], 0.5f * x[i]) << i;
}

TEST(StepTileReferenceTest, TileOrderDiffersFromSerialOnlyInRounding) {
  const ModelGeometry geo{Arch::kKda, 1, 2, 2, 128, 128};
  for (StateFormat f : {StateFormat::kStepQuant6, StateFormat::kStepQuant4}) {
    const StateLayout layout = AllWidthsLayout(geo, f, 13);
    int64_t differing = 0, total = 0;
    for (int h = 0; h < 2; ++h) {
      const StepHeadLayout& l = layout.step_head(0, h);
      const std::vector<float> w = OutlierState(128, 128, 17 + h);
      std::vector<uint8_t> serial(l.head_bytes), tile(l.head_bytes);
      StepEncodeHead(l, layout.row_impact(0, h), w.data(), serial.data());
      StepEncodeHead(l, layout.row_impact(0, h), w.data(), tile.data(), StepSumOrder::kTile);
      // Only the column scales may differ (codes, row scales and pivots come
      // before the sums), each by at most one fp16 ulp.
      for (int64_t i = 0; i < l.col_scale_offset; ++i) ASSERT_EQ(serial[i], tile[i]) << i;
      for (int j = 0; j < 128; ++j) {
        const int a = LoadU16(serial.data() + l.col_scale_offset + 2 * j);
        const int b = LoadU16(tile.data() + l.col_scale_offset + 2 * j);
        EXPECT_LE(std::abs(a - b), 1) << "column " << j;
        differing += a != b;
        ++total;
      }
    }
    std::printf("%s: %lld of %lld column scales differ between the serial and tile orders\n",
                FormatSpecName({f, 0}).c_str(), static_cast<long long>(differing),
                static_cast<long long>(total));
  }
}

// The tile order's column sums are the tree of decode_math.h (WarpTreeSum):
// with w = 1 and all-equal |x| per column the sums are exact and equal.
TEST(StepTileReferenceTest, TreeSumIsWarpTreeSum) {
  float p[16];
  for (int i = 0; i < 16; ++i) p[i] = 1.0f + 1e-7f * static_cast<float>(i * i * 37 % 11);
  EXPECT_EQ(StepTileTreeSum16(p), WarpTreeSum(p));
}

// Prepare accepts STEPQuant layouts now (it answered kUnimplemented before
// the kernel existed).
TEST(StepCudaPrepareTest, AcceptsStepQuantLayouts) {
  STATECACHE_SKIP_WITHOUT_GPU();
  for (StateFormat f : {StateFormat::kStepQuant6, StateFormat::kStepQuant4}) {
    const StateLayout layout = MixedLayout(ModelGeometry{Arch::kGdn, 1, 1, 2, 128, 128}, f, 3);
    absl::StatusOr<std::unique_ptr<PreparedModel>> m = TestGpu()->Prepare(layout);
    EXPECT_TRUE(m.ok()) << m.status();
  }
}

}  // namespace
}  // namespace statecache
