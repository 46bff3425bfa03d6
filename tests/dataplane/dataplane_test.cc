// Data plane (issue 10) on the CPU backend: a real statecached (in-process,
// unix socket, --shared_pools) and a worker using its own mappings of the
// shared memory. Registered-buffer and attached-mode updates must be bit for
// bit the inline-byte updates and the in-process kernel calls.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/dataplane_client.h"
#include "client/cpp/statecache_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"
#include "kernels/shm/shm_region.h"
#include "kernels/testing/token_batch.h"
#include "server/dataplane/testing/reference_pool.h"
#include "server/loopback.h"
#include "server/server.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using dataplane_testing::ReferencePool;
using Step = TokenBatch;
constexpr int kB = dataplane_testing::kTestSlots;
constexpr char kModel[] = "dp";
ModelGeometry Geo() { return dataplane_testing::TestGeometry(); }
Step MakeStep(std::mt19937* rng) { return dataplane_testing::MakeTestStep(rng); }
using Reference = ReferencePool;

// The attached client's inputs for step s, o receiving the readout.
DecodeInputs InputsOf(const Step& s, float* o) {
  DecodeInputs in;
  in.q = s.q.data();
  in.k = s.k.data();
  in.v = s.v.data();
  in.g = s.g.data();
  in.beta = s.beta.data();
  in.o = o;
  return in;
}

class DataPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StateCacheServer::Options o = LoopbackOptions(64 << 20, 16 << 20);
    socket_ = absl::StrCat("/tmp/sc_dp_test_", getpid(), ".sock");
    o.sockets.listen = absl::StrCat("unix:", socket_);
    o.dataplane.shared_pools = true;
    auto server = StateCacheServer::Create(std::move(o));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = *StateCacheClient::Connect(absl::StrCat("unix:", socket_));
    ASSERT_TRUE(client_->WaitForReady(absl::Seconds(10)).ok());
    ModelRegistration r;
    r.model_id = kModel;
    r.geometry = Geo();
    r.format = "damp:8";
    r.slots = 16;
    r.checkpoints = 4;
    ASSERT_TRUE(client_->RegisterModel(r).ok());
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    unlink(socket_.c_str());
  }

  std::vector<SlotHandle> Alloc() { return *client_->AllocateSlots(kModel, kB); }
  std::vector<std::string> Export(const std::vector<SlotHandle>& h) {
    std::vector<std::string> out;
    for (const SlotHandle& s : h) out.push_back(client_->Export(kModel, s)->packed);
    return out;
  }
  std::vector<float> Inline(int layer, const std::vector<SlotHandle>& h, const Step& s) {
    UpdateCall c;
    c.layer = layer;
    c.slots = h;
    c.q = HostTensor::Fp32(s.q);
    c.k = HostTensor::Fp32(s.k);
    c.v = HostTensor::Fp32(s.v);
    c.g = s.g;
    c.beta = s.beta;
    auto o = client_->Update(kModel, c);
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : std::vector<float>();
  }

  // Input arena layout: q | k | v | g | beta, output arena: o.
  struct Arena {
    WorkerBuffer* in = nullptr;
    WorkerBuffer* out = nullptr;
    int64_t q = 0, k = 0, v = 0, g = 0, beta = 0, in_bytes = 0;
  };
  static int64_t Up16(int64_t x) { return (x + 15) / 16 * 16; }
  Arena MakeArena(DataPlaneSession* s) {
    const ModelGeometry g = Geo();
    Arena a;
    a.q = 0;
    a.k = Up16(a.q + 4 * kB * g.h_qk * g.d_k);
    a.v = Up16(a.k + 4 * kB * g.h_qk * g.d_k);
    a.g = Up16(a.v + 4 * kB * g.h_v * g.d_v);
    a.beta = Up16(a.g + 4 * kB * g.h_v);
    a.in_bytes = Up16(a.beta + 4 * kB * g.h_v);
    a.in = *s->CreateBuffer(a.in_bytes);
    a.out = *s->CreateBuffer(4 * kB * g.h_v * g.d_v);
    return a;
  }
  RefUpdateCall Write(const Arena& a, int layer, const std::vector<SlotHandle>& h, const Step& s) {
    auto put = [&](int64_t off, const std::vector<float>& x) {
      EXPECT_TRUE(a.in->Write(off, x.data(), 4 * x.size()).ok());
    };
    put(a.q, s.q);
    put(a.k, s.k);
    put(a.v, s.v);
    put(a.g, s.g);
    put(a.beta, s.beta);
    RefUpdateCall c;
    c.layer = layer;
    c.slots = h;
    c.q = {a.in, a.q};
    c.k = {a.in, a.k};
    c.v = {a.in, a.v};
    c.g = {a.in, a.g};
    c.beta = {a.in, a.beta};
    c.o = {a.out, 0};
    return c;
  }
  std::vector<float> ReadO(const Arena& a) {
    std::vector<float> o(kB * Geo().h_v * Geo().d_v);
    EXPECT_TRUE(a.out->Read(0, o.data(), 4 * o.size()).ok());
    return o;
  }

  std::string socket_;
  std::unique_ptr<StateCacheServer> server_;
  std::unique_ptr<StateCacheClient> client_;
};

