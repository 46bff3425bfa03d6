// End-to-end tests of statecached on loopback: a real StateCacheServer on an
// ephemeral port with the CPU backend, driven through the C++ client library,
// compared bit for bit with the CPU backend called in process on the same
// inputs.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/cpp/statecache_client.h"
#include "kernels/backend/backend.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/formats/numeric.h"
#include "kernels/formats/state_bound.h"
#include "server/core/log.h"
#include "server/loopback.h"
#include "server/pool/prefix_key.h"
#include "server/server.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] = "tiny-gdn";

constexpr float kHuge32 = 3e38f;

ModelGeometry TinyGdn() {
  return ModelGeometry{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};
}
ModelGeometry TinyKda() {
  return ModelGeometry{Arch::kKda, /*layers=*/2, /*h_qk=*/2, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};
}

// Inputs of one layer for B slots and T tokens, in the Backend's layouts.
struct Inputs {
  std::vector<float> q, k, v, g, beta;
  std::vector<uint16_t> q16, k16, v16;  // bf16 / fp16 copies when dtype != fp32
};

Inputs MakeInputs(const ModelGeometry& geo, int batch, int tokens, std::mt19937* rng,
                  DType dtype = DType::kFp32) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.05f, 0.95f);
  Inputs in;
  const int64_t rows = int64_t{batch} * tokens;
  auto unit_vectors = [&](std::vector<float>* out, int64_t n, int dim) {
    out->resize(n * dim);
    for (int64_t i = 0; i < n; ++i) {
      double norm = 0;
      for (int j = 0; j < dim; ++j) {
        (*out)[i * dim + j] = normal(*rng);
        norm += (*out)[i * dim + j] * (*out)[i * dim + j];
      }
      for (int j = 0; j < dim; ++j) (*out)[i * dim + j] /= static_cast<float>(std::sqrt(norm));
    }
  };
  unit_vectors(&in.q, rows * geo.h_qk, geo.d_k);
  unit_vectors(&in.k, rows * geo.h_qk, geo.d_k);
  in.v.resize(rows * geo.h_v * geo.d_v);
  for (float& x : in.v) x = normal(*rng);
  in.g.resize(rows * geo.h_v * geo.GateWidth());
  for (float& x : in.g) x = -0.3f * unit(*rng);
  in.beta.resize(rows * geo.h_v);
  for (float& x : in.beta) x = unit(*rng);
  if (dtype != DType::kFp32) {
    auto convert = [dtype](const std::vector<float>& src, std::vector<uint16_t>* dst,
                           std::vector<float>* rounded) {
      dst->resize(src.size());
      for (size_t i = 0; i < src.size(); ++i) {
        (*dst)[i] = dtype == DType::kBf16 ? FloatToBf16Bits(src[i]) : FloatToHalfBits(src[i]);
      }
      (void)rounded;
    };
    convert(in.q, &in.q16, nullptr);
    convert(in.k, &in.k16, nullptr);
    convert(in.v, &in.v16, nullptr);
  }
  return in;
}

HostTensor Tensor(DType dtype, const std::vector<float>& f32, const std::vector<uint16_t>& f16) {
  return dtype == DType::kFp32 ? HostTensor::Fp32(f32) : HostTensor::Half(dtype, f16);
}

// The CPU backend in process, with its own arena: the reference.
class Reference {
 public:
  Reference(const StateLayout& layout, int slots) : layout_(layout) {
    backend_ = CreateBackend("cpu").value();
    model_ = backend_->Prepare(layout).value();
    view_.layers = layout.geometry().layers;
    view_.heads = layout.geometry().h_v;
    view_.head_bytes = layout.head_layout().head_bytes;
    view_.num_slots = slots;
    arena_ = backend_->Allocate(view_.slot_bytes() * slots).value();
    view_.base = arena_->data();
  }

  std::vector<float> Update(int layer, const std::vector<int32_t>& slots, const Inputs& in,
                            DType dtype) {
    const ModelGeometry& g = layout_.geometry();
    std::vector<float> o(slots.size() * g.h_v * g.d_v);
    DecodeInputs d;
    d.batch = static_cast<int>(slots.size());
    d.slots = slots.data();
    d.dtype = dtype;
    d.q = dtype == DType::kFp32 ? static_cast<const void*>(in.q.data()) : in.q16.data();
    d.k = dtype == DType::kFp32 ? static_cast<const void*>(in.k.data()) : in.k16.data();
    d.v = dtype == DType::kFp32 ? static_cast<const void*>(in.v.data()) : in.v16.data();
    d.g = in.g.data();
    d.beta = in.beta.data();
    d.o = o.data();
    absl::Status s = backend_->DecodeUpdate(*model_, view_, layer, d);
    EXPECT_TRUE(s.ok()) << s;
    return o;
  }

  std::vector<float> Prefill(int layer, const std::vector<int32_t>& slots, int tokens,
                             const Inputs& in) {
    const ModelGeometry& g = layout_.geometry();
    std::vector<float> o(slots.size() * tokens * g.h_v * g.d_v);
    PrefillInputs p;
    p.batch = static_cast<int>(slots.size());
    p.tokens = tokens;
    p.slots = slots.data();
    p.q = in.q.data();
    p.k = in.k.data();
    p.v = in.v.data();
    p.g = in.g.data();
    p.beta = in.beta.data();
    p.o = o.data();
    absl::Status s = backend_->Prefill(*model_, view_, layer, p);
    EXPECT_TRUE(s.ok()) << s;
    return o;
  }

  void Pack(const std::vector<int32_t>& slots, const std::vector<float>& states) {
    ASSERT_TRUE(backend_->PackStates(*model_, view_, slots.data(), static_cast<int>(slots.size()),
                                     states.data())
                    .ok());
  }

  std::string SlotBytes(int32_t slot) const {
    return std::string(reinterpret_cast<const char*>(view_.slot(slot)), view_.slot_bytes());
  }

 private:
  StateLayout layout_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<PreparedModel> model_;
  std::unique_ptr<BackendBuffer> arena_;
  PoolView view_;
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

class E2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { SetLoggingEnabled(false); }

