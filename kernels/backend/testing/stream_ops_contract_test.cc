// The StreamOps contract (kernels/backend/stream_ops.h) on one backend:
// ContractBackend() is the CPU backend in //kernels/backend:stream_ops_cpu_test
// (CI) and the CUDA backend in //kernels/cuda:stream_ops_cuda_test (gpu_only;
// skips without a GPU). Every op's bytes and outputs equal the validated
// synchronous binding's; bad inputs write nothing, leave every other slot
// byte-identical and land in the record with the field named.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend/stream_ops.h"
#include "kernels/backend/testing/contract_backend.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"
#include "kernels/testing/test_pool.h"
#include "kernels/testing/token_batch.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

constexpr int kSlots = 6;

ModelGeometry Geo(Arch arch) {
  ModelGeometry g;
  g.arch = arch;
  g.layers = 2;
  g.h_v = 4;
  g.h_qk = arch == Arch::kKda ? 4 : 2;
  g.d_k = 128;
  g.d_v = 128;
  return g;
}

// Backend memory holding a copy of `host`.
template <typename T>
std::unique_ptr<BackendBuffer> Stage(Backend& b, const std::vector<T>& host) {
  auto buf = b.Allocate(std::max<int64_t>(16, host.size() * sizeof(T))).value();
  if (!host.empty()) EXPECT_TRUE(b.CopyIn(buf->data(), host.data(), host.size() * sizeof(T)).ok());
  return buf;
}
template <typename T>
std::vector<T> Fetch(Backend& b, const BackendBuffer& buf, size_t n) {
  std::vector<T> out(n);
  EXPECT_TRUE(b.CopyOut(out.data(), buf.data(), n * sizeof(T)).ok());
  return out;
}

std::vector<float> RandomStates(const ModelGeometry& g, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<float> s(static_cast<size_t>(n) * g.HeadsPerSlot() * g.d_k * g.d_v);
  for (float& x : s) x = d(rng);
  return s;
}

// Device copies of one decode batch's inputs.
struct StagedInputs {
  std::unique_ptr<BackendBuffer> slots, q, k, v, g, beta, o;
  DecodeInputs Decode(int batch) const {
    DecodeInputs in;
    in.batch = batch;
    in.slots = reinterpret_cast<const int32_t*>(slots->data());
    in.q = q->data();
    in.k = k->data();
    in.v = v->data();
    in.g = reinterpret_cast<const float*>(g->data());
    in.beta = reinterpret_cast<const float*>(beta->data());
    in.o = reinterpret_cast<float*>(o->data());
    return in;
  }
  // `tokens` tokens per item (the inputs hold batch * tokens rows), o to `out`.
  PrefillInputs Prefill(int batch, int tokens, float* out) const {
    PrefillInputs p;
    p.batch = batch;
    p.tokens = tokens;
    p.slots = reinterpret_cast<const int32_t*>(slots->data());
    p.q = q->data();
    p.k = k->data();
    p.v = v->data();
    p.g = reinterpret_cast<const float*>(g->data());
    p.beta = reinterpret_cast<const float*>(beta->data());
    p.o = out;
    return p;
  }
};
StagedInputs StageInputs(Backend& b, const TokenBatch& t, const std::vector<int32_t>& slots,
                         const ModelGeometry& g) {
  StagedInputs s;
  s.slots = Stage(b, slots);
  s.q = Stage(b, t.q);
  s.k = Stage(b, t.k);
  s.v = Stage(b, t.v);
  s.g = Stage(b, t.g);
  s.beta = Stage(b, t.beta);
  s.o = Stage(b, std::vector<float>(slots.size() * g.h_v * g.d_v, 0.0f));
  return s;
}