TEST_F(DataPlaneTest, RegisteredBuffersAreBitIdenticalToInlineAndInProcess) {
  Reference ref;
  std::vector<SlotHandle> inline_slots = Alloc(), ref_slots = Alloc();
  auto session = *DataPlaneSession::Open(client_.get());
  EXPECT_EQ(session->backend(), "cpu");
  Arena a = MakeArena(session.get());
  std::mt19937 rng(7);
  for (int step = 0; step < 3; ++step) {
    for (int layer = 0; layer < Geo().layers; ++layer) {
      const Step s = MakeStep(&rng);
      const std::vector<float> want = ref.Update(layer, s);
      EXPECT_EQ(Inline(layer, inline_slots, s), want);
      ASSERT_TRUE(session->Update(kModel, Write(a, layer, ref_slots, s)).ok());
      ASSERT_EQ(ReadO(a), want) << "step " << step << " layer " << layer;
    }
  }
  const std::vector<std::string> packed = Export(ref_slots);
  EXPECT_EQ(Export(inline_slots), packed);
  for (int i = 0; i < kB; ++i) EXPECT_EQ(packed[i], ref.Packed(i)) << i;
  EXPECT_EQ(server_->service().dataplane()->buffer_count(), 2);
}

TEST_F(DataPlaneTest, ReferencesAreBoundsChecked) {
  std::vector<SlotHandle> h = Alloc();
  auto session = *DataPlaneSession::Open(client_.get());
  Arena a = MakeArena(session.get());
  std::mt19937 rng(1);
  const Step s = MakeStep(&rng);
  const std::vector<std::string> before = Export(h);
  auto expect = [&](RefUpdateCall c, absl::StatusCode code, const std::string& prefix) {
    absl::Status st = session->Update(kModel, c);
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_THAT(std::string(st.message()), StartsWith(prefix));
  };
  RefUpdateCall c = Write(a, 0, h, s);
  c.v.offset = a.in_bytes - 16;  // runs past the end
  expect(c, absl::StatusCode::kInvalidArgument, "v.ref: bytes [");
  c = Write(a, 0, h, s);
  c.q.offset = 8;  // misaligned
  expect(c, absl::StatusCode::kInvalidArgument, "q.ref: bytes [8, ");
  c = Write(a, 0, h, s);
  c.beta.offset = -16;
  expect(c, absl::StatusCode::kInvalidArgument, "beta.ref: bytes [-16, ");
  c = Write(a, 0, h, s);
  c.o.offset = 16;  // o does not fit any more
  expect(c, absl::StatusCode::kInvalidArgument, "o.ref: bytes [16, ");
  c = Write(a, 0, h, s);
  c.g.offset = int64_t{1} << 62;  // no overflow
  expect(c, absl::StatusCode::kInvalidArgument, "g.ref: bytes [");
  c = Write(a, 0, h, s);
  c.k.dtype = DType::kBf16;  // k must match q's dtype
  expect(c, absl::StatusCode::kInvalidArgument, "k.dtype: bf16 is not allowed");
  // Unknown buffer ids are NOT_FOUND naming the field.
  v1::UpdateRequest req = *session->BuildUpdate(kModel, Write(a, 0, h, s));
  req.mutable_v()->mutable_ref()->set_buffer_id(12345);
  v1::UpdateResponse resp;
  absl::Status st = server_->service().DoUpdate(server_->service().default_tenant(), req, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(st.message()), StartsWith("v.ref.buffer_id: no registered buffer"));
  // Wrong shape.
  req = *session->BuildUpdate(kModel, Write(a, 0, h, s));
  req.mutable_q()->set_shape(1, 3);
  st = server_->service().DoUpdate(server_->service().default_tenant(), req, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), StartsWith("q.shape: [3, 3, 32]"));
  // Non-finite input in a buffer: the backend's binding rejects it.
  c = Write(a, 0, h, s);
  const float nan = std::nanf("");
  ASSERT_TRUE(a.in->Write(a.v + 4 * 5, &nan, 4).ok());
  st = session->Update(kModel, c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  // The server edge's value contract applies to references too.
  c = Write(a, 0, h, s);
  const float huge = 1e30f;
  ASSERT_TRUE(a.in->Write(a.k + 4 * 33, &huge, 4).ok());
  st = session->Update(kModel, c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), StartsWith("k: row 1 has L2 norm"));
  EXPECT_EQ(Export(h), before);  // nothing was written
  // A real shm object of another name cannot be registered by path tricks.
  v1::RegisterBufferRequest bad;
  bad.set_session_id(session->id());
  bad.set_size_bytes(64);
  bad.set_shm_name("/../etc/passwd");
  v1::RegisterBufferResponse bad_resp;
  st = server_->service().dataplane()->RegisterBuffer("", bad, &bad_resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), StartsWith("shm_name: "));
  // A buffer larger than the object.
  auto region = *SharedMemoryRegion::Create(64);
  bad.set_shm_name(region->name());
  bad.set_size_bytes(4096);
  st = server_->service().dataplane()->RegisterBuffer("", bad, &bad_resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), StartsWith("size_bytes: 4096 exceeds the 64 bytes"));
}