  void SetUp() override {
    StateCacheServer::Options options = LoopbackOptions(4 << 20, 2 << 20);
    auto server = StateCacheServer::Create(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    client_ = Connect();
  }

  std::unique_ptr<StateCacheClient> Connect() {
    auto client = StateCacheClient::Connect(LoopbackTarget(*server_));
    EXPECT_TRUE(client.ok());
    EXPECT_TRUE((*client)->WaitForReady(absl::Seconds(5)).ok());
    return std::move(*client);
  }

  // Registers kModel with `format` and explicit counts.
  v1::ModelInfo Register(const std::string& id, const ModelGeometry& geo, const std::string& format,
                         int slots, int checkpoints) {
    ModelRegistration r;
    r.model_id = id;
    r.geometry = geo;
    r.format = format;
    r.slots = slots;
    r.checkpoints = checkpoints;
    auto info = client_->RegisterModel(r);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? *info : v1::ModelInfo();
  }

  UpdateCall Call(int layer, const std::vector<SlotHandle>& slots, const Inputs& in,
                  DType dtype = DType::kFp32) {
    UpdateCall c;
    c.layer = layer;
    c.slots = slots;
    c.q = Tensor(dtype, in.q, in.q16);
    c.k = Tensor(dtype, in.k, in.k16);
    c.v = Tensor(dtype, in.v, in.v16);
    c.g = in.g;
    c.beta = in.beta;
    return c;
  }

  std::unique_ptr<StateCacheServer> server_;
  std::unique_ptr<StateCacheClient> client_;
};

TEST_F(E2eTest, HealthAndModelsLifecycle) {
  auto health = client_->CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_TRUE(*health);
  auto service_health = client_->CheckHealth("statecache.v1.StateCache");
  ASSERT_TRUE(service_health.ok()) << service_health.status();
  EXPECT_TRUE(*service_health);
  EXPECT_EQ(client_->CheckHealth("no.such.Service").status().code(), absl::StatusCode::kNotFound);
  const v1::ModelInfo info = Register(kModel, TinyGdn(), "damp:8", 4, 2);
  EXPECT_EQ(info.format(), "damp:8");
  EXPECT_EQ(info.stats().slot_capacity(), 4);
  EXPECT_EQ(info.stats().checkpoint_capacity(), 2);
  const StateLayout layout =
      StateLayout::Identity(TinyGdn(), ParseFormatSpec("damp:8").value()).value();
  EXPECT_EQ(info.slot_bytes(), layout.slot_bytes());
  EXPECT_EQ(info.tags().layout_fingerprint(), layout.Fingerprint());
  EXPECT_EQ(info.head_bytes().total(), layout.head_layout().head_bytes);
  auto models = client_->ListModels();
  ASSERT_TRUE(models.ok());
  ASSERT_EQ(models->size(), 1u);
  EXPECT_EQ((*models)[0].model_id(), kModel);
  EXPECT_TRUE(client_->DropModel(kModel).ok());
  EXPECT_EQ(client_->DescribeModel(kModel).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(server_->registry().state_reserved_bytes(), 0);
}

// The main scenario of issue 6: allocate, prefill, 100 updates, snapshot,
// release, restore into a new slot, continue - bit-identical to the CPU
// backend in process.
TEST_F(E2eTest, PrefillUpdatesSnapshotRestoreMatchInProcessBackendBitForBit) {
  const ModelGeometry geo = TinyGdn();
  Register(kModel, geo, "damp:8", 4, 2);
  const StateLayout layout =
      StateLayout::Identity(geo, ParseFormatSpec("damp:8").value()).value();
  Reference ref(layout, 2);
  std::mt19937 rng(42);

  auto slots = client_->AllocateSlots(kModel, 2);
  ASSERT_TRUE(slots.ok()) << slots.status();
  std::vector<SlotHandle> live = *slots;
  const std::vector<int32_t> ref_slots = {0, 1};

  // Prefill 8 tokens per layer.
  constexpr int kPrompt = 8;
  for (int layer = 0; layer < geo.layers; ++layer) {
    Inputs in = MakeInputs(geo, 2, kPrompt, &rng);
    PrefillCall p;
    p.layer = layer;
    p.tokens = kPrompt;
    p.slots = live;
    p.q = HostTensor::Fp32(in.q);
    p.k = HostTensor::Fp32(in.k);
    p.v = HostTensor::Fp32(in.v);
    p.g = in.g;
    p.beta = in.beta;
    p.want_output = true;
    auto o = client_->Prefill(kModel, p);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_TRUE(SameBits(*o, ref.Prefill(layer, ref_slots, kPrompt, in))) << "layer " << layer;
  }
  // 100 decode steps.
  std::vector<int32_t> tokens(kPrompt);
  for (int i = 0; i < kPrompt; ++i) tokens[i] = 1000 + i;
  for (int step = 0; step < 100; ++step) {
    for (int layer = 0; layer < geo.layers; ++layer) {
      Inputs in = MakeInputs(geo, 2, 1, &rng);
      auto o = client_->Update(kModel, Call(layer, live, in));
      ASSERT_TRUE(o.ok()) << o.status();
      ASSERT_TRUE(SameBits(*o, ref.Update(layer, ref_slots, in, DType::kFp32)))
          << "step " << step << " layer " << layer;
    }
    tokens.push_back(step);
  }
  // The packed states themselves are identical.
  auto exported = client_->Export(kModel, live[0]);
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->packed, ref.SlotBytes(0));
  EXPECT_EQ(exported->tags.model_id(), kModel);

  // Snapshot slot 0 with per-layer aux bytes, then release it.
  const std::vector<std::string> aux = {std::string("conv-window-0\0x", 15), "conv-window-1"};
  auto key = client_->Snapshot(kModel, live[0], tokens, aux);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, KeyOfTokens(tokens));
  const SlotHandle old = live[0];
  ASSERT_TRUE(client_->ReleaseSlots(kModel, {old}).ok());
  EXPECT_EQ(client_->Export(kModel, old).status().code(), absl::StatusCode::kFailedPrecondition);

