// GPU vs CPU-reference tests of the CUDA backend. Without a usable GPU every
// test skips (GTEST_SKIP), so CI builds and "passes" it; run it on the device.
//
// The reference is the shared codec (DecodeHead / EncodeHead, ValueToStored /
// ValueFromStored) plus decode_math.h's ReferenceHeadStep, which states the
// kernel's exact arithmetic: packed bytes must be identical and outputs equal
// to 1e-5 relative (in practice bit-identical). Rounding-tie mismatches would
// be counted and printed; the expected count is 0.
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend/pinned_memory.h"
#include "kernels/common/status_macros.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/decode_math.h"
#include "kernels/formats/format.h"
#include "kernels/formats/head_codec.h"
#include "kernels/formats/numeric.h"
#include "kernels/formats/state_bound.h"
#include "kernels/formats/value_transform.h"
#include "kernels/layout/state_layout.h"
#include "kernels/cuda/testing/gpu_backend.h"
#include "kernels/testing/token_batch.h"

namespace statecache {
namespace {

// A device buffer with host staging.
struct DeviceArray {
  std::unique_ptr<BackendBuffer> buf;
  template <typename T>
  static DeviceArray From(const std::vector<T>& host) {
    DeviceArray a;
    a.buf = TestGpu()->Allocate(static_cast<int64_t>(host.size() * sizeof(T))).value();
    if (!host.empty()) {
      EXPECT_TRUE(TestGpu()->CopyIn(a.buf->data(), host.data(), host.size() * sizeof(T)).ok());
    }
    return a;
  }
  template <typename T>
  std::vector<T> To(size_t n) const {
    std::vector<T> out(n);
    EXPECT_TRUE(TestGpu()->CopyOut(out.data(), buf->data(), n * sizeof(T)).ok());
    return out;
  }
  template <typename T>
  T* ptr() const { return reinterpret_cast<T*>(buf->data()); }
};

StateLayout MakeLayout(Arch arch, StateFormat format, int d_k, int d_v, uint32_t seed,
                       bool identity = false, int k_hi = 16) {
  ModelGeometry g;
  g.arch = arch;
  g.layers = 2;
  g.h_v = 4;
  g.h_qk = arch == Arch::kKda ? 4 : 2;
  g.d_k = d_k;
  g.d_v = d_v;
  FormatSpec spec{format, IsMixedFormat(format) ? k_hi : 0};
  if (identity) return StateLayout::Identity(g, spec).value();
  std::mt19937 rng(seed);
  const int heads = g.layers * g.h_v;
  std::vector<int32_t> perm(heads * d_k);
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < d_k; ++i) perm[h * d_k + i] = i;
    std::shuffle(perm.begin() + h * d_k, perm.begin() + (h + 1) * d_k, rng);
  }
  std::vector<int32_t> order;
  std::vector<float> scale;
  if (format == StateFormat::kDampSr) {
    order.resize(heads * d_v);
    scale.resize(heads * d_v);
    std::uniform_real_distribution<float> u(0.5f, 2.0f);
    for (int h = 0; h < heads; ++h) {
      for (int j = 0; j < d_v; ++j) order[h * d_v + j] = j;
      std::shuffle(order.begin() + h * d_v, order.begin() + (h + 1) * d_v, rng);
    }
    for (float& s : scale) s = u(rng);
  }
  return StateLayout::Create(g, spec, std::move(perm), std::move(order), std::move(scale)).value();
}

// Host inputs of `rows` tokens (batch * tokens) for one layer.
struct HostInputs {
  DType dtype = DType::kFp32;
  std::vector<float> q, k, v, g, beta;  // float values (exactly representable in dtype)
  std::vector<uint16_t> q16, k16, v16;  // bits when dtype != fp32

  static HostInputs Random(const ModelGeometry& geo, int64_t rows, DType dtype, std::mt19937& rng) {
    HostInputs in;
    in.dtype = dtype;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    auto normalized = [&](std::vector<float>& x, int64_t n, int d) {
      x.resize(n * d);
      for (int64_t i = 0; i < n; ++i) {
        float s = 0;
        for (int j = 0; j < d; ++j) {
          x[i * d + j] = normal(rng);
          s += x[i * d + j] * x[i * d + j];
        }
        for (int j = 0; j < d; ++j) x[i * d + j] /= std::sqrt(s);
      }
    };
    normalized(in.q, rows * geo.h_qk, geo.d_k);
    normalized(in.k, rows * geo.h_qk, geo.d_k);
    in.v.resize(rows * geo.h_v * geo.d_v);
    for (float& x : in.v) x = normal(rng);
    in.g.resize(rows * geo.h_v * geo.GateWidth());
    for (float& x : in.g) x = -0.4f * uni(rng) - 0.01f;
    in.beta.resize(rows * geo.h_v);
    for (float& x : in.beta) x = 0.1f + 0.8f * uni(rng);
    if (dtype != DType::kFp32) {
      auto round = [&](std::vector<float>& x, std::vector<uint16_t>& bits) {
        bits.resize(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          bits[i] = dtype == DType::kBf16 ? FloatToBf16Bits(x[i]) : FloatToHalfBits(x[i]);
          x[i] = dtype == DType::kBf16 ? Bf16BitsToFloat(bits[i]) : HalfBitsToFloat(bits[i]);
        }
      };
      round(in.q, in.q16);
      round(in.k, in.k16);
      round(in.v, in.v16);
    }
    return in;
  }
};

struct DeviceInputs {
  DType dtype = DType::kFp32;
  DeviceArray q, k, v, g, beta;
  explicit DeviceInputs(const HostInputs& in) : dtype(in.dtype) {
    if (in.dtype == DType::kFp32) {
      q = DeviceArray::From(in.q);
      k = DeviceArray::From(in.k);
      v = DeviceArray::From(in.v);
    } else {
      q = DeviceArray::From(in.q16);
      k = DeviceArray::From(in.k16);
      v = DeviceArray::From(in.v16);
    }
    g = DeviceArray::From(in.g);
    beta = DeviceArray::From(in.beta);
  }
};

// The device tensors of `din` (dtype, q, k, v, g, beta) into a
// DecodeInputs or PrefillInputs, whose fields share these names.
template <typename Inputs>
void SetDeviceTensors(const DeviceInputs& din, Inputs* x) {
  x->dtype = din.dtype;
  x->q = din.q.buf->data();
  x->k = din.k.buf->data();
  x->v = din.v.buf->data();
  x->g = din.g.ptr<float>();
  x->beta = din.beta.ptr<float>();
}