TEST_F(DataPlaneTest, BuffersAreReleasedWhenTheSessionEndsOrExpires) {
  std::vector<SlotHandle> h = Alloc();
  DataPlane* dp = server_->service().dataplane();
  auto session = *DataPlaneSession::Open(client_.get(), absl::Seconds(5));
  Arena a = MakeArena(session.get());
  std::mt19937 rng(2);
  const Step s = MakeStep(&rng);
  v1::UpdateRequest req = *session->BuildUpdate(kModel, Write(a, 0, h, s));
  EXPECT_EQ(dp->buffer_count(), 2);
  // Another tenant sees neither the session nor its buffers.
  v1::RegisterBufferRequest other;
  other.set_session_id(session->id());
  other.set_size_bytes(64);
  other.set_shm_name("/statecache-nonexistent");
  v1::RegisterBufferResponse other_resp;
  absl::Status st = dp->RegisterBuffer("mallory", other, &other_resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(session->Close().ok());
  EXPECT_EQ(dp->buffer_count(), 0);
  EXPECT_EQ(dp->session_count(), 0);
  v1::UpdateResponse resp;
  st = server_->service().DoUpdate(server_->service().default_tenant(), req, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(st.message()), StartsWith("q.ref.buffer_id: "));
  // Lease expiry.
  auto second = *DataPlaneSession::Open(client_.get(), absl::Seconds(5));
  MakeArena(second.get());
  EXPECT_EQ(dp->buffer_count(), 2);
  EXPECT_EQ(dp->ExpireSessions(absl::Now()), 0);
  EXPECT_EQ(dp->ExpireSessions(absl::Now() + absl::Seconds(6)), 1);
  EXPECT_EQ(dp->buffer_count(), 0);
  EXPECT_EQ(second->Renew().code(), absl::StatusCode::kNotFound);
}

TEST_F(DataPlaneTest, AttachedModeIsBitIdenticalAndLeaseEnforced) {
  Reference ref;
  std::vector<SlotHandle> h = Alloc(), other = Alloc();
  auto session = *DataPlaneSession::Open(client_.get());
  auto attached = AttachedSession::Attach(session.get(), kModel, h);
  ASSERT_TRUE(attached.ok()) << attached.status();
  std::mt19937 rng(3);
  std::vector<float> o(kB * Geo().h_v * Geo().d_v);
  for (int step = 0; step < 3; ++step) {
    for (int layer = 0; layer < Geo().layers; ++layer) {
      const Step s = MakeStep(&rng);
      const DecodeInputs in = InputsOf(s, o.data());
      ASSERT_TRUE((*attached)->DecodeUpdate(layer, h, in).ok());
      ASSERT_EQ(o, ref.Update(layer, s)) << "step " << step << " layer " << layer;
    }
  }
  // The worker refuses slots it holds no lease on.
  DecodeInputs in;
  absl::Status st = (*attached)->DecodeUpdate(0, {other[1]}, in);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), StartsWith("slots[0]: not attached by this session"));
  // The server refuses its own calls on attached slots.
  std::mt19937 rng2(4);
  UpdateCall c;
  const Step s = MakeStep(&rng2);
  c.slots = {other[0], h[1], other[2]};
  c.q = HostTensor::Fp32(s.q);
  c.k = HostTensor::Fp32(s.k);
  c.v = HostTensor::Fp32(s.v);
  c.g = s.g;
  c.beta = s.beta;
  auto r = client_->Update(kModel, c);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), StartsWith("slots[1]: the slot is attached"));
  EXPECT_EQ(client_->Export(kModel, h[0]).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->ReleaseSlots(kModel, {h[2]}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->Snapshot(kModel, h[0], std::vector<int32_t>{1, 2}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A second session cannot attach them; idle release never takes them.
  auto intruder = *DataPlaneSession::Open(client_.get());
  EXPECT_EQ(AttachedSession::Attach(intruder.get(), kModel, {h[0]}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(server_->ReleaseIdleSlots(absl::Now() + absl::Hours(1)), 2 * kB - kB);
  // Detach: server-side use again, the state is the in-process one.
  ASSERT_TRUE((*attached)->Detach().ok());
  EXPECT_EQ((*attached)->DecodeUpdate(0, h, in).code(), absl::StatusCode::kFailedPrecondition);
  const std::vector<std::string> packed = Export(h);
  for (int i = 0; i < kB; ++i) EXPECT_EQ(packed[i], ref.Packed(i)) << i;
  EXPECT_EQ(server_->service().dataplane()->attached_count(), 0);
  // Session expiry ends attachments too.
  auto again = *AttachedSession::Attach(session.get(), kModel, h);
  EXPECT_EQ(server_->service().dataplane()->attached_count(), kB);
  server_->service().dataplane()->ExpireSessions(absl::Now() + absl::Hours(1));
  EXPECT_EQ(server_->service().dataplane()->attached_count(), 0);
  EXPECT_TRUE(client_->Export(kModel, h[0]).ok());
}

TEST_F(DataPlaneTest, AttachedSlotListsChangeAndTheLeaseIsRenewed) {
  // Slot lists that change between calls are restaged (the per-call fast
  // path only skips staging for the previous list), and a call past half the
  // lease renews the session.
  Reference ref;
  std::vector<SlotHandle> h = Alloc();
  auto session = *DataPlaneSession::Open(client_.get(), absl::Milliseconds(400));
  auto attached = *AttachedSession::Attach(session.get(), kModel, h);
  std::mt19937 rng(21);
  std::vector<float> o(kB * Geo().h_v * Geo().d_v);
  const std::vector<SlotHandle> perm = {h[2], h[0], h[1]};
  for (int call = 0; call < 6; ++call) {
    const bool permuted = call % 3 != 0;  // natural, perm, perm, natural, ...
    const Step s = MakeStep(&rng);
    const DecodeInputs in = InputsOf(s, o.data());
    ASSERT_TRUE(attached->DecodeUpdate(call % 2, permuted ? perm : h, in).ok());
    ASSERT_EQ(o, ref.Update(call % 2, s, permuted ? std::vector<int32_t>{2, 0, 1}
                                                  : std::vector<int32_t>{0, 1, 2}))
        << call;
  }
  DataPlane* dp = server_->service().dataplane();
  // Past half the lease: the next call renews; the session outlives its
  // first lease.
  absl::SleepFor(absl::Milliseconds(250));
  const Step s = MakeStep(&rng);
  const DecodeInputs in = InputsOf(s, o.data());
  ASSERT_TRUE(attached->DecodeUpdate(0, h, in).ok());
  EXPECT_EQ(dp->ExpireSessions(absl::Now() + absl::Milliseconds(200)), 0);
  EXPECT_EQ(dp->attached_count(), kB);
  ASSERT_TRUE(attached->Detach().ok());
  const std::vector<std::string> packed = Export(h);
  ref.Update(0, s);
  for (int i = 0; i < kB; ++i) EXPECT_EQ(packed[i], ref.Packed(i)) << i;
}

TEST_F(DataPlaneTest, PrefillWithReferencesMatchesInline) {
  const ModelGeometry g = Geo();
  constexpr int kT = 5;
  std::vector<SlotHandle> inline_slots = Alloc(), ref_slots = Alloc();
  std::mt19937 rng(11);
  // kT steps of inputs, laid out [B, T, ...].
  std::vector<Step> steps;
  for (int t = 0; t < kT; ++t) steps.push_back(MakeStep(&rng));
  auto interleave = [&](std::vector<float> Step::*field, int per_b) {
    std::vector<float> out(static_cast<size_t>(kB) * kT * per_b);
    for (int b = 0; b < kB; ++b) {
      for (int t = 0; t < kT; ++t) {
        std::memcpy(&out[(static_cast<size_t>(b) * kT + t) * per_b],
                    &(steps[t].*field)[static_cast<size_t>(b) * per_b], 4 * per_b);
      }
    }
    return out;
  };
  const std::vector<float> q = interleave(&Step::q, g.h_qk * g.d_k),
                           k = interleave(&Step::k, g.h_qk * g.d_k),
                           v = interleave(&Step::v, g.h_v * g.d_v),
                           gg = interleave(&Step::g, g.h_v), beta = interleave(&Step::beta, g.h_v);
  PrefillCall call;
  call.layer = 1;
  call.tokens = kT;
  call.slots = inline_slots;
  call.q = HostTensor::Fp32(q);
  call.k = HostTensor::Fp32(k);
  call.v = HostTensor::Fp32(v);
  call.g = gg;
  call.beta = beta;
  call.want_output = true;
  auto want = client_->Prefill(kModel, call);
  ASSERT_TRUE(want.ok()) << want.status();

  auto session = *DataPlaneSession::Open(client_.get());
  const std::vector<const std::vector<float>*> parts = {&q, &k, &v, &gg, &beta};
  int64_t total = 0;
  std::vector<int64_t> offsets;
  for (const auto* p : parts) {
    offsets.push_back(total);
    total += Up16(4 * p->size());
  }
  WorkerBuffer* in = *session->CreateBuffer(total);
  WorkerBuffer* out = *session->CreateBuffer(4 * want->size());
  for (size_t i = 0; i < parts.size(); ++i) {
    ASSERT_TRUE(in->Write(offsets[i], parts[i]->data(), 4 * parts[i]->size()).ok());
  }
  v1::PrefillRequest req;
  req.set_model_id(kModel);
  for (const SlotHandle& h : ref_slots) {
    v1::SlotHandle* p = req.add_slots();
    p->set_id(h.id);
    p->set_generation(h.generation);
  }
  v1::PrefillTokens* t = req.mutable_tokens();
  t->set_layer(1);
  t->set_want_output(true);
  const std::vector<std::vector<int64_t>> shapes = {{kB, kT, g.h_qk, g.d_k},
                                                    {kB, kT, g.h_qk, g.d_k},
                                                    {kB, kT, g.h_v, g.d_v},
                                                    {kB, kT, g.h_v},
                                                    {kB, kT, g.h_v}};
  v1::Tensor* tensors[] = {t->mutable_q(), t->mutable_k(), t->mutable_v(), t->mutable_g(),
                           t->mutable_beta()};
  for (size_t i = 0; i < parts.size(); ++i) {
    tensors[i]->set_dtype(v1::DTYPE_FP32);
    for (int64_t d : shapes[i]) tensors[i]->add_shape(d);
    tensors[i]->mutable_ref()->set_buffer_id(in->id());
    tensors[i]->mutable_ref()->set_offset(offsets[i]);
  }
  t->mutable_o_ref()->set_buffer_id(out->id());
  v1::PrefillResponse resp;
  Tenant& caller = server_->service().default_tenant();
  // o does not fit at a later offset.
  t->mutable_o_ref()->set_offset(16);
  absl::Status st = server_->service().DoPrefill(caller, req, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), StartsWith("tokens.o.ref: bytes [16, "));
  t->mutable_o_ref()->set_offset(0);
  ASSERT_TRUE(server_->service().DoPrefill(caller, req, &resp).ok());
  EXPECT_FALSE(resp.o().has_ref() && resp.o().data().size() > 0);
  std::vector<float> got(want->size());
  ASSERT_TRUE(out->Read(0, got.data(), 4 * got.size()).ok());
  EXPECT_EQ(got, *want);
  EXPECT_EQ(Export(ref_slots), Export(inline_slots));
}

TEST_F(DataPlaneTest, AttachNeedsSharedPoolsOnCpu) {
  StateCacheServer::Options o = LoopbackOptions(16 << 20, 1 << 20);
  auto plain = *StateCacheServer::Create(std::move(o));
  auto client = *StateCacheClient::Connect(LoopbackTarget(*plain));
  ModelRegistration r;
  r.model_id = kModel;
  r.geometry = Geo();
  r.format = "damp:8";
  r.slots = 4;
  ASSERT_TRUE(client->RegisterModel(r).ok());
  auto h = *client->AllocateSlots(kModel, 1);
  auto session = *DataPlaneSession::Open(client.get());
  absl::Status st = AttachedSession::Attach(session.get(), kModel, h).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), HasSubstr("--shared_pools"));
}

// ---------------------------------------------------------------------------
// SubmitUpdates (the streamed fast path)

// The done word sits in its own small buffer.
struct DoneWord {
  WorkerBuffer* buffer = nullptr;
  uint64_t value() const {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(buffer->data()), __ATOMIC_ACQUIRE);
  }
};