  // Next turn: look up the longest cached prefix of a longer prompt, restore
  // it into a new slot, continue.
  std::vector<int32_t> next_turn = tokens;
  next_turn.push_back(7);
  next_turn.push_back(8);
  auto hit = client_->LookupPrefix(kModel, next_turn, absl::Seconds(5));
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_TRUE(hit->hit);
  EXPECT_EQ(hit->key, *key);
  EXPECT_EQ(hit->candidate_tokens, static_cast<int64_t>(next_turn.size()));
  auto fresh = client_->AllocateSlots(kModel, 1);
  ASSERT_TRUE(fresh.ok());
  auto restored = client_->Restore(kModel, (*fresh)[0], hit->key, hit->lease_id);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->aux, aux);
  EXPECT_EQ(restored->num_tokens, static_cast<int64_t>(tokens.size()));
  live[0] = (*fresh)[0];
  auto reexported = client_->Export(kModel, live[0]);
  ASSERT_TRUE(reexported.ok());
  EXPECT_EQ(reexported->packed, ref.SlotBytes(0));
  for (int step = 0; step < 20; ++step) {
    for (int layer = 0; layer < geo.layers; ++layer) {
      Inputs in = MakeInputs(geo, 2, 1, &rng);
      auto o = client_->Update(kModel, Call(layer, live, in));
      ASSERT_TRUE(o.ok()) << o.status();
      ASSERT_TRUE(SameBits(*o, ref.Update(layer, ref_slots, in, DType::kFp32)))
          << "after restore, step " << step << " layer " << layer;
    }
  }
  // The checkpoint was not changed by the updates after the restore.
  auto again = client_->AllocateSlots(kModel, 1);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(client_->Restore(kModel, (*again)[0], *key).ok());
  EXPECT_EQ(client_->Export(kModel, (*again)[0])->packed, exported->packed);

  auto stats = client_->GetStats(kModel);
  ASSERT_TRUE(stats.ok());
  const v1::ModelStats& s = stats->models(0).stats();
  EXPECT_EQ(s.slots_allocated(), 3);
  EXPECT_EQ(s.snapshots(), 1);
  EXPECT_EQ(s.restores(), 2);
  EXPECT_EQ(s.lookups_hit(), 1);
  EXPECT_EQ(s.lookup_tokens_hit(), static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(s.lookup_tokens_miss(), 2);
  EXPECT_EQ(s.leases_active(), 0);
  const std::string scrape = server_->metrics().Scrape();
  EXPECT_THAT(scrape, HasSubstr("statecache_slots_used{format=\"damp:8\",model=\"tiny-gdn\"} 3"));
  EXPECT_THAT(scrape, HasSubstr("statecache_restores_total{format=\"damp:8\",model=\"tiny-gdn\"} 2"));
  EXPECT_THAT(scrape, HasSubstr("statecache_rpc_duration_seconds_count{method=\"Update\"} 240"));
  EXPECT_THAT(scrape, HasSubstr("statecache_prefix_lookups_total{format=\"damp:8\",model=\"tiny-gdn\",result=\"hit\"} 1"));
}

// A calibrated KDA layout (non-identity permutations, damp-sr value maps) and
// bf16 inputs travel through RegisterModel and give the same bits as in
// process; UpdateStream gives the same bits as unary Update.
TEST_F(E2eTest, CalibratedKdaLayoutBf16AndStreamMatchInProcess) {
  const ModelGeometry geo = TinyKda();
  const FormatSpec spec = ParseFormatSpec("damp-sr:8").value();
  std::mt19937 rng(7);
  ModelRegistration r;
  r.model_id = "tiny-kda";
  r.geometry = geo;
  r.format = "damp-sr:8";
  r.slots = 4;
  r.checkpoints = 1;
  const int64_t heads = geo.HeadsPerSlot();
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<int32_t> p(geo.d_k), o(geo.d_v);
    std::iota(p.begin(), p.end(), 0);
    std::iota(o.begin(), o.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
    std::shuffle(o.begin(), o.end(), rng);
    r.key_perm.insert(r.key_perm.end(), p.begin(), p.end());
    r.value_order.insert(r.value_order.end(), o.begin(), o.end());
    for (int j = 0; j < geo.d_v; ++j) r.value_scale.push_back(0.5f + 0.01f * j);
  }
  auto info = client_->RegisterModel(r);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->identity_layout());
  const StateLayout layout =
      StateLayout::Create(geo, spec, r.key_perm, r.value_order, r.value_scale).value();
  EXPECT_EQ(info->tags().layout_fingerprint(), layout.Fingerprint());
  Reference ref(layout, 2);
  auto slots = client_->AllocateSlots("tiny-kda", 2);
  ASSERT_TRUE(slots.ok());
  auto stream = client_->OpenUpdateStream();
  ASSERT_TRUE(stream.ok());
  for (int step = 0; step < 10; ++step) {
    for (int layer = 0; layer < geo.layers; ++layer) {
      Inputs in = MakeInputs(geo, 2, 1, &rng, DType::kBf16);
      const std::vector<float> want = ref.Update(layer, {0, 1}, in, DType::kBf16);
      absl::StatusOr<std::vector<float>> o =
          step % 2 == 0 ? client_->Update("tiny-kda", Call(layer, *slots, in, DType::kBf16))
                        : (*stream)->Update("tiny-kda", Call(layer, *slots, in, DType::kBf16));
      ASSERT_TRUE(o.ok()) << o.status();
      ASSERT_TRUE(SameBits(*o, want)) << "step " << step << " layer " << layer;
    }
  }
  // A bad message on the stream is answered with its error; the stream goes on.
  Inputs bad = MakeInputs(geo, 2, 1, &rng);
  bad.beta[0] = std::nanf("");
  auto err = (*stream)->Update("tiny-kda", Call(0, *slots, bad));
  EXPECT_EQ(err.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(err.status().message()), HasSubstr("beta"));
  Inputs good = MakeInputs(geo, 2, 1, &rng);
  auto ok = (*stream)->Update("tiny-kda", Call(1, *slots, good));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(SameBits(*ok, ref.Update(1, {0, 1}, good, DType::kFp32)));
  EXPECT_TRUE((*stream)->Finish().ok());
  // Export equals the reference packed bytes.
  EXPECT_EQ(client_->Export("tiny-kda", (*slots)[1])->packed, ref.SlotBytes(1));
}

TEST_F(E2eTest, PrefillStatesPacksLikeTheBackendAndImportRoundTrips) {
  const ModelGeometry geo = TinyGdn();
  Register(kModel, geo, "int8-hadamard", 4, 1);
  const StateLayout layout =
      StateLayout::Identity(geo, ParseFormatSpec("int8-hadamard").value()).value();
  Reference ref(layout, 1);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> states(geo.HeadsPerSlot() * geo.d_k * geo.d_v);
  for (float& x : states) x = normal(rng);
  auto slots = client_->AllocateSlots(kModel, 2);
  ASSERT_TRUE(slots.ok());
  ASSERT_TRUE(client_->PrefillStates(kModel, {(*slots)[0]}, states).ok());
  ref.Pack({0}, states);
  auto exported = client_->Export(kModel, (*slots)[0]);
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->packed, ref.SlotBytes(0));
  ASSERT_TRUE(client_->Import(kModel, (*slots)[1], *exported).ok());
  EXPECT_EQ(client_->Export(kModel, (*slots)[1])->packed, exported->packed);
}