// DecodeInputs of `batch` rows over the device inputs.
DecodeInputs DecodeInputsOf(const DeviceInputs& din, int batch, const int32_t* slots, float* o) {
  DecodeInputs di;
  di.batch = batch;
  di.slots = slots;
  di.o = o;
  SetDeviceTensors(din, &di);
  return di;
}

// The decay of token `row` for head h per stored row (exp(g), key-permuted).
std::vector<float> TokenDecay(const StateLayout& layout, int layer, int h, const HostInputs& in,
                              int64_t row) {
  const ModelGeometry& geo = layout.geometry();
  const int32_t* perm = layout.key_perm(layer, h);
  const int64_t gh = row * geo.h_v + h;
  std::vector<float> a(geo.d_k);
  for (int r = 0; r < geo.d_k; ++r) {
    a[r] = DecayExp(geo.arch == Arch::kKda ? in.g[gh * geo.d_k + perm[r]] : in.g[gh]);
  }
  return a;
}

// The reference: one token for (item b, head h) on the working state w.
// decay_folded: w was decoded with this token's decay folded in
// (DecodeHead's row_scale, decode_math.h), so a = 1 here.
void ReferenceToken(const StateLayout& layout, int layer, int h, const HostInputs& in,
                    int64_t row, bool decay_folded, std::vector<float>& w, float* o_out) {
  const ModelGeometry& geo = layout.geometry();
  const int kh = geo.KeyHeadOf(h);
  const int32_t* perm = layout.key_perm(layer, h);
  std::vector<float> a(geo.d_k), k(geo.d_k), qs(geo.d_k), v(geo.d_v), vp(geo.d_v), op(geo.d_v);
  const int64_t qk = (row * geo.h_qk + kh) * geo.d_k;
  const int64_t gh = row * geo.h_v + h;
  for (int r = 0; r < geo.d_k; ++r) {
    const int c = perm[r];
    k[r] = in.k[qk + c];
    qs[r] = geo.EffectiveScale() * in.q[qk + c];
    a[r] = decay_folded ? 1.0f
                        : DecayExp(geo.arch == Arch::kKda ? in.g[gh * geo.d_k + c] : in.g[gh]);
  }
  for (int j = 0; j < geo.d_v; ++j) v[j] = in.v[gh * geo.d_v + j];
  const ValueMap map{layout.head_layout().transform, layout.value_order(layer, h),
                     layout.value_scale(layer, h)};
  ValueToStored(map, v.data(), vp.data(), geo.d_v);
  ReferenceHeadStep(geo.d_k, geo.d_v, a.data(), k.data(), qs.data(), in.beta[gh], vp.data(),
                    w.data(), op.data());
  if (o_out != nullptr) ValueFromStored(map, op.data(), o_out, geo.d_v);
}

// Runs `tokens` reference steps of one layer on a host copy of the pool
// (decode when per_token_encode, else prefill: encode once at the end).
void ReferenceLayer(const StateLayout& layout, const PoolView& host_pool, int layer,
                    const std::vector<int32_t>& slots, int tokens, const HostInputs& in,
                    bool per_token_encode, std::vector<float>* o) {
  const ModelGeometry& geo = layout.geometry();
  const PackedHeadLayout& hl = layout.head_layout();
  std::vector<float> w(geo.d_k * geo.d_v);
  for (size_t b = 0; b < slots.size(); ++b) {
    for (int h = 0; h < geo.h_v; ++h) {
      if (slots[b] < 0) continue;
      uint8_t* head = host_pool.head(slots[b], layer, h);
      const int64_t row0 = static_cast<int64_t>(b) * tokens;
      DecodeHead(hl, head, w.data(), TokenDecay(layout, layer, h, in, row0).data());
      for (int t = 0; t < tokens; ++t) {
        const int64_t row = row0 + t;
        float* o_out = o == nullptr ? nullptr : o->data() + (row * geo.h_v + h) * geo.d_v;
        // Every decode of the stored head folds in the next token's decay.
        const bool folded = t == 0 || per_token_encode;
        ReferenceToken(layout, layer, h, in, row, folded, w, o_out);
        if (per_token_encode) {
          EncodeHead(hl, w.data(), head);
          if (t + 1 < tokens) {
            DecodeHead(hl, head, w.data(), TokenDecay(layout, layer, h, in, row + 1).data());
          }
        }
      }
      if (!per_token_encode) EncodeHead(hl, w.data(), head);
    }
  }
}

// huge_rows: every 16th key row of each head is scaled by 1e10, so its
// groups' FP16 scales saturate and |x| / s exceeds 2^14 (the affine
// encoders' fast path would overflow; they must take the exact slow path).
std::vector<float> RandomStates(const ModelGeometry& geo, int n, std::mt19937& rng,
                                bool huge_rows = false) {
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> s(int64_t{n} * geo.HeadsPerSlot() * geo.d_k * geo.d_v);
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    const int64_t key_row = i / geo.d_v % geo.d_k;
    s[i] = normal(rng) * (huge_rows && key_row % 16 == 5 ? 1e10f : 1.0f);
  }
  return s;
}