TEST_F(DataPlaneTest, SubmitUpdatesIsBitIdenticalToUnaryUpdate) {
  Reference ref;
  std::vector<SlotHandle> unary_slots = Alloc(), stream_slots = Alloc();
  auto session = *DataPlaneSession::Open(client_.get());
  Arena unary = MakeArena(session.get()), streamed = MakeArena(session.get());
  DoneWord done{*session->CreateBuffer(64)};
  auto sub = UpdateSubmitter::Open(session.get(), kModel, {done.buffer, 0});
  ASSERT_TRUE(sub.ok()) << sub.status();
  std::mt19937 rng(11);
  for (int step = 0; step < 3; ++step) {
    for (int layer = 0; layer < Geo().layers; ++layer) {
      const Step s = MakeStep(&rng);
      const std::vector<float> want = ref.Update(layer, s);
      ASSERT_TRUE(session->Update(kModel, Write(unary, layer, unary_slots, s)).ok());
      EXPECT_EQ(ReadO(unary), want);
      // Worker loop: write inputs, submit, wait for the done word (never for
      // the reply), read o.
      absl::StatusOr<uint64_t> seq = (*sub)->Submit(Write(streamed, layer, stream_slots, s));
      ASSERT_TRUE(seq.ok()) << seq.status();
      ASSERT_TRUE((*sub)->StreamWait(*seq).ok());
      EXPECT_GE(done.value(), *seq);
      ASSERT_EQ(ReadO(streamed), want) << "step " << step << " layer " << layer;
    }
    ASSERT_TRUE((*sub)->TakeError().ok());
  }
  ASSERT_TRUE((*sub)->Finish().ok());
  EXPECT_EQ(done.value(), 3u * Geo().layers);
  EXPECT_EQ(Export(stream_slots), Export(unary_slots));
  for (int i = 0; i < kB; ++i) EXPECT_EQ(Export(stream_slots)[i], ref.Packed(i));
}