// Unpack is the inverse of PrefillStates: bit-exact for fp32, within the
// format's error for damp:16; unknown and stale slots get their codes.
TEST_F(E2eTest, UnpackReturnsPrefilledStatesInNaturalOrder) {
  const ModelGeometry geo = TinyGdn();
  Register(kModel, geo, "fp32", 4, 1);
  Register("unpack-damp", geo, "damp:16", 4, 1);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> states(geo.HeadsPerSlot() * geo.d_k * geo.d_v);
  for (float& x : states) x = normal(rng);
  auto slots = client_->AllocateSlots(kModel, 1);
  ASSERT_TRUE(slots.ok());
  ASSERT_TRUE(client_->PrefillStates(kModel, {(*slots)[0]}, states).ok());
  auto back = client_->Unpack(kModel, (*slots)[0]);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), states.size());
  EXPECT_EQ(std::memcmp(back->data(), states.data(), states.size() * 4), 0);

  auto dslots = client_->AllocateSlots("unpack-damp", 1);
  ASSERT_TRUE(dslots.ok());
  ASSERT_TRUE(client_->PrefillStates("unpack-damp", {(*dslots)[0]}, states).ok());
  auto dback = client_->Unpack("unpack-damp", (*dslots)[0]);
  ASSERT_TRUE(dback.ok()) << dback.status();
  ASSERT_EQ(dback->size(), states.size());
  double err = 0, norm = 0;
  for (size_t i = 0; i < states.size(); ++i) {
    err += double((*dback)[i] - states[i]) * ((*dback)[i] - states[i]);
    norm += double(states[i]) * states[i];
  }
  EXPECT_GT(err, 0.0);
  EXPECT_LT(std::sqrt(err / norm), 0.05);

  const SlotHandle a = (*slots)[0];
  const SlotHandle stale{a.id, a.generation + 1};
  EXPECT_EQ(client_->Unpack(kModel, stale).status().code(), absl::StatusCode::kFailedPrecondition);
  const SlotHandle unknown{a.id ^ 0xdeadbeefULL, a.generation};
  EXPECT_EQ(client_->Unpack(kModel, unknown).status().code(), absl::StatusCode::kNotFound);
}

// States enter the store only within the magnitude bound (finite, |x| <= 2^64:
// kernels/formats/state_bound.h), so no update of an accepted state overflows.
// Issue 26: Prefill of states (and Import) with every value 3e38 were OK, one
// Update with valid normalized inputs then returned a non-finite o and the
// stored state exported as -inf.
TEST_F(E2eTest, StatesBeyondTheMagnitudeBoundAreRefusedWhereverTheyEnter) {
  const ModelGeometry geo = TinyGdn();
  const int64_t values = geo.HeadsPerSlot() * geo.d_k * geo.d_v;
  std::mt19937 rng(26);
  for (const char* format : {"fp32", "bf16"}) {
    SCOPED_TRACE(format);
    const std::string id = absl::StrCat("bound-", format);
    Register(id, geo, format, 3, 1);
    auto slots = client_->AllocateSlots(id, 3);
    ASSERT_TRUE(slots.ok()) << slots.status();
    const std::string empty = client_->Export(id, (*slots)[0])->packed;

    // Prefill of states: the repro's 3e38 and the first value beyond 2^64.
    absl::Status s = client_->PrefillStates(id, {(*slots)[0]}, std::vector<float>(values, 3e38f));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("states[0]: 3e+38 exceeds the state magnitude bound |x| <= 2^64"));
    std::vector<float> over(values, 1.0f);
    over[values - 1] = -std::nextafter(kMaxStateMagnitude, INFINITY);
    s = client_->PrefillStates(id, {(*slots)[0]}, over);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("states[", values - 1, "]: ")));
    EXPECT_EQ(client_->Export(id, (*slots)[0])->packed, empty);

    // At the bound: accepted, and its packed bytes are the values.
    ASSERT_TRUE(
        client_->PrefillStates(id, {(*slots)[0]}, std::vector<float>(values, kMaxStateMagnitude))
            .ok());
    auto at_bound = client_->Export(id, (*slots)[0]);
    ASSERT_TRUE(at_bound.ok()) << at_bound.status();

    // Import: the same bytes with one value raised to 3e38 are refused.
    ExportedState beyond = *at_bound;
    const bool fp32 = std::string(format) == "fp32";
    const std::string b_bytes = fp32 ? std::string("\x00\x00\x80\x5f", 4)   // 2^64
                                     : std::string("\x80\x5f", 2);
    const std::string huge = fp32 ? std::string(reinterpret_cast<const char*>(&kHuge32), 4)
                                  : std::string("\x61\x7f", 2);           // bf16 2.99e38
    const size_t at = beyond.packed.find(b_bytes);
    ASSERT_NE(at, std::string::npos);
    beyond.packed.replace(at, huge.size(), huge);
    s = client_->Import(id, (*slots)[1], beyond);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("packed (decoded state)["));
    EXPECT_THAT(std::string(s.message()), HasSubstr("exceeds the state magnitude bound"));
    EXPECT_EQ(client_->Export(id, (*slots)[1])->packed, empty);

    // Import at the bound, Snapshot, Restore of that imported checkpoint,
    // then an Update with valid normalized inputs: o is finite, and a
    // state the update kept within the bound (k = q = e_0) exports and
    // re-imports.
    ASSERT_TRUE(client_->Import(id, (*slots)[1], *at_bound).ok());
    auto key = client_->Snapshot(id, (*slots)[1], {7, 8});
    ASSERT_TRUE(key.ok()) << key.status();
    ASSERT_TRUE(client_->Restore(id, (*slots)[2], *key).ok());
    EXPECT_EQ(client_->Export(id, (*slots)[2])->packed, at_bound->packed);
    Inputs in = MakeInputs(geo, 1, 1, &rng);
    for (int layer = 0; layer < geo.layers; ++layer) {
      auto o = client_->Update(id, Call(layer, {(*slots)[2]}, in));
      ASSERT_TRUE(o.ok()) << o.status();
      for (float x : *o) ASSERT_TRUE(std::isfinite(x)) << x;
    }
    std::fill(in.q.begin(), in.q.end(), 0.f);
    in.q[0] = 1.f;
    in.k = in.q;
    auto o = client_->Update(id, Call(0, {(*slots)[1]}, in));
    ASSERT_TRUE(o.ok()) << o.status();
    for (float x : *o) ASSERT_TRUE(std::isfinite(x)) << x;
    auto updated = client_->Export(id, (*slots)[1]);
    ASSERT_TRUE(updated.ok());
    EXPECT_NE(updated->packed, at_bound->packed);
    ASSERT_TRUE(client_->Import(id, (*slots)[0], *updated).ok());
    EXPECT_EQ(client_->Export(id, (*slots)[0])->packed, updated->packed);
  }

  // A quantized format: the values its scales decode to are checked. nvfp4's
  // FP32 global scale (head 0 of layer 0 leads the slot) raised to 1e25
  // decodes ordinary codes to ~1e28.
  Register("bound-nvfp4", geo, "nvfp4", 2, 1);
  auto slots = client_->AllocateSlots("bound-nvfp4", 2);
  ASSERT_TRUE(slots.ok()) << slots.status();
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> states(values);
  for (float& x : states) x = normal(rng);
  ASSERT_TRUE(client_->PrefillStates("bound-nvfp4", {(*slots)[0]}, states).ok());
  auto exported = client_->Export("bound-nvfp4", (*slots)[0]);
  ASSERT_TRUE(exported.ok());
  const std::string empty = client_->Export("bound-nvfp4", (*slots)[1])->packed;
  const PackedHeadLayout hl =
      StateLayout::Identity(geo, ParseFormatSpec("nvfp4").value()).value().head_layout();
  ASSERT_TRUE(hl.has_global_scale);
  const float gs = 1e25f;
  exported->packed.replace(hl.global_offset, 4, reinterpret_cast<const char*>(&gs), 4);
  const absl::Status s = client_->Import("bound-nvfp4", (*slots)[1], *exported);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("packed (decoded state)["));
  EXPECT_THAT(std::string(s.message()), HasSubstr("exceeds the state magnitude bound"));
  EXPECT_EQ(client_->Export("bound-nvfp4", (*slots)[1])->packed, empty);
}