int64_t CountMismatches(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

double MaxRelError(const std::vector<float>& got, const std::vector<float>& want) {
  double norm = 0, worst = 0;
  for (float x : want) norm = std::max(norm, static_cast<double>(std::fabs(x)));
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  return norm > 0 ? worst / norm : worst;
}

struct Case {
  Arch arch;
  StateFormat format;
  DType dtype;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  std::string s = absl::StrCat(ArchName(info.param.arch), "_", FormatName(info.param.format), "_",
                               DTypeName(info.param.dtype));
  for (char& c : s) if (c == '-') c = '_';
  return s;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (StateFormat f : AllStateFormats()) {
    cases.push_back({Arch::kGdn, f, DType::kFp32});
    cases.push_back({Arch::kKda, f, DType::kFp32});
  }
  cases.push_back({Arch::kGdn, StateFormat::kDamp, DType::kBf16});
  cases.push_back({Arch::kGdn, StateFormat::kDampSr, DType::kFp16});
  cases.push_back({Arch::kKda, StateFormat::kInt8Hadamard, DType::kBf16});
  return cases;
}

class GpuAgreementTest : public ::testing::TestWithParam<Case> {};

// The pool and batch of a decode check: num_slots slots, the batch's slot
// entries (-1: skipped).
struct DecodeCheck {
  int num_slots = 6;
  std::vector<int32_t> batch_slots = {4, -1, 1, 2};
  bool huge_rows = false;  // RandomStates' saturating rows
};

// Pack (vs the CPU backend), N decode steps (vs the reference), slots outside
// the batch untouched, -1 skipped with o zeroed.
void ExpectDecodeStepsMatchReference(const Case& c, const DecodeCheck& check) {
  const StateLayout layout = MakeLayout(c.arch, c.format, 128, 128, 11);
  const ModelGeometry& geo = layout.geometry();
  auto gpu_model = TestGpu()->Prepare(layout).value();
  auto cpu = CpuBackend::Create({2});
  auto cpu_model = cpu->Prepare(layout).value();

  const int num_slots = check.num_slots;
  const int64_t head_bytes = layout.head_layout().head_bytes;
  const int64_t pool_bytes = num_slots * layout.slot_bytes();
  auto gpu_pool_buf = TestGpu()->Allocate(pool_bytes).value();
  auto cpu_pool_buf = cpu->Allocate(pool_bytes).value();
  const PoolView gpu_pool{gpu_pool_buf->data(), num_slots, geo.layers, geo.h_v, head_bytes};
  const PoolView cpu_pool{cpu_pool_buf->data(), num_slots, geo.layers, geo.h_v, head_bytes};

  std::mt19937 rng(1234 + static_cast<int>(c.format) * 7 + static_cast<int>(c.arch));
  std::vector<int32_t> all_slots(num_slots);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  const std::vector<float> states = RandomStates(geo, num_slots, rng, check.huge_rows);
  DeviceArray d_states = DeviceArray::From(states);
  DeviceArray d_all = DeviceArray::From(all_slots);
  ASSERT_TRUE(TestGpu()->PackStates(*gpu_model, gpu_pool, d_all.ptr<int32_t>(), num_slots,
                                d_states.ptr<float>()).ok());
  ASSERT_TRUE(cpu->PackStates(*cpu_model, cpu_pool, all_slots.data(), num_slots, states.data()).ok());
  std::vector<uint8_t> ref(cpu_pool_buf->data(), cpu_pool_buf->data() + pool_bytes);
  std::vector<uint8_t> got(pool_bytes);
  ASSERT_TRUE(TestGpu()->CopyOut(got.data(), gpu_pool_buf->data(), pool_bytes).ok());
  ASSERT_EQ(CountMismatches(got, ref), 0) << "pack bytes differ from the CPU backend";

  // Upload the packed pool again into a fresh buffer we keep.
  DeviceArray pool_arr = DeviceArray::From(got);
  const PoolView pool{pool_arr.ptr<uint8_t>(), num_slots, geo.layers, geo.h_v, head_bytes};
  const std::vector<int32_t>& batch_slots = check.batch_slots;
  const int batch = static_cast<int>(batch_slots.size());
  DeviceArray d_slots = DeviceArray::From(batch_slots);
  const int layer = 1;
  int64_t total_mismatch = 0;
  double worst_o = 0;
  for (int step = 0; step < 3; ++step) {
    HostInputs in = HostInputs::Random(geo, batch, c.dtype, rng);
    DeviceInputs din(in);
    std::vector<float> o_ref(batch * geo.h_v * geo.d_v, 0.0f);
    DeviceArray d_o = DeviceArray::From(std::vector<float>(o_ref.size(), 12345.0f));
    const DecodeInputs di = DecodeInputsOf(din, batch, d_slots.ptr<int32_t>(), d_o.ptr<float>());
    const absl::Status s = TestGpu()->DecodeUpdate(*gpu_model, pool, layer, di);
    ASSERT_TRUE(s.ok()) << s;
    const PoolView host_pool{ref.data(), num_slots, geo.layers, geo.h_v, head_bytes};
    ReferenceLayer(layout, host_pool, layer, batch_slots, 1, in, true, &o_ref);
    const std::vector<float> o = d_o.To<float>(o_ref.size());
    worst_o = std::max(worst_o, MaxRelError(o, o_ref));
    for (int b = 0; b < batch; ++b) {
      if (batch_slots[b] >= 0) continue;
      for (int h = 0; h < geo.h_v; ++h) {
        for (int j = 0; j < geo.d_v; ++j) {
          ASSERT_EQ(o[(int64_t{b} * geo.h_v + h) * geo.d_v + j], 0.0f) << "o of skipped item " << b;
        }
      }
    }
    const std::vector<uint8_t> now = pool_arr.To<uint8_t>(pool_bytes);
    total_mismatch += CountMismatches(now, ref);
    // Continue from the GPU bytes so a (counted) tie does not snowball.
    ref = now;
  }
  EXPECT_EQ(total_mismatch, 0) << "packed-state bytes differing from the reference (ties)";
  EXPECT_LT(worst_o, 1e-5);
  // Slots outside the batch, and layer 0 of every slot, were never updated:
  // they must still equal the CPU pack.
  const std::vector<bool> in_batch = UsedSlots(num_slots, batch_slots);
  std::vector<uint8_t> cpu_bytes(cpu_pool_buf->data(), cpu_pool_buf->data() + pool_bytes);
  const std::vector<uint8_t> now = pool_arr.To<uint8_t>(pool_bytes);
  int untouched = 0;
  for (int slot = 0; slot < num_slots; ++slot) {
    const int64_t bytes = in_batch[slot] ? geo.h_v * head_bytes : layout.slot_bytes();
    untouched += in_batch[slot] ? 0 : 1;
    EXPECT_EQ(0, std::memcmp(now.data() + slot * layout.slot_bytes(),
                             cpu_bytes.data() + slot * layout.slot_bytes(), bytes))
        << (in_batch[slot] ? "layer 0 of slot " : "slot ") << slot << " changed";
  }
  EXPECT_GT(untouched, 0) << "the check needs slots outside the batch";
}

TEST_P(GpuAgreementTest, DecodeStepsMatchReferenceBytes) {
  STATECACHE_SKIP_WITHOUT_GPU();
  ExpectDecodeStepsMatchReference(GetParam(), DecodeCheck{});
}

// Groups whose FP16 scale saturates take the affine encoders' exact slow
// path (the fast path's 16-bit arithmetic would overflow): the bytes still
// match the reference.
class GpuSaturatedScaleTest : public ::testing::TestWithParam<Case> {};

TEST_P(GpuSaturatedScaleTest, DecodeStepsMatchReferenceBytes) {
  STATECACHE_SKIP_WITHOUT_GPU();
  DecodeCheck check;
  check.huge_rows = true;
  ExpectDecodeStepsMatchReference(GetParam(), check);
}

// A batch of 2,000 heads (500 slots x 4 heads, every 7th entry -1,
// shuffled): about 7.6 items per CTA of the pipelined kernel and 10 per CTA
// of the staged one (4,000 column halves on 396 CTAs), so their stages
// refill (after the staged kernel's tensor-map stores) and the producer
// role rotates many times per launch (the tests above have fewer items
// than CTAs).
class GpuPipelineTest : public ::testing::TestWithParam<Case> {};

TEST_P(GpuPipelineTest, ManyItemsPerCtaMatchReference) {
  STATECACHE_SKIP_WITHOUT_GPU();
  DecodeCheck check;
  check.num_slots = 520;
  check.batch_slots = MakeShuffledBatch(check.num_slots, 500, 77, 3, 7).slots;
  ExpectDecodeStepsMatchReference(GetParam(), check);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, GpuPipelineTest,
    ::testing::Values(Case{Arch::kGdn, StateFormat::kDamp, DType::kBf16},
                      Case{Arch::kKda, StateFormat::kDamp, DType::kFp32},
                      Case{Arch::kKda, StateFormat::kDampSr, DType::kFp16},
                      Case{Arch::kGdn, StateFormat::kFp32, DType::kFp32},
                      // The staged kernel's items are column halves
                      // (ColumnParts): KDA's per-head gates and the outputs
                      // by head item.
                      Case{Arch::kKda, StateFormat::kFp32, DType::kBf16},
                      Case{Arch::kGdn, StateFormat::kBf16, DType::kBf16},
                      Case{Arch::kKda, StateFormat::kFp16, DType::kFp16}),
    CaseName);

// Decode steps of one layer enqueued back to back with no host
// synchronization in between (CudaEnqueueDecodeUnchecked: the fused kernels
// alone), as a serving engine's graph runs them: each kernel is a
// programmatic dependent of the previous one (grid_dependency.cuh). On the
// same slots every step, each must wait for the state the previous one
// wrote; with early heads the steps alternate between two disjoint slot sets
// (the contract of early_heads: the previous kernel writes none of this
// one's slots), so each stages its first heads while the previous one runs.
// Every step's outputs and the final bytes equal the reference.
void ExpectBackToBackStepsMatchReference(const Case& c, bool early_heads) {
  const StateLayout layout = MakeLayout(c.arch, c.format, 128, 128, 5);
  const ModelGeometry& geo = layout.geometry();
  auto gpu_model = TestGpu()->Prepare(layout).value();
  auto cpu = CpuBackend::Create({2});
  auto cpu_model = cpu->Prepare(layout).value();
  const int num_slots = 80;
  const int64_t head_bytes = layout.head_layout().head_bytes;
  const int64_t pool_bytes = num_slots * layout.slot_bytes();
  auto cpu_pool_buf = cpu->Allocate(pool_bytes).value();
  const PoolView cpu_pool{cpu_pool_buf->data(), num_slots, geo.layers, geo.h_v, head_bytes};
  std::mt19937 rng(99 + static_cast<int>(c.format));
  std::vector<int32_t> all_slots(num_slots);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  const std::vector<float> states = RandomStates(geo, num_slots, rng);
  ASSERT_TRUE(cpu->PackStates(*cpu_model, cpu_pool, all_slots.data(), num_slots, states.data()).ok());
  std::vector<uint8_t> ref(cpu_pool_buf->data(), cpu_pool_buf->data() + pool_bytes);
  DeviceArray pool_arr = DeviceArray::From(ref);
  const PoolView pool{pool_arr.ptr<uint8_t>(), num_slots, geo.layers, geo.h_v, head_bytes};
  // 72 of the 80 slots, shuffled, every 11th entry from the 4th skipped; its
  // halves are two disjoint batches of 36 entries (132 head items each, one
  // per SM of an H200).
  const std::vector<int32_t> shuffled = MakeShuffledBatch(num_slots, 72, 5, 3, 11).slots;
  const std::vector<int32_t> halves[2] = {{shuffled.begin(), shuffled.begin() + 36},
                                          {shuffled.begin() + 36, shuffled.end()}};
  const int batch = 36;
  DeviceArray d_slots[2] = {DeviceArray::From(halves[0]), DeviceArray::From(halves[1])};
  constexpr int kSteps = 12;
  const int layer = 1;
  const auto set_of = [&](int step) { return early_heads ? step % 2 : 0; };
  std::vector<HostInputs> inputs;
  std::vector<std::unique_ptr<DeviceInputs>> device_inputs;
  std::vector<DeviceArray> outputs;
  for (int step = 0; step < kSteps; ++step) {
    inputs.push_back(HostInputs::Random(geo, batch, c.dtype, rng));
    device_inputs.push_back(std::make_unique<DeviceInputs>(inputs.back()));
    outputs.push_back(DeviceArray::From(std::vector<float>(batch * geo.h_v * geo.d_v, 0.0f)));
  }
  for (int step = 0; step < kSteps; ++step) {
    const DecodeInputs di = DecodeInputsOf(*device_inputs[step], batch,
                                           d_slots[set_of(step)].ptr<int32_t>(),
                                           outputs[step].ptr<float>());
    ASSERT_TRUE(
        CudaEnqueueDecodeUnchecked(*TestGpu(), *gpu_model, pool, layer, di, early_heads).ok());
  }
  ASSERT_TRUE(CudaSynchronize(*TestGpu()).ok());
  const PoolView host_pool{ref.data(), num_slots, geo.layers, geo.h_v, head_bytes};
  double worst_o = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> o_ref(batch * geo.h_v * geo.d_v, 0.0f);
    ReferenceLayer(layout, host_pool, layer, halves[set_of(step)], 1, inputs[step], true, &o_ref);
    worst_o = std::max(worst_o, MaxRelError(outputs[step].To<float>(o_ref.size()), o_ref));
  }
  EXPECT_LT(worst_o, 1e-5);
  EXPECT_EQ(CountMismatches(pool_arr.To<uint8_t>(pool_bytes), ref), 0)
      << "packed-state bytes after " << kSteps << " dependent steps";
}