TEST_F(DataPlaneTest, SubmitUpdatesPipelinesInMessageOrder) {
  // All layers of several steps submitted without any wait, each with its
  // own input and output regions: the server runs them in message order.
  Reference ref;
  std::vector<SlotHandle> h = Alloc();
  auto session = *DataPlaneSession::Open(client_.get());
  DoneWord done{*session->CreateBuffer(64)};
  auto sub = *UpdateSubmitter::Open(session.get(), kModel, {done.buffer, 0});
  std::mt19937 rng(12);
  std::vector<Arena> arenas;
  std::vector<std::vector<float>> want;
  for (int step = 0; step < 2; ++step) {
    for (int layer = 0; layer < Geo().layers; ++layer) {
      const Step s = MakeStep(&rng);
      want.push_back(ref.Update(layer, s));
      arenas.push_back(MakeArena(session.get()));
      ASSERT_TRUE(sub->Submit(Write(arenas.back(), layer, h, s)).ok());
    }
  }
  ASSERT_TRUE(sub->Wait(sub->last_seq()).ok());
  for (size_t i = 0; i < arenas.size(); ++i) EXPECT_EQ(ReadO(arenas[i]), want[i]) << i;
  ASSERT_TRUE(sub->Finish().ok());
  EXPECT_EQ(sub->server_times().replies, static_cast<int64_t>(arenas.size()));
}