// The code of a Status or of a StatusOr's status.
template <typename T>
absl::StatusCode CodeOf(const T& result) {
  if constexpr (std::is_same_v<std::decay_t<T>, absl::Status>) {
    return result.code();
  } else {
    return result.status().code();
  }
}

// RegisterModel, DescribeModel and AllocateSlots errors next to kModel (of
// `geo`, registered): codes and the fields their messages name.
void ExpectModelErrors(StateCacheClient& client, const ModelGeometry& geo) {
  ModelRegistration dup;
  dup.model_id = kModel;
  dup.geometry = geo;
  dup.slots = 1;
  EXPECT_EQ(CodeOf(client.RegisterModel(dup)), absl::StatusCode::kAlreadyExists);
  ModelRegistration bad = dup;
  bad.model_id = "other";
  bad.format = "damp9";
  auto bad_format = client.RegisterModel(bad);
  EXPECT_EQ(CodeOf(bad_format), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_format.status().message()), HasSubstr("format"));
  bad.format = "damp:999";  // k_hi beyond d_k = 32: the `format` field, with k_hi's range
  auto bad_k_hi = client.RegisterModel(bad);
  EXPECT_EQ(CodeOf(bad_k_hi), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_k_hi.status().message()),
              HasSubstr("format: 'damp:999': k_hi 999 is outside 0..32"));
  bad.format = "fp32";
  bad.geometry.d_v = 33;
  auto bad_geo = client.RegisterModel(bad);
  EXPECT_EQ(CodeOf(bad_geo), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_geo.status().message()), HasSubstr("geometry.d_v"));
  bad.geometry = geo;
  bad.key_perm.assign(geo.HeadsPerSlot() * geo.d_k, 0);
  auto bad_perm = client.RegisterModel(bad);
  EXPECT_EQ(CodeOf(bad_perm), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_perm.status().message()), HasSubstr("layout.key_perm"));
  bad.key_perm.clear();
  bad.slots = 1 << 20;
  EXPECT_EQ(CodeOf(client.RegisterModel(bad)), absl::StatusCode::kResourceExhausted);
  bad.model_id = "bad id!";
  EXPECT_EQ(CodeOf(client.RegisterModel(bad)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(client.DescribeModel("nope")), absl::StatusCode::kNotFound);
  EXPECT_EQ(CodeOf(client.AllocateSlots("nope", 1)), absl::StatusCode::kNotFound);
}

// Update requests the typed client cannot produce (a wrong shape, dtype or
// data size), sent raw on slot `a` of kModel: INVALID_ARGUMENT naming the
// field.
void ExpectRawUpdateErrors(StateCacheClient& client, const SlotHandle& a) {
  v1::UpdateRequest req;
  req.set_model_id(kModel);
  req.set_layer(0);
  auto* h = req.add_slots();
  h->set_id(a.id);
  h->set_generation(a.generation);
  auto set = [](v1::Tensor* t, v1::DType d, std::vector<int64_t> shape, size_t bytes) {
    t->set_dtype(d);
    for (int64_t s : shape) t->add_shape(s);
    t->set_data(std::string(bytes, '\0'));
  };
  set(req.mutable_q(), v1::DTYPE_FP32, {1, 1, 32}, 128);
  set(req.mutable_k(), v1::DTYPE_FP32, {1, 1, 32}, 128);
  set(req.mutable_v(), v1::DTYPE_FP32, {1, 2, 32}, 256);
  set(req.mutable_g(), v1::DTYPE_BF16, {1, 2}, 4);
  set(req.mutable_beta(), v1::DTYPE_FP32, {1, 2}, 8);
  v1::UpdateResponse resp;
  req.mutable_q()->set_shape(2, 31);
  grpc::ClientContext ctx0;
  grpc::Status s = client.stub().Update(&ctx0, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("q.shape: [1, 1, 31], want [1, 1, 32]"));
  req.mutable_q()->set_shape(2, 32);
  grpc::ClientContext ctx;
  s = client.stub().Update(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("g.dtype"));
  req.mutable_g()->set_dtype(v1::DTYPE_FP32);
  req.mutable_g()->set_data(std::string(7, '\0'));
  grpc::ClientContext ctx2;
  s = client.stub().Update(&ctx2, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("g.data"));
  req.mutable_g()->set_data(std::string(8, '\0'));
  req.mutable_k()->set_dtype(v1::DTYPE_FP16);
  grpc::ClientContext ctx3;
  s = client.stub().Update(&ctx3, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("k.dtype"));
  req.mutable_k()->set_dtype(v1::DTYPE_FP32);
  req.mutable_v()->clear_data();
  grpc::ClientContext ctx4;
  s = client.stub().Update(&ctx4, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("v.data"));
}