// A record sized for the pool, initialized on the default stream.
struct Record {
  std::unique_ptr<BackendBuffer> buf;
  OpRecord rec;
};
Record MakeRecord(Backend& b, int64_t num_slots) {
  Record r;
  StreamOps& ops = b.stream_ops();
  r.buf = b.Allocate(ops.RecordBytes(num_slots)).value();
  r.rec = OpRecord{r.buf->data(), ops.RecordBytes(num_slots)};
  EXPECT_TRUE(ops.InitRecord(r.rec, nullptr).ok());
  return r;
}

class StreamOpsContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (ContractBackend() == nullptr) GTEST_SKIP() << "backend unavailable";
  }
  Backend& B() { return *ContractBackend(); }
  StateLayout Layout(Arch arch) {
    return StateLayout::Identity(Geo(arch), ParseFormatSpec(GetParam()).value()).value();
  }
};

TEST_P(StreamOpsContract, DecodeEqualsTheValidatedBindingWithPadding) {
  for (Arch arch : {Arch::kGdn, Arch::kKda}) {
    const StateLayout layout = Layout(arch);
    const ModelGeometry g = layout.geometry();
    TestPool a = MakeTestPool(B(), layout, kSlots);
    TestPool b = MakeTestPool(B(), layout, kSlots);
    const std::vector<float> states = RandomStates(g, kSlots, 3);
    auto all = Stage(B(), std::vector<int32_t>{0, 1, 2, 3, 4, 5});
    auto st = Stage(B(), states);
    const auto* all_p = reinterpret_cast<const int32_t*>(all->data());
    ASSERT_TRUE(B().PackStates(*a.model, a.view, all_p, kSlots, (const float*)st->data()).ok());
    ASSERT_TRUE(B().PackStates(*b.model, b.view, all_p, kSlots, (const float*)st->data()).ok());
    Record r = MakeRecord(B(), kSlots);
    const std::vector<int32_t> slots = {4, -1, 0, 2};
    for (int step = 0; step < 3; ++step) {
      const TokenBatch t = RandomTokenBatch(g, 4, 10 + step);
      StagedInputs sa = StageInputs(B(), t, slots, g);
      StagedInputs sb = StageInputs(B(), t, slots, g);
      for (int layer = 0; layer < g.layers; ++layer) {
        ASSERT_TRUE(B().DecodeUpdate(*a.model, a.view, layer, sa.Decode(4)).ok());
        ASSERT_TRUE(B().stream_ops()
                        .EnqueueDecode(*b.model, b.view, layer, sb.Decode(4), r.rec, nullptr)
                        .ok());
        EXPECT_TRUE(B().stream_ops().CheckRecord(r.rec, nullptr, true).ok());
        const size_t on = 4 * g.h_v * g.d_v;
        const std::vector<float> oa = Fetch<float>(B(), *sa.o, on);
        const std::vector<float> ob = Fetch<float>(B(), *sb.o, on);
        ASSERT_EQ(0, std::memcmp(oa.data(), ob.data(), on * 4)) << "o, layer " << layer;
        for (int i = g.h_v * g.d_v; i < 2 * g.h_v * g.d_v; ++i) ASSERT_EQ(ob[i], 0.0f);
      }
      ASSERT_EQ(a.Bytes(), b.Bytes()) << "step " << step;
    }
  }
}