TEST_F(DataPlaneTest, SubmitUpdatesReportsErrorsPerSubmission) {
  Reference ref;
  std::vector<SlotHandle> h = Alloc(), other = Alloc();
  const std::vector<std::string> other_before = Export(other);
  auto session = *DataPlaneSession::Open(client_.get());
  Arena a = MakeArena(session.get());
  DoneWord done{*session->CreateBuffer(64)};
  auto sub = *UpdateSubmitter::Open(session.get(), kModel, {done.buffer, 16});
  std::mt19937 rng(13);
  const Step s0 = MakeStep(&rng), s1 = MakeStep(&rng);
  // 1: fine.
  const uint64_t ok1 = *sub->Submit(Write(a, 0, h, s0));
  EXPECT_EQ(ReadO(a), (sub->StreamWait(ok1).ok(), ref.Update(0, s0)));
  // 2: q out of the buffer (no stray read, nothing written).
  RefUpdateCall bad = Write(a, 1, h, s1);
  bad.q.offset = a.in_bytes;
  const uint64_t e2 = *sub->Submit(bad);
  // 3: misaligned o.
  bad = Write(a, 1, h, s1);
  bad.o.offset = 4;
  const uint64_t e3 = *sub->Submit(bad);
  // 4: layer out of range.
  bad = Write(a, 1, h, s1);
  bad.layer = Geo().layers;
  const uint64_t e4 = *sub->Submit(bad);
  // 5: a stale slot handle.
  std::vector<SlotHandle> stale = h;
  stale[1].generation += 1;
  const uint64_t e5 = *sub->Submit(Write(a, 1, stale, s1));
  // 6: fine again: the stream goes on after errors.
  const uint64_t ok6 = *sub->Submit(Write(a, 1, h, s1));
  ASSERT_TRUE(sub->StreamWait(ok6).ok());
  EXPECT_EQ(ReadO(a), ref.Update(1, s1));

  absl::Status st = sub->Wait(e2);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), StartsWith("update.q.ref: "));
  st = sub->Wait(e3);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), StartsWith("update.o.ref: "));
  st = sub->Wait(e4);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), StartsWith("update.layer: "));
  st = sub->Wait(e5);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), StartsWith("update.slots[1]"));
  EXPECT_TRUE(sub->Wait(ok1).ok());
  EXPECT_TRUE(sub->Wait(ok6).ok());
  EXPECT_TRUE(sub->TakeError().ok());  // all four were taken by Wait
  ASSERT_TRUE(sub->Finish().ok());
  // Failed submissions advanced the done word too; the word sits at its
  // offset; slots outside the calls are untouched, and the called slots
  // hold exactly the two good updates.
  EXPECT_EQ(done.value(), 0u);
  EXPECT_EQ(__atomic_load_n(reinterpret_cast<const uint64_t*>(done.buffer->data() + 16),
                            __ATOMIC_ACQUIRE),
            ok6);
  EXPECT_EQ(Export(other), other_before);
  for (int i = 0; i < kB; ++i) EXPECT_EQ(Export(h)[i], ref.Packed(i));
}