// Every error path returns its code, names the field, and writes nothing.
TEST_F(E2eTest, ErrorPathsReturnTheirCodesAndWriteNothing) {
  const ModelGeometry geo = TinyGdn();
  Register(kModel, geo, "damp:8", 3, 1);
  std::mt19937 rng(5);

  ExpectModelErrors(*client_, geo);

  // Slots.
  EXPECT_EQ(CodeOf(client_->AllocateSlots(kModel, 0)), absl::StatusCode::kInvalidArgument);
  auto slots = client_->AllocateSlots(kModel, 2);
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ(CodeOf(client_->AllocateSlots(kModel, 2)), absl::StatusCode::kResourceExhausted);
  const SlotHandle a = (*slots)[0], b = (*slots)[1];

  // Put some state in both slots, remember their bytes.
  for (int layer = 0; layer < geo.layers; ++layer) {
    ASSERT_TRUE(client_->Update(kModel, Call(layer, {a, b}, MakeInputs(geo, 2, 1, &rng))).ok());
  }
  const std::string a_bytes = client_->Export(kModel, a)->packed;
  const std::string b_bytes = client_->Export(kModel, b)->packed;

  // Unknown and stale handles.
  const SlotHandle unknown{a.id ^ 0xdeadbeefULL, a.generation};
  Inputs one = MakeInputs(geo, 1, 1, &rng);
  EXPECT_EQ(CodeOf(client_->Update(kModel, Call(0, {unknown}, one))), absl::StatusCode::kNotFound);
  const SlotHandle stale{a.id, a.generation + 1};
  EXPECT_EQ(CodeOf(client_->Update(kModel, Call(0, {stale}, one))),
            absl::StatusCode::kFailedPrecondition);
  Inputs two = MakeInputs(geo, 2, 1, &rng);
  EXPECT_EQ(CodeOf(client_->Update(kModel, Call(0, {a, a}, two))),
            absl::StatusCode::kInvalidArgument);
  // A batch with one bad handle touches none of the good ones.
  EXPECT_EQ(CodeOf(client_->Update(kModel, Call(0, {a, unknown}, two))), absl::StatusCode::kNotFound);

  // Bad tensors: NaN / Inf, positive g, beta out of range, wrong layer.
  auto expect_invalid = [&](const Inputs& in, const std::vector<SlotHandle>& hs, int layer,
                            const std::string& field) {
    auto r = client_->Update(kModel, Call(layer, hs, in));
    EXPECT_EQ(CodeOf(r), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(field));
  };
  Inputs nan_v = two;
  nan_v.v[5] = std::nanf("");
  expect_invalid(nan_v, {a, b}, 0, "v[5]");
  Inputs inf_q = two;
  inf_q.q[3] = INFINITY;
  expect_invalid(inf_q, {a, b}, 1, "q[3]");
  Inputs pos_g = two;
  pos_g.g[1] = 0.5f;
  expect_invalid(pos_g, {a, b}, 0, "g[1]");
  Inputs big_beta = two;
  big_beta.beta[2] = 3.0f;
  expect_invalid(big_beta, {a, b}, 0, "beta[2]");
  expect_invalid(two, {a, b}, 2, "layer");
  expect_invalid(one, {a, b}, 0, "q.data");  // B=1 tensors for 2 slots

  ExpectRawUpdateErrors(*client_, a);
  // Nothing was written by any rejected request.
  EXPECT_EQ(client_->Export(kModel, a)->packed, a_bytes);
  EXPECT_EQ(client_->Export(kModel, b)->packed, b_bytes);

  // Prefix cache.
  auto restore_unknown = client_->Restore(kModel, b, KeyOfTokens({1, 2, 3}));
  EXPECT_EQ(CodeOf(restore_unknown), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(restore_unknown.status().message()), HasSubstr("key"));
  auto aux_wrong = client_->Snapshot(kModel, a, {1, 2}, {"only one layer"});
  EXPECT_EQ(CodeOf(aux_wrong), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(aux_wrong.status().message()), HasSubstr("aux"));
  EXPECT_EQ(CodeOf(client_->Snapshot(kModel, a, {}, {})), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(client_->Snapshot(kModel, a, {1, 2}).ok());
  auto lease = client_->LookupPrefix(kModel, {1, 2, 3});
  ASSERT_TRUE(lease.ok() && lease->hit);
  // The only checkpoint is leased: a new snapshot cannot evict it.
  EXPECT_EQ(CodeOf(client_->Snapshot(kModel, b, {4, 5})), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CodeOf(client_->Restore(kModel, b, KeyOfTokens({9}), lease->lease_id)),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(client_->Restore(kModel, b, lease->key, lease->lease_id).ok());
  EXPECT_TRUE(client_->Snapshot(kModel, b, {4, 5}).ok());  // evicts {1, 2} now

  // Import: wrong tags, wrong size, bytes that decode to NaN.
  ExportedState state = *client_->Export(kModel, a);
  ExportedState other_model = state;
  other_model.tags.set_model_id("someone-else");
  auto tag_err = client_->Import(kModel, b, other_model);
  EXPECT_EQ(tag_err.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tag_err.message()), HasSubstr("tags.model_id"));
  ExportedState other_layout = state;
  other_layout.tags.set_layout_fingerprint(state.tags.layout_fingerprint() + 1);
  EXPECT_EQ(client_->Import(kModel, b, other_layout).code(),
            absl::StatusCode::kFailedPrecondition);
  ExportedState short_bytes = state;
  short_bytes.packed.pop_back();
  EXPECT_EQ(client_->Import(kModel, b, short_bytes).code(), absl::StatusCode::kInvalidArgument);
  ExportedState nan_bytes = state;
  std::memset(&nan_bytes.packed[0], 0xff, 64);  // fp16 hi rows -> NaN
  const std::string b_before = client_->Export(kModel, b)->packed;
  auto nan_err = client_->Import(kModel, b, nan_bytes);
  EXPECT_EQ(nan_err.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nan_err.message()), HasSubstr("packed"));
  EXPECT_EQ(client_->Export(kModel, b)->packed, b_before);

  // Release errors, drop with live slots.
  EXPECT_EQ(client_->ReleaseSlots(kModel, {a, unknown}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->DropModel(kModel).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(client_->ReleaseSlots(kModel, {a, b}).ok());
  EXPECT_EQ(client_->ReleaseSlots(kModel, {a}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(client_->DropModel(kModel).ok());
  EXPECT_EQ(client_->DropModel(kModel).code(), absl::StatusCode::kNotFound);

  const std::string scrape = server_->metrics().Scrape();
  EXPECT_THAT(scrape, HasSubstr("statecache_rpcs_total{code=\"INVALID_ARGUMENT\",method=\"Update\"}"));
}

// Concurrent clients on distinct slots give the same results as serial runs.
TEST_F(E2eTest, ConcurrentClientsMatchSerialRuns) {
  const ModelGeometry geo = TinyGdn();
  Register(kModel, geo, "damp:8", 8, 1);
  constexpr int kClients = 4, kSteps = 25;
  auto run = [&](StateCacheClient* client, int seed, std::vector<float>* outputs) {
    std::mt19937 rng(seed);
    auto slot = client->AllocateSlots(kModel, 1);
    ASSERT_TRUE(slot.ok());
    for (int step = 0; step < kSteps; ++step) {
      for (int layer = 0; layer < geo.layers; ++layer) {
        auto o = client->Update(kModel, Call(layer, *slot, MakeInputs(geo, 1, 1, &rng)));
        ASSERT_TRUE(o.ok()) << o.status();
        outputs->insert(outputs->end(), o->begin(), o->end());
      }
    }
    ASSERT_TRUE(client->ReleaseSlots(kModel, *slot).ok());
  };
  std::vector<std::vector<float>> serial(kClients), parallel(kClients);
  for (int c = 0; c < kClients; ++c) run(client_.get(), 100 + c, &serial[c]);
  std::vector<std::unique_ptr<StateCacheClient>> clients;
  for (int c = 0; c < kClients; ++c) clients.push_back(Connect());
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] { run(clients[c].get(), 100 + c, &parallel[c]); });
  }
  for (auto& t : threads) t.join();
  for (int c = 0; c < kClients; ++c) {
    EXPECT_TRUE(SameBits(parallel[c], serial[c])) << "client " << c;
  }
  auto model = server_->registry().Find(kModel);
  ASSERT_TRUE(model.ok());
  EXPECT_TRUE((*model)->slots->CheckInvariants().ok());
  EXPECT_EQ((*model)->slots->stats().allocated, 0);
}

TEST_F(E2eTest, ShutdownDrainsAndRefusesNewCalls) {
  const ModelGeometry geo = TinyGdn();
  Register(kModel, geo, "fp32", 2, 0);
  auto slots = client_->AllocateSlots(kModel, 1);
  ASSERT_TRUE(slots.ok());
  // A worker's open stream, idle between messages: shutdown cancels it
  // after the drain; the server stops either way.
  auto stream = client_->OpenUpdateStream();
  ASSERT_TRUE(stream.ok());
  std::mt19937 rng(1);
  ASSERT_TRUE((*stream)->Update(kModel, Call(0, *slots, MakeInputs(geo, 1, 1, &rng))).ok());
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE((*stream)->Update(kModel, Call(0, *slots, MakeInputs(geo, 1, 1, &rng))).ok());
  auto r = client_->AllocateSlots(kModel, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
}

// Issue 26 item 1: a lease that expires unused stops counting at its expiry,
// for GetStats, /metrics and DropModel alike, without any further call on the
// checkpoint store (a client that took a lease and died).
TEST(E2eLeaseTest, ExpiredLeaseStopsCountingForStatsMetricsAndDropModel) {
  SetLoggingEnabled(false);
  std::atomic<int64_t> now_ms{1'000'000};
  StateCacheServer::Options options = LoopbackOptions(1 << 20, 1 << 20);
  options.clock = [&now_ms] { return absl::FromUnixMillis(now_ms.load()); };
  auto server = StateCacheServer::Create(std::move(options));
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = StateCacheClient::Connect(LoopbackTarget(**server)).value();
  ModelRegistration r;
  r.model_id = "x";
  r.geometry = TinyGdn();
  r.format = "fp32";
  r.slots = 2;
  r.checkpoints = 2;
  ASSERT_TRUE(client->RegisterModel(r).ok());
  auto slots = client->AllocateSlots("x", 1);
  ASSERT_TRUE(slots.ok()) << slots.status();
  const std::vector<int32_t> tokens = {1};
  ASSERT_TRUE(client->Snapshot("x", (*slots)[0], tokens).ok());
  ASSERT_TRUE(client->ReleaseSlots("x", *slots).ok());
  auto hit = client->LookupPrefix("x", tokens, absl::Milliseconds(100));
  ASSERT_TRUE(hit.ok()) << hit.status();
  ASSERT_TRUE(hit->hit);

  auto stats = client->GetStats("x");
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->models_size(), 1);
  EXPECT_EQ(stats->models(0).stats().leases_active(), 1);
  EXPECT_EQ(client->DropModel("x").code(), absl::StatusCode::kFailedPrecondition);
  const std::string before = (*server)->metrics().Scrape();
  EXPECT_THAT(before, HasSubstr("statecache_leases_active{format=\"fp32\",model=\"x\"} 1"));

  now_ms += 100;  // the lease's expiry
  stats = client->GetStats("x");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->models(0).stats().leases_active(), 0);
  EXPECT_EQ(stats->models(0).stats().leases_expired(), 1);
  EXPECT_EQ(stats->models(0).stats().checkpoints_leased(), 0);
  const std::string after = (*server)->metrics().Scrape();
  EXPECT_THAT(after, HasSubstr("statecache_leases_active{format=\"fp32\",model=\"x\"} 0"));
  EXPECT_THAT(after,
              HasSubstr("statecache_leases_expired_total{format=\"fp32\",model=\"x\"} 1"));
  EXPECT_TRUE(client->DropModel("x").ok());
}