TEST_P(StreamOpsContract, PrefillPackUnpackEqualTheValidatedBindings) {
  const StateLayout layout = Layout(Arch::kGdn);
  const ModelGeometry g = layout.geometry();
  TestPool a = MakeTestPool(B(), layout, kSlots);
  TestPool b = MakeTestPool(B(), layout, kSlots);
  Record r = MakeRecord(B(), kSlots);
  StreamOps& ops = B().stream_ops();
  const std::vector<int32_t> slots = {1, 5, -1};
  auto sl = Stage(B(), slots);
  const auto* sl_p = reinterpret_cast<const int32_t*>(sl->data());
  auto st = Stage(B(), RandomStates(g, 3, 4));
  ASSERT_TRUE(B().PackStates(*a.model, a.view, sl_p, 3, (const float*)st->data()).ok());
  ASSERT_TRUE(ops.EnqueuePack(*b.model, b.view, sl_p, 3, (const float*)st->data(), r.rec, nullptr)
                  .ok());
  ASSERT_TRUE(ops.CheckRecord(r.rec, nullptr, true).ok());
  ASSERT_EQ(a.Bytes(), b.Bytes());

  const int tokens = 5;
  const TokenBatch t = RandomTokenBatch(g, 3 * tokens, 7);
  StagedInputs in = StageInputs(B(), t, slots, g);
  auto oa = Stage(B(), std::vector<float>(3 * tokens * g.h_v * g.d_v, 0.0f));
  auto ob = Stage(B(), std::vector<float>(3 * tokens * g.h_v * g.d_v, 0.0f));
  ASSERT_TRUE(B().Prefill(*a.model, a.view, 1, in.Prefill(3, tokens, (float*)oa->data())).ok());
  ASSERT_TRUE(ops.EnqueuePrefill(*b.model, b.view, 1, in.Prefill(3, tokens, (float*)ob->data()),
                                 r.rec, nullptr)
                  .ok());
  ASSERT_TRUE(ops.CheckRecord(r.rec, nullptr, true).ok());
  ASSERT_EQ(a.Bytes(), b.Bytes());
  const size_t on = 3 * tokens * g.h_v * g.d_v;
  EXPECT_EQ(Fetch<float>(B(), *oa, on), Fetch<float>(B(), *ob, on));

  const size_t sn = 3 * static_cast<size_t>(g.HeadsPerSlot()) * g.d_k * g.d_v;
  auto ua = Stage(B(), std::vector<float>(sn, 1.0f));
  auto ub = Stage(B(), std::vector<float>(sn, 1.0f));
  ASSERT_TRUE(B().UnpackStates(*a.model, a.view, sl_p, 3, (float*)ua->data()).ok());
  ASSERT_TRUE(ops.EnqueueUnpack(*b.model, b.view, sl_p, 3, (float*)ub->data(), r.rec, nullptr).ok());
  ASSERT_TRUE(ops.CheckRecord(r.rec, nullptr, true).ok());
  const std::vector<float> ux = Fetch<float>(B(), *ub, sn);
  EXPECT_EQ(Fetch<float>(B(), *ua, sn), ux);
  for (size_t i = 2 * sn / 3; i < sn; ++i) ASSERT_EQ(ux[i], 0.0f) << "padding unpacks to zeros";
}

TEST_P(StreamOpsContract, CopySlotsFansOutAndSkipsPadding) {
  const StateLayout layout = Layout(Arch::kGdn);
  const ModelGeometry g = layout.geometry();
  TestPool b = MakeTestPool(B(), layout, kSlots);
  Record r = MakeRecord(B(), kSlots);
  auto all = Stage(B(), std::vector<int32_t>{0, 1, 2, 3, 4, 5});
  auto st = Stage(B(), RandomStates(g, kSlots, 5));
  ASSERT_TRUE(B().PackStates(*b.model, b.view, (const int32_t*)all->data(), kSlots,
                             (const float*)st->data())
                  .ok());
  const std::vector<uint8_t> before = b.Bytes();
  auto src = Stage(B(), std::vector<int32_t>{0, 0, -1, 1});
  auto dst = Stage(B(), std::vector<int32_t>{3, 4, 5, -1});
  ASSERT_TRUE(B().stream_ops()
                  .EnqueueCopySlots(b.view, (const int32_t*)src->data(),
                                    (const int32_t*)dst->data(), 4, r.rec, nullptr)
                  .ok());
  ASSERT_TRUE(B().stream_ops().CheckRecord(r.rec, nullptr, true).ok());
  const std::vector<uint8_t> after = b.Bytes();
  const int64_t sb = b.view.slot_bytes();
  const auto slot = [&](const std::vector<uint8_t>& v, int s) {
    return std::vector<uint8_t>(v.begin() + s * sb, v.begin() + (s + 1) * sb);
  };
  EXPECT_EQ(slot(after, 3), slot(before, 0));
  EXPECT_EQ(slot(after, 4), slot(before, 0));
  for (int s : {0, 1, 2, 5}) EXPECT_EQ(slot(after, s), slot(before, s)) << "slot " << s;
}