// A raw SubmitUpdates stream (for messages UpdateSubmitter never sends).
class RawStream {
 public:
  explicit RawStream(StateCacheClient* c) {
    c->PrepareContext(&ctx_);
    stream_ = c->stub().SubmitUpdates(&ctx_);
  }
  bool Send(const v1::SubmitUpdatesRequest& m) { return stream_->Write(m); }
  absl::StatusOr<v1::SubmitUpdatesResponse> Next() {
    v1::SubmitUpdatesResponse r;
    if (stream_->Read(&r)) return r;
    return absl::OutOfRangeError("stream ended");
  }
  absl::Status Close() {
    stream_->WritesDone();
    v1::SubmitUpdatesResponse r;
    while (stream_->Read(&r)) {
    }
    return FromGrpcStatus(stream_->Finish());
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SubmitUpdatesRequest, v1::SubmitUpdatesResponse>>
      stream_;
};

TEST_F(DataPlaneTest, SubmitUpdatesRejectsBadOpenAndBadSubmissions) {
  std::vector<SlotHandle> h = Alloc();
  auto session = *DataPlaneSession::Open(client_.get());
  Arena a = MakeArena(session.get());
  WorkerBuffer* done = *session->CreateBuffer(64);
  v1::SubmitUpdatesRequest good_open;
  good_open.mutable_open()->set_session_id(session->id());
  good_open.mutable_open()->set_model_id(kModel);
  good_open.mutable_open()->mutable_done_ref()->set_buffer_id(done->id());
  struct Case {
    std::function<void(v1::SubmitUpdatesRequest*)> edit;
    absl::StatusCode code;
    std::string prefix;
  };
  const std::vector<Case> cases = {
      {[](v1::SubmitUpdatesRequest* m) { m->mutable_update(); },
       absl::StatusCode::kInvalidArgument, "open: "},
      {[](v1::SubmitUpdatesRequest* m) { m->mutable_open()->set_session_id(7); },
       absl::StatusCode::kNotFound, "open.session_id: "},
      {[](v1::SubmitUpdatesRequest* m) { m->mutable_open()->set_model_id("nope"); },
       absl::StatusCode::kNotFound, "open.model_id: "},
      {[](v1::SubmitUpdatesRequest* m) { m->mutable_open()->clear_done_ref(); },
       absl::StatusCode::kInvalidArgument, "open.done_ref: "},
      {[](v1::SubmitUpdatesRequest* m) { m->mutable_open()->mutable_done_ref()->set_offset(64); },
       absl::StatusCode::kInvalidArgument, "open.done_ref: "},
      {[](v1::SubmitUpdatesRequest* m) { m->mutable_open()->add_cuda_ipc_events(std::string(64, 'x')); },
       absl::StatusCode::kInvalidArgument, "open.cuda_ipc_events: "},
  };
  for (const Case& c : cases) {
    RawStream raw(client_.get());
    v1::SubmitUpdatesRequest m = good_open;
    c.edit(&m);
    raw.Send(m);
    absl::Status st = raw.Close();
    EXPECT_EQ(st.code(), c.code) << c.prefix << st;
    EXPECT_THAT(std::string(st.message()), StartsWith(c.prefix));
  }
  // Submission-level errors a well-behaved client never sends.
  RawStream raw(client_.get());
  ASSERT_TRUE(raw.Send(good_open));
  ASSERT_EQ(raw.Next()->seq(), 0u);  // the open ack
  std::mt19937 rng(14);
  v1::SubmitUpdatesRequest m;
  *m.mutable_update()->mutable_update() = *session->BuildUpdate(kModel, Write(a, 0, h, MakeStep(&rng)));
  auto expect_error = [&](uint64_t seq, absl::StatusCode code, absl::string_view prefix) {
    m.mutable_update()->set_seq(seq);
    ASSERT_TRUE(raw.Send(m));
    absl::StatusOr<v1::SubmitUpdatesResponse> r = raw.Next();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->error().code(), static_cast<int>(code)) << r->error().message();
    EXPECT_THAT(r->error().message(), StartsWith(std::string(prefix)));
  };
  m.mutable_update()->mutable_wait()->set_index(0);  // no ring on the CPU backend
  expect_error(1, absl::StatusCode::kInvalidArgument, "wait.index: ");
  m.mutable_update()->clear_wait();
  expect_error(1, absl::StatusCode::kInvalidArgument, "seq: ");  // not increasing
  m.mutable_update()->mutable_update()->set_model_id("other");
  expect_error(2, absl::StatusCode::kInvalidArgument, "update.model_id: ");
  m.mutable_update()->mutable_update()->set_model_id(kModel);
  m.mutable_update()->mutable_update()->clear_o_ref();
  expect_error(3, absl::StatusCode::kInvalidArgument, "update.o_ref: ");
  EXPECT_TRUE(raw.Close().ok());
  EXPECT_EQ(__atomic_load_n(reinterpret_cast<const uint64_t*>(done->data()), __ATOMIC_ACQUIRE),
            3u);
}