class GpuBackToBackTest : public ::testing::TestWithParam<Case> {};

TEST_P(GpuBackToBackTest, DependentStepsMatchReference) {
  STATECACHE_SKIP_WITHOUT_GPU();
  ExpectBackToBackStepsMatchReference(GetParam(), false);
}

TEST_P(GpuBackToBackTest, EarlyHeadsOnAlternatingSlotsMatchReference) {
  STATECACHE_SKIP_WITHOUT_GPU();
  ExpectBackToBackStepsMatchReference(GetParam(), true);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, GpuBackToBackTest,
    ::testing::Values(Case{Arch::kGdn, StateFormat::kDamp, DType::kBf16},
                      Case{Arch::kKda, StateFormat::kInt8Hadamard, DType::kFp32},
                      // The staged kernel (fixed-shape fp32).
                      Case{Arch::kGdn, StateFormat::kFp32, DType::kBf16}),
    CaseName);

INSTANTIATE_TEST_SUITE_P(
    AffineFormats, GpuSaturatedScaleTest,
    ::testing::Values(Case{Arch::kGdn, StateFormat::kDamp, DType::kBf16},
                      Case{Arch::kKda, StateFormat::kDampSr, DType::kFp32},
                      Case{Arch::kGdn, StateFormat::kInt8Hadamard, DType::kFp32},
                      Case{Arch::kGdn, StateFormat::kInt4Hadamard, DType::kFp32}),
    CaseName);