// A pool whose slots lie inside bigger records (PoolView::slot_stride, an
// engine's state pages): every op gives the packed pool's bytes and outputs,
// and the bytes between slots are never touched.
TEST_P(StreamOpsContract, StridedPoolEqualsAPackedPoolAndLeavesTheGapsAlone) {
  for (Arch arch : {Arch::kGdn, Arch::kKda}) {
    const StateLayout layout = Layout(arch);
    const ModelGeometry g = layout.geometry();
    TestPool a = MakeTestPool(B(), layout, kSlots);
    const int64_t sb = a.view.slot_bytes();
    const int64_t stride = sb + 640;  // keeps 128-byte rows when sb has them
    const uint8_t kGap = 0x5a;
    auto mem = Stage(B(), std::vector<uint8_t>(kSlots * stride, kGap));
    PoolView b = a.view;
    b.base = mem->data();
    b.slot_stride = stride;
    const PoolView* const both[] = {&a.view, &b};
    StreamOps& ops = B().stream_ops();
    Record r = MakeRecord(B(), kSlots);
    auto all = Stage(B(), std::vector<int32_t>{0, 1, 2, 3, 4, 5});
    auto st = Stage(B(), RandomStates(g, kSlots, 21));
    const auto* all_p = reinterpret_cast<const int32_t*>(all->data());
    for (const PoolView* v : both) {
      ASSERT_TRUE(ops.EnqueuePack(*a.model, *v, all_p, kSlots, (const float*)st->data(), r.rec,
                                  nullptr)
                      .ok());
    }
    const std::vector<int32_t> slots = {4, -1, 0, 2};
    for (int step = 0; step < 2; ++step) {
      const TokenBatch t = RandomTokenBatch(g, 4, 30 + step);
      StagedInputs sa = StageInputs(B(), t, slots, g);
      StagedInputs sbi = StageInputs(B(), t, slots, g);
      for (int layer = 0; layer < g.layers; ++layer) {
        ASSERT_TRUE(ops.EnqueueDecode(*a.model, a.view, layer, sa.Decode(4), r.rec, nullptr).ok());
        ASSERT_TRUE(ops.EnqueueDecode(*a.model, b, layer, sbi.Decode(4), r.rec, nullptr).ok());
        ASSERT_TRUE(ops.CheckRecord(r.rec, nullptr, true).ok());
        const size_t on = 4 * g.h_v * g.d_v;
        ASSERT_EQ(Fetch<float>(B(), *sa.o, on), Fetch<float>(B(), *sbi.o, on))
            << "o, layer " << layer;
      }
    }
    const int tokens = 3;
    const TokenBatch t = RandomTokenBatch(g, 3 * tokens, 40);
    StagedInputs in = StageInputs(B(), t, {1, 5, -1}, g);
    const size_t pon = 3 * tokens * g.h_v * g.d_v;
    auto oa = Stage(B(), std::vector<float>(pon, 0.0f));
    auto ob = Stage(B(), std::vector<float>(pon, 0.0f));
    ASSERT_TRUE(ops.EnqueuePrefill(*a.model, a.view, 1, in.Prefill(3, tokens, (float*)oa->data()),
                                   r.rec, nullptr)
                    .ok());
    ASSERT_TRUE(
        ops.EnqueuePrefill(*a.model, b, 1, in.Prefill(3, tokens, (float*)ob->data()), r.rec, nullptr)
            .ok());
    auto src = Stage(B(), std::vector<int32_t>{0, -1});
    auto dst = Stage(B(), std::vector<int32_t>{3, 2});
    for (const PoolView* v : both) {
      ASSERT_TRUE(ops.EnqueueCopySlots(*v, (const int32_t*)src->data(),
                                       (const int32_t*)dst->data(), 2, r.rec, nullptr)
                      .ok());
    }
    const size_t sn = 3 * static_cast<size_t>(g.HeadsPerSlot()) * g.d_k * g.d_v;
    auto ua = Stage(B(), std::vector<float>(sn, 1.0f));
    auto ub = Stage(B(), std::vector<float>(sn, 1.0f));
    auto usl = Stage(B(), std::vector<int32_t>{3, 5, -1});
    const auto* usl_p = reinterpret_cast<const int32_t*>(usl->data());
    ASSERT_TRUE(ops.EnqueueUnpack(*a.model, a.view, usl_p, 3, (float*)ua->data(), r.rec, nullptr)
                    .ok());
    ASSERT_TRUE(ops.EnqueueUnpack(*a.model, b, usl_p, 3, (float*)ub->data(), r.rec, nullptr).ok());
    ASSERT_TRUE(ops.CheckRecord(r.rec, nullptr, true).ok());
    EXPECT_EQ(Fetch<float>(B(), *oa, pon), Fetch<float>(B(), *ob, pon));
    EXPECT_EQ(Fetch<float>(B(), *ua, sn), Fetch<float>(B(), *ub, sn));

    const std::vector<uint8_t> packed = a.Bytes();
    const std::vector<uint8_t> strided = Fetch<uint8_t>(B(), *mem, kSlots * stride);
    for (int s = 0; s < kSlots; ++s) {
      const uint8_t* got = strided.data() + s * stride;
      ASSERT_EQ(0, std::memcmp(got, packed.data() + s * sb, sb)) << "slot " << s;
      for (int64_t i = sb; i < stride; ++i) {
        ASSERT_EQ(got[i], kGap) << "gap byte " << i << " after slot " << s;
      }
    }
  }
}