// Issue 26 item 3: every call sent around a shutdown ends OK (it ran) or
// UNAVAILABLE (it did not run), never CANCELLED; and a stream idle between
// messages does not hold the shutdown for the grace period.
TEST_F(E2eTest, ShutdownEndsEveryCallOkOrUnavailableAndIdleStreamsDoNotHoldIt) {
  const ModelGeometry geo = TinyGdn();
  constexpr int kClients = 6;
  Register(kModel, geo, "fp32", kClients + 1, 0);
  auto idle_slot = client_->AllocateSlots(kModel, 1);
  ASSERT_TRUE(idle_slot.ok());
  auto idle = client_->OpenUpdateStream();
  ASSERT_TRUE(idle.ok());
  std::mt19937 idle_rng(7);
  ASSERT_TRUE((*idle)->Update(kModel, Call(0, *idle_slot, MakeInputs(geo, 1, 1, &idle_rng))).ok());

  std::vector<std::unique_ptr<StateCacheClient>> clients;
  std::vector<std::vector<SlotHandle>> slots;
  for (int c = 0; c < kClients; ++c) {
    clients.push_back(Connect());
    auto s = clients.back()->AllocateSlots(kModel, 1);
    ASSERT_TRUE(s.ok());
    slots.push_back(*s);
  }
  std::atomic<int> ok_calls{0};
  std::vector<absl::Status> last(kClients);
  std::vector<std::thread> threads;
  absl::Notification go;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(c);
      const Inputs in = MakeInputs(geo, 1, 1, &rng);  // the call's tensors view it
      const UpdateCall call = Call(0, slots[c], in);
      go.WaitForNotification();
      while (true) {
        auto o = clients[c]->Update(kModel, call);
        if (!o.ok()) {
          last[c] = o.status();
          return;
        }
        ++ok_calls;
      }
    });
  }
  go.Notify();
  const absl::Time warm_up = absl::Now() + absl::Seconds(20);
  while (ok_calls.load() < 4 * kClients && absl::Now() < warm_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_GE(ok_calls.load(), 4 * kClients);
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Seconds(30));
  const absl::Duration took = absl::Now() - start;
  for (auto& t : threads) t.join();
  EXPECT_LT(took, absl::Seconds(5)) << "an idle stream held the shutdown";
  for (int c = 0; c < kClients; ++c) {
    EXPECT_EQ(last[c].code(), absl::StatusCode::kUnavailable) << "client " << c << ": " << last[c];
  }
  // The idle stream was ended: its next update fails.
  EXPECT_FALSE((*idle)->Update(kModel, Call(0, *idle_slot, MakeInputs(geo, 1, 1, &idle_rng))).ok());
}