// Prefill of T tokens (quantized once) equals the reference.
TEST_P(GpuAgreementTest, PrefillMatchesReference) {
  STATECACHE_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const StateLayout layout = MakeLayout(c.arch, c.format, 128, 128, 5);
  const ModelGeometry& geo = layout.geometry();
  auto model = TestGpu()->Prepare(layout).value();
  const int num_slots = 3, tokens = 5;
  const int64_t head_bytes = layout.head_layout().head_bytes;
  const int64_t pool_bytes = num_slots * layout.slot_bytes();
  std::mt19937 rng(99 + static_cast<int>(c.format));
  // Start from a packed random state (host encode).
  std::vector<uint8_t> host(pool_bytes, 0);
  const PoolView host_pool{host.data(), num_slots, geo.layers, geo.h_v, head_bytes};
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> w(geo.d_k * geo.d_v);
  for (int s = 0; s < num_slots; ++s) {
    for (int l = 0; l < geo.layers; ++l) {
      for (int h = 0; h < geo.h_v; ++h) {
        for (float& x : w) x = normal(rng);
        EncodeHead(layout.head_layout(), w.data(), host_pool.head(s, l, h));
      }
    }
  }
  DeviceArray pool_arr = DeviceArray::From(host);
  const PoolView pool{pool_arr.ptr<uint8_t>(), num_slots, geo.layers, geo.h_v, head_bytes};
  const std::vector<int32_t> slots = {2, -1, 0};
  DeviceArray d_slots = DeviceArray::From(slots);
  HostInputs in = HostInputs::Random(geo, int64_t{3} * tokens, c.dtype, rng);
  DeviceInputs din(in);
  std::vector<float> o_ref(int64_t{3} * tokens * geo.h_v * geo.d_v, 0.0f);
  DeviceArray d_o = DeviceArray::From(std::vector<float>(o_ref.size(), 7.0f));
  PrefillInputs pi;
  pi.batch = 3;
  pi.tokens = tokens;
  pi.slots = d_slots.ptr<int32_t>();
  pi.o = d_o.ptr<float>();
  SetDeviceTensors(din, &pi);
  const absl::Status s = TestGpu()->Prefill(*model, pool, 0, pi);
  ASSERT_TRUE(s.ok()) << s;
  ReferenceLayer(layout, host_pool, 0, slots, tokens, in, false, &o_ref);
  EXPECT_EQ(CountMismatches(pool_arr.To<uint8_t>(pool_bytes), host), 0);
  EXPECT_LT(MaxRelError(d_o.To<float>(o_ref.size()), o_ref), 1e-5);
}

// Two slots (1, 0) packed by the CPU backend from random FP32 states, on the
// host and as a device copy, with both backends' prepared models.
struct TwoPackedSlots {
  TwoPackedSlots(const StateLayout& layout, uint32_t seed)
      : geo(layout.geometry()), cpu(CpuBackend::Create({2})) {
    const int64_t head_bytes = layout.head_layout().head_bytes;
    gpu_model = TestGpu()->Prepare(layout).value();
    cpu_model = cpu->Prepare(layout).value();
    std::mt19937 rng(seed);
    states = RandomStates(geo, 2, rng);
    host.assign(2 * layout.slot_bytes(), 0);
    host_pool = PoolView{host.data(), 2, geo.layers, geo.h_v, head_bytes};
    EXPECT_TRUE(cpu->PackStates(*cpu_model, host_pool, slots.data(), 2, states.data()).ok());
    device = DeviceArray::From(host);
    pool = PoolView{device.ptr<uint8_t>(), 2, geo.layers, geo.h_v, head_bytes};
    d_slots = DeviceArray::From(slots);
  }
  const ModelGeometry geo;
  const std::vector<int32_t> slots = {1, 0};
  std::unique_ptr<CpuBackend> cpu;
  std::unique_ptr<PreparedModel> gpu_model, cpu_model;
  std::vector<float> states;
  std::vector<uint8_t> host;
  PoolView host_pool;
  DeviceArray device, d_slots;
  PoolView pool;  // over `device`
};

// Unpack equals the CPU backend's unpack, bit for bit.
TEST_P(GpuAgreementTest, UnpackMatchesCpu) {
  STATECACHE_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  if (c.dtype != DType::kFp32) GTEST_SKIP() << "dtype does not matter here";
  const TwoPackedSlots t(MakeLayout(c.arch, c.format, 128, 128, 3), 5);
  std::vector<float> cpu_out(t.states.size());
  ASSERT_TRUE(t.cpu->UnpackStates(*t.cpu_model, t.host_pool, t.slots.data(), 2, cpu_out.data()).ok());
  DeviceArray d_out = DeviceArray::From(std::vector<float>(t.states.size(), 3.0f));
  ASSERT_TRUE(TestGpu()->UnpackStates(*t.gpu_model, t.pool, t.d_slots.ptr<int32_t>(), 2,
                                  d_out.ptr<float>()).ok());
  const std::vector<float> got = d_out.To<float>(t.states.size());
  int64_t diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff += std::memcmp(&got[i], &cpu_out[i], 4) != 0;
  EXPECT_EQ(diff, 0);
  if (c.format == StateFormat::kFp32 && c.arch == Arch::kGdn) {
    EXPECT_EQ(0, std::memcmp(got.data(), t.states.data(), t.states.size() * 4)) << "fp32 round trip";
  }
}