// One bad call: nothing written, the record names op, layer and field.
struct BadCase {
  const char* what;
  std::vector<int32_t> slots;
  int poison;  // 0 none, 1 q NaN, 2 v inf, 3 g > 0, 4 beta 3
  const char* expect;
};

TEST_P(StreamOpsContract, BadDecodeInputsWriteNothingAndAreRecorded) {
  const StateLayout layout = Layout(Arch::kGdn);
  const ModelGeometry g = layout.geometry();
  TestPool b = MakeTestPool(B(), layout, kSlots);
  auto all = Stage(B(), std::vector<int32_t>{0, 1, 2, 3, 4, 5});
  auto st = Stage(B(), RandomStates(g, kSlots, 6));
  ASSERT_TRUE(B().PackStates(*b.model, b.view, (const int32_t*)all->data(), kSlots,
                             (const float*)st->data())
                  .ok());
  Record r = MakeRecord(B(), kSlots);
  StreamOps& ops = B().stream_ops();
  const std::vector<BadCase> cases = {
      {"slot range", {0, 6}, 0, "decode layer 1: slots[1]: 6 is outside 0..5"},
      {"negative slot", {-2, 1}, 0, "decode layer 1: slots[0]: -2 is outside 0..5"},
      {"duplicate", {3, 3}, 0, "decode layer 1: slots[1]: slot 3 appears twice"},
      {"nan q", {0, 1}, 1, "decode layer 1: q[5]"},
      {"inf v", {0, 1}, 2, "decode layer 1: v[7]"},
      {"positive g", {0, 1}, 3, "decode layer 1: g[1]"},
      {"beta", {0, 1}, 4, "decode layer 1: beta[2]"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    TokenBatch t = RandomTokenBatch(g, 2, 21);
    if (c.poison == 1) t.q[5] = std::numeric_limits<float>::quiet_NaN();
    if (c.poison == 2) t.v[7] = std::numeric_limits<float>::infinity();
    if (c.poison == 3) t.g[1] = 0.5f;
    if (c.poison == 4) t.beta[2] = 3.0f;
    StagedInputs in = StageInputs(B(), t, c.slots, g);
    const std::vector<float> o_before = Fetch<float>(B(), *in.o, 2 * g.h_v * g.d_v);
    const std::vector<uint8_t> before = b.Bytes();
    ASSERT_TRUE(ops.EnqueueDecode(*b.model, b.view, 1, in.Decode(2), r.rec, nullptr).ok());
    // A valid call after the bad one still runs (the record keeps the first).
    const std::vector<int32_t> ok_slots = {5};
    StagedInputs good = StageInputs(B(), RandomTokenBatch(g, 1, 22), ok_slots, g);
    ASSERT_TRUE(ops.EnqueueDecode(*b.model, b.view, 0, good.Decode(1), r.rec, nullptr).ok());
    const absl::Status s = ops.CheckRecord(r.rec, nullptr, /*reset=*/true);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expect));
    EXPECT_THAT(std::string(s.message()), HasSubstr("(1 call failed"));
    const std::vector<uint8_t> after = b.Bytes();
    const int64_t sb = b.view.slot_bytes();
    EXPECT_EQ(0, std::memcmp(before.data(), after.data(), 5 * sb)) << "slots 0..4 untouched";
    EXPECT_NE(0, std::memcmp(before.data() + 5 * sb, after.data() + 5 * sb, sb)) << "slot 5 ran";
    EXPECT_EQ(Fetch<float>(B(), *in.o, 2 * g.h_v * g.d_v), o_before) << "o untouched";
    EXPECT_TRUE(ops.CheckRecord(r.rec, nullptr, true).ok()) << "reset";
  }
}