// A server that accepts a SubmitUpdates stream and never answers a
// submission (a server that died mid-step, from the worker's view).
class SilentServer final : public v1::StateCache::Service {
 public:
  grpc::Status OpenSession(grpc::ServerContext*, const v1::OpenSessionRequest*,
                           v1::OpenSessionResponse* resp) override {
    resp->set_session_id(1);
    resp->set_lease_ms(60000);
    resp->set_backend("cpu");
    return grpc::Status::OK;
  }
  grpc::Status CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest*,
                            v1::CloseSessionResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status RegisterBuffer(grpc::ServerContext*, const v1::RegisterBufferRequest*,
                              v1::RegisterBufferResponse* resp) override {
    resp->set_buffer_id(++buffers_);
    return grpc::Status::OK;
  }
  grpc::Status DescribeModel(grpc::ServerContext*, const v1::DescribeModelRequest* req,
                             v1::ModelInfo* resp) override {
    const ModelGeometry g = Geo();
    resp->set_model_id(req->model_id());
    resp->mutable_geometry()->set_arch(v1::ARCH_GDN);
    resp->mutable_geometry()->set_layers(g.layers);
    resp->mutable_geometry()->set_h_qk(g.h_qk);
    resp->mutable_geometry()->set_h_v(g.h_v);
    resp->mutable_geometry()->set_d_k(g.d_k);
    resp->mutable_geometry()->set_d_v(g.d_v);
    return grpc::Status::OK;
  }
  grpc::Status SubmitUpdates(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::SubmitUpdatesResponse, v1::SubmitUpdatesRequest>* stream)
      override {
    v1::SubmitUpdatesRequest m;
    if (!stream->Read(&m)) return grpc::Status::OK;
    stream->Write(v1::SubmitUpdatesResponse());  // the open ack
    while (stream->Read(&m)) {
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone");
  }

 private:
  std::atomic<uint64_t> buffers_{0};
};

TEST(UpdateSubmitterTest, FinishReleasesWaitersOfUnansweredSubmissions) {
  SilentServer service;
  grpc::ServerBuilder builder;
  const std::string socket = absl::StrCat("unix:/tmp/sc_dp_silent_", getpid(), ".sock");
  builder.AddListeningPort(socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto client = *StateCacheClient::Connect(socket);
  auto session = *DataPlaneSession::Open(client.get());
  WorkerBuffer* in = *session->CreateBuffer(1 << 16);
  WorkerBuffer* done_buffer = *session->CreateBuffer(64);
  DoneWord done{done_buffer};
  auto sub = *UpdateSubmitter::Open(session.get(), "dp", {done_buffer, 0});
  RefUpdateCall c;
  c.slots = {SlotHandle{1, 1}};
  c.q = c.k = c.v = c.g = c.beta = c.o = {in, 0};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sub->Submit(c).ok());
  EXPECT_EQ(done.value(), 0u);  // nothing was answered or stored
  const absl::Status st = sub->Finish();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(done.value(), 3u);  // released: no StreamWait blocks
  EXPECT_TRUE(sub->StreamWait(3).ok());
  EXPECT_EQ(sub->Wait(2).code(), absl::StatusCode::kUnavailable);
  sub.reset();
  session.reset();
  server->Shutdown();
}

TEST_F(DataPlaneTest, CancellingASubmitStreamReleasesNothing) {
  Reference ref;
  std::vector<SlotHandle> h = Alloc();
  DataPlane* dp = server_->service().dataplane();
  auto session = *DataPlaneSession::Open(client_.get());
  Arena a = MakeArena(session.get());
  DoneWord done{*session->CreateBuffer(64)};
  std::mt19937 rng(15);
  {
    auto sub = *UpdateSubmitter::Open(session.get(), kModel, {done.buffer, 0});
    const Step s = MakeStep(&rng);
    const uint64_t seq = *sub->Submit(Write(a, 0, h, s));
    ASSERT_TRUE(sub->StreamWait(seq).ok());
    EXPECT_EQ(ReadO(a), ref.Update(0, s));
    for (int i = 0; i < 4; ++i) (void)sub->Submit(Write(a, 1, h, s));
    // Replies may all have arrived before the cancellation (then OK).
    const absl::Status st = sub->Cancel();
    EXPECT_TRUE(st.ok() || st.code() == absl::StatusCode::kCancelled) << st;
    // Every submission is done or released: no StreamWait blocks.
    EXPECT_EQ(done.value(), sub->last_seq());
    EXPECT_TRUE(sub->StreamWait(sub->last_seq()).ok());
  }
  // The session, its buffers and the slots are as before; the slots are not
  // left busy, so a unary Update and a new stream work.
  EXPECT_EQ(dp->session_count(), 1);
  EXPECT_EQ(dp->buffer_count(), 3);
  EXPECT_EQ(dp->attached_count(), 0);
  EXPECT_TRUE(session->Renew().ok());
  const Step s = MakeStep(&rng);
  ASSERT_TRUE(session->Update(kModel, Write(a, 0, h, s)).ok());
  EXPECT_GE(done.value(), 1u);  // the cancelled stream's last store
  auto sub = *UpdateSubmitter::Open(session.get(), kModel, {done.buffer, 0});
  EXPECT_EQ(done.value(), 0u);  // a new stream restarts at seq 1
  const uint64_t seq = *sub->Submit(Write(a, 0, h, s));
  EXPECT_TRUE(sub->Wait(seq).ok());
  EXPECT_TRUE(sub->Finish().ok());
  EXPECT_EQ(done.value(), 1u);
}

}  // namespace
}  // namespace statecache