// The GPU recurrence agrees with the CPU backend (std::exp, serial sums, no
// FMA) to FP32 rounding for fp32 states: checks the semantics (GVA, KDA
// gates, permutations, transforms) independently of decode_math.h.
TEST_P(GpuAgreementTest, CloseToCpuBackend) {
  STATECACHE_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  if (c.dtype != DType::kFp32) GTEST_SKIP();
  TwoPackedSlots t(MakeLayout(c.arch, c.format, 128, 128, 17), 8);
  const ModelGeometry& geo = t.geo;
  std::mt19937 rng(9);
  HostInputs in = HostInputs::Random(geo, 2, DType::kFp32, rng);
  DeviceInputs din(in);
  DeviceArray d_o = DeviceArray::From(std::vector<float>(2 * geo.h_v * geo.d_v, 0.0f));
  const DecodeInputs di = DecodeInputsOf(din, 2, t.d_slots.ptr<int32_t>(), d_o.ptr<float>());
  ASSERT_TRUE(TestGpu()->DecodeUpdate(*t.gpu_model, t.pool, 0, di).ok());
  std::vector<float> cpu_o(2 * geo.h_v * geo.d_v);
  DecodeInputs ci{2, t.slots.data(), DType::kFp32, in.q.data(), in.k.data(), in.v.data(),
                  in.g.data(), in.beta.data(), cpu_o.data()};
  ASSERT_TRUE(t.cpu->DecodeUpdate(*t.cpu_model, t.host_pool, 0, ci).ok());
  const double o_err = MaxRelError(d_o.To<float>(cpu_o.size()), cpu_o);
  EXPECT_LT(o_err, 1e-4);
  // States: unpack both and compare.
  std::vector<float> cpu_states(t.states.size());
  ASSERT_TRUE(
      t.cpu->UnpackStates(*t.cpu_model, t.host_pool, t.slots.data(), 2, cpu_states.data()).ok());
  DeviceArray d_states = DeviceArray::From(std::vector<float>(t.states.size(), 0.0f));
  ASSERT_TRUE(TestGpu()->UnpackStates(*t.gpu_model, t.pool, t.d_slots.ptr<int32_t>(), 2,
                                  d_states.ptr<float>()).ok());
  const std::vector<float> gpu_states = d_states.To<float>(t.states.size());
  // Quantized formats may land one code apart where FP32 rounding differs.
  const double tol = c.format == StateFormat::kFp32 ? 1e-5 : 0.2;
  EXPECT_LT(MaxRelError(gpu_states, cpu_states), tol);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, GpuAgreementTest, ::testing::ValuesIn(AllCases()), CaseName);

// Shapes other than 128 x 128: masked rows (d_k = 100), two stripes, eight
// stripes, four row warps per stripe (d_k = 256: four warps at each
// stripe's column-sum exchange); and mixed formats with k_hi = 5, whose hi
// rows and lo rows end in partial row blocks (head_layout.h) and share a
// row step.
TEST(GpuShapeTest, OddShapesMatchReference) {
  STATECACHE_SKIP_WITHOUT_GPU();
  const std::pair<StateFormat, int> formats[] = {{StateFormat::kDamp, 16},
                                                 {StateFormat::kDamp, 5},
                                                 {StateFormat::kDampSr, 5},
                                                 {StateFormat::kFp32, 0},
                                                 {StateFormat::kNvfp4, 0}};
  for (const auto& [f, k_hi] : formats) {
    for (auto [d_k, d_v] : {std::pair<int, int>{100, 64}, {64, 256}, {32, 32}, {256, 64}}) {
      const StateLayout layout = MakeLayout(Arch::kKda, f, d_k, d_v, 21, false, k_hi);
      const ModelGeometry& geo = layout.geometry();
      auto model = TestGpu()->Prepare(layout).value();
      const int num_slots = 2;
      const int64_t head_bytes = layout.head_layout().head_bytes;
      std::mt19937 rng(d_k * 1000 + d_v);
      std::vector<uint8_t> host(num_slots * layout.slot_bytes(), 0);
      const PoolView host_pool{host.data(), num_slots, geo.layers, geo.h_v, head_bytes};
      std::normal_distribution<float> normal(0.0f, 0.5f);
      std::vector<float> w(d_k * d_v);
      for (int s = 0; s < num_slots; ++s)
        for (int l = 0; l < geo.layers; ++l)
          for (int h = 0; h < geo.h_v; ++h) {
            for (float& x : w) x = normal(rng);
            EncodeHead(layout.head_layout(), w.data(), host_pool.head(s, l, h));
          }
      DeviceArray pool_arr = DeviceArray::From(host);
      const PoolView pool{pool_arr.ptr<uint8_t>(), num_slots, geo.layers, geo.h_v, head_bytes};
      const std::vector<int32_t> slots = {1, 0};
      DeviceArray d_slots = DeviceArray::From(slots);
      // bf16 with d_k = 100 makes q/k rows 200 bytes: not 16-byte multiples,
      // so this decode takes the unpipelined kernel.
      const DType dtype = d_k == 100 ? DType::kBf16 : DType::kFp32;
      HostInputs in = HostInputs::Random(geo, 2, dtype, rng);
      DeviceInputs din(in);
      std::vector<float> o_ref(2 * geo.h_v * d_v);
      DeviceArray d_o = DeviceArray::From(o_ref);
      const DecodeInputs di = DecodeInputsOf(din, 2, d_slots.ptr<int32_t>(), d_o.ptr<float>());
      ASSERT_TRUE(TestGpu()->DecodeUpdate(*model, pool, 1, di).ok());
      ReferenceLayer(layout, host_pool, 1, slots, 1, in, true, &o_ref);
      EXPECT_EQ(CountMismatches(pool_arr.To<uint8_t>(host.size()), host), 0)
          << FormatName(f) << " k_hi " << k_hi << " " << d_k << "x" << d_v;
      EXPECT_LT(MaxRelError(d_o.To<float>(o_ref.size()), o_ref), 1e-5);
    }
  }
}

// The binding's checks and slot copies on a damp pool and on an fp32 pool
// (whose decode runs the staged kernel: its abort path must not write either).
class GpuBindingTest : public ::testing::TestWithParam<StateFormat> {
 protected:
  void SetUp() override {
    if (TestGpu() == nullptr) GTEST_SKIP() << "no usable CUDA device";
    layout_ = std::make_unique<StateLayout>(MakeLayout(Arch::kGdn, GetParam(), 128, 128, 1));
    model_ = TestGpu()->Prepare(*layout_).value();
    const ModelGeometry& geo = layout_->geometry();
    std::mt19937 rng(3);
    std::vector<uint8_t> bytes(4 * layout_->slot_bytes());
    for (auto& b : bytes) b = static_cast<uint8_t>(rng() & 0x3f);  // finite fp16 / fp32 / codes
    before_ = bytes;
    pool_arr_ = DeviceArray::From(bytes);
    pool_ = PoolView{pool_arr_.ptr<uint8_t>(), 4, geo.layers, geo.h_v,
                     layout_->head_layout().head_bytes};
    in_ = HostInputs::Random(geo, 2, DType::kFp32, rng);
  }

  absl::Status Decode(std::vector<int32_t> slots, const HostInputs& in, int layer = 0) {
    DeviceArray d_slots = DeviceArray::From(slots);
    DeviceInputs din(in);
    DeviceArray d_o = DeviceArray::From(std::vector<float>(2 * 4 * 128, 0.0f));
    const DecodeInputs di = DecodeInputsOf(din, 2, d_slots.ptr<int32_t>(), d_o.ptr<float>());
    return TestGpu()->DecodeUpdate(*model_, pool_, layer, di);
  }
  bool PoolUnchanged() { return pool_arr_.To<uint8_t>(before_.size()) == before_; }