// A failing decode of many items per CTA (1,200 heads, every 7th entry
// padding; on CUDA more items than the persistent kernels' CTAs hold in
// their stages, so copies are in flight when the verdict arrives, and for
// KDA the producers' gate copies too), the bad value in the last item:
// nothing is written to the pool or o, and the next call runs normally.
TEST_P(StreamOpsContract, BadDecodeOfManyItemsWritesNothing) {
  for (Arch arch : {Arch::kGdn, Arch::kKda}) {
    SCOPED_TRACE(arch == Arch::kGdn ? "gdn" : "kda");
    ModelGeometry g = Geo(arch);
    g.layers = 1;
    const StateLayout layout =
        StateLayout::Identity(g, ParseFormatSpec(GetParam()).value()).value();
    constexpr int kPool = 320, kBatch = 300;
    TestPool b = MakeTestPool(B(), layout, kPool);
    std::vector<int32_t> slots(kBatch);
    for (int i = 0; i < kBatch; ++i) slots[i] = i % 7 == 3 ? -1 : (i * 13) % kPool;
    Record r = MakeRecord(B(), kPool);
    StreamOps& ops = B().stream_ops();
    TokenBatch t = RandomTokenBatch(g, kBatch, 31);
    t.beta[t.beta.size() - 1] = -1.0f;
    StagedInputs in = StageInputs(B(), t, slots, g);
    const size_t on = size_t{kBatch} * g.h_v * g.d_v;
    std::vector<float> sentinel(on, 7.0f);
    ASSERT_TRUE(B().CopyIn(in.o->data(), sentinel.data(), on * 4).ok());
    const std::vector<uint8_t> before = b.Bytes();
    ASSERT_TRUE(ops.EnqueueDecode(*b.model, b.view, 0, in.Decode(kBatch), r.rec, nullptr).ok());
    const absl::Status s = ops.CheckRecord(r.rec, nullptr, /*reset=*/true);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("beta[", t.beta.size() - 1, "]")));
    EXPECT_TRUE(b.Bytes() == before) << "the pool was written";
    EXPECT_EQ(Fetch<float>(B(), *in.o, on), sentinel) << "o was written";
    // The same batch, valid: runs, writes o (padding rows zero) and the pool.
    t.beta[t.beta.size() - 1] = 0.5f;
    StagedInputs ok = StageInputs(B(), t, slots, g);
    ASSERT_TRUE(B().CopyIn(ok.o->data(), sentinel.data(), on * 4).ok());
    ASSERT_TRUE(ops.EnqueueDecode(*b.model, b.view, 0, ok.Decode(kBatch), r.rec, nullptr).ok());
    EXPECT_TRUE(ops.CheckRecord(r.rec, nullptr, true).ok());
    EXPECT_FALSE(b.Bytes() == before) << "the valid call wrote nothing";
    const std::vector<float> o = Fetch<float>(B(), *ok.o, on);
    for (int i = 0; i < kBatch; ++i) {
      const float x = o[size_t{i} * g.h_v * g.d_v];
      if (slots[i] < 0) {
        EXPECT_EQ(x, 0.0f) << "padding row " << i;
      } else {
        EXPECT_NE(x, 7.0f) << "row " << i << " not written";
      }
    }
  }
}