// A stream's message that reaches the server during the drain does not run:
// it is answered UNAVAILABLE, or (the drain began before the server waited
// for it) left unanswered; either way the stream ends UNAVAILABLE. A unary
// call is refused UNAVAILABLE.
TEST_F(E2eTest, CallsDuringTheDrainDoNotRunAndEndUnavailable) {
  const ModelGeometry geo = TinyGdn();
  Register(kModel, geo, "fp32", 2, 0);
  auto slots = client_->AllocateSlots(kModel, 1);
  ASSERT_TRUE(slots.ok());
  auto model = server_->registry().Find(kModel).value();
  const int32_t slot_index = model->slots->Acquire(*slots, "slots").value().indices()[0];
  auto stream = client_->OpenUpdateStream();
  ASSERT_TRUE(stream.ok());
  std::mt19937 rng(3);
  ASSERT_TRUE((*stream)->Update(kModel, Call(0, *slots, MakeInputs(geo, 1, 1, &rng))).ok());
  // Read under the slot's exclusive access: the handler that wrote it
  // released it after writing (a happens-before edge TSan sees; the gRPC
  // reply that also orders them is uninstrumented).
  auto slot_bytes = [&] {
    auto access = model->slots->Acquire(*slots, "slots");
    EXPECT_TRUE(access.ok()) << access.status();
    return std::vector<uint8_t>(model->slots->view().slot(slot_index),
                                model->slots->view().slot(slot_index) + model->slots->slot_bytes());
  };
  const std::vector<uint8_t> before = slot_bytes();
  server_->service().call_gate().BeginDrain();
  auto o = (*stream)->Update(kModel, Call(0, *slots, MakeInputs(geo, 1, 1, &rng)));
  EXPECT_EQ(o.status().code(), absl::StatusCode::kUnavailable) << o.status();
  const absl::Status end = (*stream)->Finish();
  EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable) << end;
  EXPECT_THAT(std::string(end.message()), HasSubstr("did not run"));
  const std::vector<uint8_t> after = slot_bytes();
  EXPECT_TRUE(before == after) << "a message sent during the drain wrote its slot";
  auto unary = client_->AllocateSlots(kModel, 1);
  EXPECT_EQ(unary.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(unary.status().message()), HasSubstr("AllocateSlots did not run"));
}

TEST(E2eUnixSocketTest, ServesOnAUnixDomainSocket) {
  SetLoggingEnabled(false);
  // TEST_TMPDIR paths exceed the 107-byte limit of socket paths.
  const std::string path = absl::StrCat("/tmp/statecached-e2e-", getpid(), ".sock");
  StateCacheServer::Options options = LoopbackOptions(1 << 20, 1 << 20);
  options.sockets.listen = "unix:" + path;
  auto server = StateCacheServer::Create(std::move(options));
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = StateCacheClient::Connect("unix:" + path).value();
  ASSERT_TRUE(client->WaitForReady(absl::Seconds(5)).ok());
  auto health = client->CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_TRUE(*health);
  server->reset();
  unlink(path.c_str());
}

TEST(E2eMetricsTest, PrometheusEndpointServesTheSeries) {
  SetLoggingEnabled(false);
  StateCacheServer::Options options = LoopbackOptions(1 << 20, 1 << 20);
  options.metrics.port = 0;  // an ephemeral metrics port
  auto server = StateCacheServer::Create(std::move(options));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->metrics_port(), 0);
  auto client = StateCacheClient::Connect(LoopbackTarget(**server)).value();
  ModelRegistration r;
  r.model_id = "m";
  r.geometry = TinyGdn();
  r.format = "damp:8";
  r.slots = 2;
  ASSERT_TRUE(client->RegisterModel(r).ok());
  ASSERT_TRUE(client->AllocateSlots("m", 2).ok());
  // Plain HTTP/1.0 GET over a socket.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((*server)->metrics_port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string get = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  ASSERT_EQ(write(fd, get.data(), get.size()), static_cast<ssize_t>(get.size()));
  std::string body;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) body.append(buf, n);
  close(fd);
  EXPECT_THAT(body, HasSubstr("200 OK"));
  EXPECT_THAT(body, HasSubstr("statecache_slots_used{format=\"damp:8\",model=\"m\"} 2"));
  EXPECT_THAT(body, HasSubstr("# HELP statecache_state_bytes "));
  EXPECT_THAT(body, HasSubstr("statecache_rpc_duration_seconds_count{method=\"AllocateSlots\"} 1"));
}

}  // namespace
}  // namespace statecache