  std::unique_ptr<StateLayout> layout_;
  std::unique_ptr<PreparedModel> model_;
  DeviceArray pool_arr_;
  PoolView pool_;
  std::vector<uint8_t> before_;
  HostInputs in_;
};

TEST_P(GpuBindingTest, RejectsBadSlotsAndInputsWithoutWriting) {
  absl::Status s = Decode({0, 4}, in_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("slots[1]"), std::string::npos) << s;
  s = Decode({2, 2}, in_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("twice"), std::string::npos) << s;
  s = Decode({0, 1}, in_, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("layer"), std::string::npos) << s;
  HostInputs bad = in_;
  bad.v[300] = NAN;
  s = Decode({0, 1}, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("v[300]"), std::string::npos) << s;
  bad = in_;
  bad.q[5] = INFINITY;
  s = Decode({0, 1}, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("q[5]"), std::string::npos) << s;
  bad = in_;
  bad.g[3] = 0.5f;
  s = Decode({0, 1}, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("g[3]"), std::string::npos) << s;
  bad = in_;
  bad.beta[1] = NAN;
  s = Decode({0, 1}, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("beta[1]"), std::string::npos) << s;
  EXPECT_TRUE(PoolUnchanged());
  DecodeInputs null_q;
  null_q.batch = 1;
  DeviceArray d_slots = DeviceArray::From(std::vector<int32_t>{0});
  null_q.slots = d_slots.ptr<int32_t>();
  s = TestGpu()->DecodeUpdate(*model_, pool_, 0, null_q);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("q: null"), std::string::npos) << s;
  EXPECT_TRUE(Decode({0, -1}, in_).ok());
  EXPECT_FALSE(PoolUnchanged());
}