TEST_P(StreamOpsContract, BadPackAndCopyAreRecordedAndCounted) {
  const StateLayout layout = Layout(Arch::kGdn);
  const ModelGeometry g = layout.geometry();
  TestPool b = MakeTestPool(B(), layout, kSlots);
  Record r = MakeRecord(B(), kSlots);
  StreamOps& ops = B().stream_ops();
  std::vector<float> states = RandomStates(g, 2, 8);
  states[9] = std::numeric_limits<float>::quiet_NaN();
  auto st = Stage(B(), states);
  auto sl = Stage(B(), std::vector<int32_t>{2, 3});
  const std::vector<uint8_t> before = b.Bytes();
  ASSERT_TRUE(ops.EnqueuePack(*b.model, b.view, (const int32_t*)sl->data(), 2,
                              (const float*)st->data(), r.rec, nullptr)
                  .ok());
  auto src = Stage(B(), std::vector<int32_t>{0, 1});
  auto dup = Stage(B(), std::vector<int32_t>{4, 4});
  ASSERT_TRUE(ops.EnqueueCopySlots(b.view, (const int32_t*)src->data(),
                                   (const int32_t*)dup->data(), 2, r.rec, nullptr)
                  .ok());
  absl::Status s = ops.CheckRecord(r.rec, nullptr, true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("pack: states[9]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("(2 calls failed"));
  EXPECT_EQ(b.Bytes(), before);

  std::vector<float> huge = RandomStates(g, 2, 9);
  huge[11] = 3e38f;  // finite, beyond the state magnitude bound
  auto hs = Stage(B(), huge);
  ASSERT_TRUE(ops.EnqueuePack(*b.model, b.view, (const int32_t*)sl->data(), 2,
                              (const float*)hs->data(), r.rec, nullptr)
                  .ok());
  s = ops.CheckRecord(r.rec, nullptr, true);
  EXPECT_THAT(std::string(s.message()), HasSubstr("pack: states[11]"));
  EXPECT_EQ(b.Bytes(), before);

  auto dst_src = Stage(B(), std::vector<int32_t>{1, 3});
  ASSERT_TRUE(ops.EnqueueCopySlots(b.view, (const int32_t*)src->data(),
                                   (const int32_t*)dst_src->data(), 2, r.rec, nullptr)
                  .ok());
  s = ops.CheckRecord(r.rec, nullptr, true);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("copy_slots: dst_slots[0]: slot 1 is also a source of this call"));
  auto far = Stage(B(), std::vector<int32_t>{3, 9});
  ASSERT_TRUE(ops.EnqueueCopySlots(b.view, (const int32_t*)src->data(),
                                   (const int32_t*)far->data(), 2, r.rec, nullptr)
                  .ok());
  s = ops.CheckRecord(r.rec, nullptr, true);
  EXPECT_THAT(std::string(s.message()), HasSubstr("copy_slots: dst_slots[1]: 9 is outside 0..5"));
  EXPECT_EQ(b.Bytes(), before);
}

TEST_P(StreamOpsContract, AFencedPoolIsNeverWritten) {
  const StateLayout layout = Layout(Arch::kGdn);
  const ModelGeometry g = layout.geometry();
  TestPool b = MakeTestPool(B(), layout, kSlots);
  Record r = MakeRecord(B(), kSlots);
  StreamOps& ops = B().stream_ops();
  auto fence = Stage(B(), std::vector<int32_t>{0, 0, 0, 0});
  PoolView view = b.view;
  view.fence = reinterpret_cast<const int32_t*>(fence->data());
  StagedInputs in = StageInputs(B(), RandomTokenBatch(g, 1, 3), {2}, g);
  const std::vector<uint8_t> before = b.Bytes();
  ASSERT_TRUE(ops.EnqueueDecode(*b.model, view, 0, in.Decode(1), r.rec, nullptr).ok());
  ASSERT_TRUE(ops.CheckRecord(r.rec, nullptr, true).ok()) << "an open fence lets calls run";
  const std::vector<uint8_t> updated = b.Bytes();
  EXPECT_NE(updated, before);
  ASSERT_TRUE(B().CopyIn(fence->data(), std::vector<int32_t>{1}.data(), 4).ok());
  ASSERT_TRUE(ops.EnqueueDecode(*b.model, view, 0, in.Decode(1), r.rec, nullptr).ok());
  auto src = Stage(B(), std::vector<int32_t>{2});
  auto dst = Stage(B(), std::vector<int32_t>{3});
  ASSERT_TRUE(ops.EnqueueCopySlots(view, (const int32_t*)src->data(), (const int32_t*)dst->data(),
                                   1, r.rec, nullptr)
                  .ok());
  const absl::Status s = ops.CheckRecord(r.rec, nullptr, true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("decode layer 0: pool: fenced"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("(2 calls failed"));
  EXPECT_EQ(b.Bytes(), updated);
}

TEST_P(StreamOpsContract, HostMistakesFailAtOnce) {
  const StateLayout layout = Layout(Arch::kGdn);
  TestPool b = MakeTestPool(B(), layout, kSlots);
  Record r = MakeRecord(B(), kSlots);
  StreamOps& ops = B().stream_ops();
  StagedInputs in = StageInputs(B(), RandomTokenBatch(layout.geometry(), 1, 2), {0},
                                layout.geometry());
  DecodeInputs d = in.Decode(1);
  d.q = nullptr;
  absl::Status s = ops.EnqueueDecode(*b.model, b.view, 0, d, r.rec, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("q: null"));
  s = ops.EnqueueDecode(*b.model, b.view, 2, in.Decode(1), r.rec, nullptr);
  EXPECT_THAT(std::string(s.message()), HasSubstr("layer: 2 is outside 0..1"));
  OpRecord small = r.rec;
  small.bytes = ops.RecordBytes(kSlots) - 4;
  if (small.bytes >= ops.RecordBytes(0)) {
    s = ops.EnqueueDecode(*b.model, b.view, 0, in.Decode(1), small, nullptr);
    EXPECT_THAT(std::string(s.message()), HasSubstr("record: "));
  }
  small.bytes = 0;
  s = ops.CheckRecord(small, nullptr, false);
  EXPECT_THAT(std::string(s.message()), HasSubstr("record: "));
  EXPECT_TRUE(ops.CheckRecord(r.rec, nullptr, false).ok()) << "nothing was recorded";
}

INSTANTIATE_TEST_SUITE_P(Formats, StreamOpsContract,
                         ::testing::Values("fp32", "bf16", "int8-hadamard", "damp:16", "damp-sr:16"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& c : n) {
                             if (c == '-' || c == ':') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace statecache