TEST_P(GpuBindingTest, CopySlotsAndZeroSlots) {
  const int64_t sb = layout_->slot_bytes();
  auto snap_buf = TestGpu()->Allocate(3 * sb).value();
  const PoolView snap{snap_buf->data(), 3, pool_.layers, pool_.heads, pool_.head_bytes};
  DeviceArray src = DeviceArray::From(std::vector<int32_t>{3, 1});
  DeviceArray dst = DeviceArray::From(std::vector<int32_t>{0, 2});
  ASSERT_TRUE(TestGpu()->CopySlots(pool_, src.ptr<int32_t>(), snap, dst.ptr<int32_t>(), 2).ok());
  std::vector<uint8_t> got(3 * sb);
  ASSERT_TRUE(TestGpu()->CopyOut(got.data(), snap_buf->data(), 3 * sb).ok());
  EXPECT_EQ(0, std::memcmp(got.data(), before_.data() + 3 * sb, sb));
  EXPECT_EQ(0, std::memcmp(got.data() + 2 * sb, before_.data() + 1 * sb, sb));
  for (int64_t i = sb; i < 2 * sb; ++i) ASSERT_EQ(got[i], 0) << "slot 1 of the snapshot pool";
  // Restore into slot 0 of the pool and zero slot 2.
  DeviceArray one = DeviceArray::From(std::vector<int32_t>{0});
  ASSERT_TRUE(TestGpu()->CopySlots(snap, one.ptr<int32_t>(), pool_, one.ptr<int32_t>(), 1).ok());
  DeviceArray z = DeviceArray::From(std::vector<int32_t>{-1, 2});
  ASSERT_TRUE(TestGpu()->ZeroSlots(pool_, z.ptr<int32_t>(), 2).ok());
  std::vector<uint8_t> expect = before_;
  std::memcpy(expect.data(), before_.data() + 3 * sb, sb);
  std::memset(expect.data() + 2 * sb, 0, sb);
  EXPECT_EQ(pool_arr_.To<uint8_t>(expect.size()), expect);
  // Bad copies: out of range, -1, duplicate destinations, size mismatch.
  DeviceArray bad = DeviceArray::From(std::vector<int32_t>{0, 7});
  absl::Status s = TestGpu()->CopySlots(pool_, bad.ptr<int32_t>(), snap, dst.ptr<int32_t>(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("src_slots[1]"), std::string::npos) << s;
  DeviceArray dup = DeviceArray::From(std::vector<int32_t>{1, 1});
  s = TestGpu()->CopySlots(pool_, src.ptr<int32_t>(), snap, dup.ptr<int32_t>(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("dst_slots[1]"), std::string::npos) << s;
  DeviceArray neg = DeviceArray::From(std::vector<int32_t>{-1, 1});
  s = TestGpu()->CopySlots(pool_, neg.ptr<int32_t>(), snap, dst.ptr<int32_t>(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  PoolView other = snap;
  other.heads = 2;
  s = TestGpu()->CopySlots(pool_, src.ptr<int32_t>(), other, dst.ptr<int32_t>(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_arr_.To<uint8_t>(expect.size()), expect);
}

TEST_P(GpuBindingTest, CopyWithinCopiesOneWholeSlot) {
  const int64_t sb = layout_->slot_bytes();
  auto snap_buf = TestGpu()->Allocate(2 * sb).value();
  ASSERT_TRUE(TestGpu()->CopyWithin(snap_buf->data() + sb, pool_.slot(3), sb).ok());
  std::vector<uint8_t> got(sb);
  ASSERT_TRUE(TestGpu()->CopyOut(got.data(), snap_buf->data() + sb, sb).ok());
  EXPECT_EQ(0, std::memcmp(got.data(), before_.data() + 3 * sb, sb));
  EXPECT_EQ(TestGpu()->CopyWithin(snap_buf->data(), pool_.slot(0), -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_arr_.To<uint8_t>(before_.size()), before_);
}

// Several chunks (1 MiB each at this size) and a ragged tail; the host
// buffers page-locked (the host tier's) and pageable.
TEST(GpuCopyTest, CopyOutThenInSwapsTheRegionsBytesInChunks) {
  constexpr int64_t kBytes = (int64_t{5} << 20) + 123;
  auto region = TestGpu()->Allocate(kBytes).value();
  auto pinned_out = TestGpu()->pinned_memory()->AllocatePinned(kBytes).value();
  auto pinned_in = TestGpu()->pinned_memory()->AllocatePinned(kBytes).value();
  std::vector<uint8_t> before(kBytes), in(kBytes), out(kBytes);
  for (int64_t i = 0; i < kBytes; ++i) {
    before[i] = static_cast<uint8_t>(i * 7 + (i >> 20));
    in[i] = static_cast<uint8_t>(i * 13 + 1);
  }
  for (bool page_locked : {true, false}) {
    SCOPED_TRACE(page_locked ? "page-locked" : "pageable");
    ASSERT_TRUE(TestGpu()->CopyIn(region->data(), before.data(), kBytes).ok());
    uint8_t* dst = page_locked ? pinned_out->data() : out.data();
    uint8_t* src = page_locked ? pinned_in->data() : in.data();
    if (page_locked) std::memcpy(src, in.data(), kBytes);
    std::memset(dst, 0, kBytes);
    ASSERT_TRUE(TestGpu()->CopyOutThenIn(dst, region->data(), src, kBytes).ok());
    EXPECT_EQ(0, std::memcmp(dst, before.data(), kBytes));
    std::vector<uint8_t> now(kBytes);
    ASSERT_TRUE(TestGpu()->CopyOut(now.data(), region->data(), kBytes).ok());
    EXPECT_EQ(now, in);
  }
  EXPECT_EQ(TestGpu()->CopyOutThenIn(out.data(), region->data(), in.data(), -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(TestGpu()->CopyOutThenIn(out.data(), region->data(), in.data(), 0).ok());
}

INSTANTIATE_TEST_SUITE_P(Formats, GpuBindingTest,
                         ::testing::Values(StateFormat::kDamp, StateFormat::kFp32),
                         [](const ::testing::TestParamInfo<StateFormat>& info) {
                           return std::string(FormatName(info.param));  // damp, fp32
                         });

// The entry bound on states (kernels/formats/state_bound.h), as on the CPU
// (cpu_backend_test's PackStatesEnforcesTheStateMagnitudeBound): PackStates
// refuses 3e38 and values beyond 2^64 naming states[i] and writes nothing;
// from a state at the bound, the worst step of the bound's derivation (d_k =
// 256, a Householder key with beta = 2, |v| = 65504, no decay, readout scale
// 2^16) leaves o and the state finite, o[0] = 2^16 * 16 * 2^64 for fp32.
TEST(GpuStateBoundTest, PackStatesEnforcesTheStateMagnitudeBound) {
  STATECACHE_SKIP_WITHOUT_GPU();
  ModelGeometry geo{Arch::kGdn, 1, 1, 1, 256, 32};
  geo.scale = kMaxReadoutScale;
  const int64_t values = int64_t{geo.d_k} * geo.d_v;
  for (const FormatSpec& f : {FormatSpec{StateFormat::kFp32, 0}, FormatSpec{StateFormat::kBf16, 0},
                              FormatSpec{StateFormat::kDamp, 16}}) {
    SCOPED_TRACE(FormatSpecName(f));
    const StateLayout layout = StateLayout::Identity(geo, f).value();
    std::unique_ptr<PreparedModel> model = TestGpu()->Prepare(layout).value();
    DeviceArray pool_arr = DeviceArray::From(std::vector<uint8_t>(2 * layout.slot_bytes(), 0));
    const PoolView pool{pool_arr.ptr<uint8_t>(), 2, 1, 1, layout.head_layout().head_bytes};
    const std::vector<uint8_t> before = pool_arr.To<uint8_t>(2 * layout.slot_bytes());
    DeviceArray d_slot = DeviceArray::From(std::vector<int32_t>{1});
    auto pack = [&](const std::vector<float>& states) {
      DeviceArray d_states = DeviceArray::From(states);
      return TestGpu()->PackStates(*model, pool, d_slot.ptr<int32_t>(), 1,
                                   d_states.ptr<float>());
    };
    for (const auto& [x, at] : {std::pair<float, int64_t>{3e38f, 0},
                                {-std::nextafter(kMaxStateMagnitude, INFINITY), 77},
                                {NAN, 5}}) {
      std::vector<float> states(values, 1.0f);
      states[at] = x;
      const absl::Status s = pack(states);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << x;
      EXPECT_EQ(std::string(s.message()),
                absl::StrCat("states[", at,
                             "]: is not finite or exceeds the state magnitude bound |x| <= 2^64"));
      EXPECT_EQ(pool_arr.To<uint8_t>(before.size()), before);
    }
    ASSERT_TRUE(pack(std::vector<float>(values, kMaxStateMagnitude)).ok());
    std::vector<float> q(geo.d_k, 0.0f), k(geo.d_k, 1.0f / std::sqrt(480.0f));
    q[0] = 1.0f;
    k[0] = -15.0f / std::sqrt(480.0f);
    DeviceArray d_q = DeviceArray::From(q), d_k = DeviceArray::From(k);
    DeviceArray d_v = DeviceArray::From(std::vector<float>(geo.d_v, -kFp16Max));
    DeviceArray d_g = DeviceArray::From(std::vector<float>{0.0f});
    DeviceArray d_beta = DeviceArray::From(std::vector<float>{2.0f});
    DeviceArray d_o = DeviceArray::From(std::vector<float>(geo.d_v, 0.0f));
    DecodeInputs in;
    in.batch = 1;
    in.slots = d_slot.ptr<int32_t>();
    in.q = d_q.ptr<float>();
    in.k = d_k.ptr<float>();
    in.v = d_v.ptr<float>();
    in.g = d_g.ptr<float>();
    in.beta = d_beta.ptr<float>();
    in.o = d_o.ptr<float>();
    ASSERT_TRUE(TestGpu()->DecodeUpdate(*model, pool, 0, in).ok());
    const std::vector<float> o = d_o.To<float>(geo.d_v);
    DeviceArray d_after = DeviceArray::From(std::vector<float>(values, 0.0f));
    ASSERT_TRUE(
        TestGpu()->UnpackStates(*model, pool, d_slot.ptr<int32_t>(), 1, d_after.ptr<float>()).ok());
    const std::vector<float> after = d_after.To<float>(values);
    for (int j = 0; j < geo.d_v; ++j) EXPECT_TRUE(std::isfinite(o[j])) << j << ": " << o[j];
    for (int64_t i = 0; i < values; ++i) ASSERT_TRUE(std::isfinite(after[i])) << i << ": " << after[i];
    if (f.format == StateFormat::kFp32) {
      EXPECT_NEAR(after[0] / kMaxStateMagnitude, 16.0, 1e-3);
      EXPECT_NEAR(o[0] / (kMaxReadoutScale * kMaxStateMagnitude), 16.0, 1e-3);
    }
  }
}

TEST(GpuFactoryTest, DescribesDeviceOrIsUnavailable) {
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateCudaBackend();
  if (!b.ok()) {
    EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
    return;
  }
  EXPECT_STREQ((*b)->name(), "cuda");
  EXPECT_NE((*b)->Describe().find("cuda backend"), std::string::npos);
}

}  // namespace
}  // namespace statecache
