// Fault tests of statecached on loopback (in-process server, CPU backend):
// a client cancelling mid-stream, clients that die holding slots (slot
// leases), pool exhaustion (checkpoint eviction first, then
// RESOURCE_EXHAUSTED), and a restart reloading models from --data_dir.
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/statecache_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/log.h"
#include "server/loopback.h"
#include "server/server.h"
#include "tests/load/workload.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kModel[] = "faults-gdn";

ModelGeometry Geometry() {
  return ModelGeometry{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};
}

StateCacheServer::Options Loopback() { return LoopbackOptions(16 << 20, 16 << 20); }

std::unique_ptr<StateCacheServer> Start(StateCacheServer::Options so = Loopback()) {
  SetLoggingEnabled(false);
  auto s = StateCacheServer::Create(std::move(so));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::unique_ptr<StateCacheClient> Connect(const StateCacheServer& s) {
  auto c = StateCacheClient::Connect(LoopbackTarget(s));
  EXPECT_TRUE(c.ok());
  return std::move(*c);
}

ModelRegistration Registration(int64_t slots, int64_t checkpoints) {
  ModelRegistration r;
  r.model_id = kModel;
  r.geometry = Geometry();
  r.format = "damp:8";
  r.slots = slots;
  r.checkpoints = checkpoints;
  return r;
}

void SetTensor(const std::vector<float>& values, std::vector<int64_t> shape, v1::Tensor* t) {
  t->set_dtype(v1::DTYPE_FP32);
  for (int64_t d : shape) t->add_shape(d);
  t->set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
}

// Update request `i` (layer 0) of the cancel test for one slot.
v1::UpdateRequest UpdateRequestFor(SlotHandle slot, int i) {
  WorkloadSpec spec;
  spec.geometry = Geometry();
  OpInputs in = MakeOpInputs(spec, /*conversation=*/99, /*turn=*/0, i, /*layer=*/0, 1);
  const ModelGeometry g = Geometry();
  v1::UpdateRequest req;
  req.set_model_id(kModel);
  req.set_layer(0);
  req.set_sequence(i);
  v1::SlotHandle* h = req.add_slots();
  h->set_id(slot.id);
  h->set_generation(slot.generation);
  SetTensor(in.q, {1, g.h_qk, g.d_k}, req.mutable_q());
  SetTensor(in.k, {1, g.h_qk, g.d_k}, req.mutable_k());
  SetTensor(in.v, {1, g.h_v, g.d_v}, req.mutable_v());
  SetTensor(in.g, {1, g.h_v}, req.mutable_g());
  SetTensor(in.beta, {1, g.h_v}, req.mutable_beta());
  return req;
}

TEST(FaultsTest, CancelMidStreamLeavesTheSlotAtAPrefixOfTheSentUpdates) {
  auto server = Start();
  auto client = Connect(*server);
  ASSERT_TRUE(client->RegisterModel(Registration(4, 0)).ok());
  auto slots = client->AllocateSlots(kModel, 2);
  ASSERT_TRUE(slots.ok());
  const SlotHandle a = (*slots)[0], b = (*slots)[1];

  constexpr int kSent = 40, kRead = 5;
  {
    grpc::ClientContext ctx;
    auto stream = client->stub().UpdateStream(&ctx);
    for (int i = 0; i < kSent; ++i) ASSERT_TRUE(stream->Write(UpdateRequestFor(a, i)));
    for (int i = 0; i < kRead; ++i) {
      v1::UpdateResponse resp;
      ASSERT_TRUE(stream->Read(&resp));
      ASSERT_FALSE(resp.has_error()) << resp.error().message();
      EXPECT_EQ(resp.sequence(), static_cast<uint64_t>(i));
    }
    ctx.TryCancel();  // the client goes away mid-stream
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The slot is not stuck, and once the server stopped applying updates its
  // state is that of the first k sent updates, kRead <= k <= kSent.
  std::string packed;
  for (int tries = 0;; ++tries) {
    auto e1 = client->Export(kModel, a);
    ASSERT_TRUE(e1.ok()) << e1.status();
    absl::SleepFor(absl::Milliseconds(100));
    auto e2 = client->Export(kModel, a);
    ASSERT_TRUE(e2.ok());
    if (e1->packed == e2->packed) {
      packed = e1->packed;
      break;
    }
    ASSERT_LT(tries, 50) << "slot state keeps changing after the cancel";
  }
  int matched = -1;
  for (int k = 0; k <= kSent && matched < 0; ++k) {
    auto e = client->Export(kModel, b);
    ASSERT_TRUE(e.ok());
    if (k >= kRead && e->packed == packed) matched = k;
    if (k == kSent) break;
    v1::UpdateResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(client->stub().Update(&ctx, UpdateRequestFor(b, k), &resp).ok());
  }
  EXPECT_GE(matched, kRead) << "the cancelled slot is not at any prefix of the stream";
  // And it keeps working.
  v1::UpdateResponse resp;
  grpc::ClientContext ctx;
  EXPECT_TRUE(client->stub().Update(&ctx, UpdateRequestFor(a, 0), &resp).ok());
  for (const auto& m : server->registry().List()) EXPECT_TRUE(m->slots->CheckInvariants().ok());
}

TEST(FaultsTest, SlotsOfADeadClientComeBackAfterTheIdleTimeout) {
  StateCacheServer::Options so = Loopback();
  so.slot_idle_timeout = absl::Milliseconds(400);
  auto server = Start(std::move(so));
  auto survivor = Connect(*server);
  ASSERT_TRUE(survivor->RegisterModel(Registration(4, 0)).ok());
  auto kept = survivor->AllocateSlots(kModel, 1);
  ASSERT_TRUE(kept.ok());
  std::vector<SlotHandle> lost;
  {
    auto dying = Connect(*server);
    auto got = dying->AllocateSlots(kModel, 3);
    ASSERT_TRUE(got.ok());
    lost = *got;
  }  // the client disappears without releasing
  auto full = survivor->AllocateSlots(kModel, 1);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);

  // The survivor keeps using its slot (every 100 ms) while the dead client's
  // slots expire.
  WorkloadSpec spec;
  spec.model_id = kModel;
  spec.geometry = Geometry();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  bool back = false;
  while (absl::Now() < deadline && !back) {
    const OpInputs in = MakeOpInputs(spec, 1, 0, 0, 0, 1);
    const UpdateCall call = DecodeCallOf(in, /*layer=*/0, (*kept)[0]);
    ASSERT_TRUE(survivor->Update(kModel, call).ok()) << "a slot in use must never expire";
    absl::SleepFor(absl::Milliseconds(100));
    auto stats = survivor->GetStats(kModel);
    ASSERT_TRUE(stats.ok());
    back = stats->models(0).stats().slots_allocated() == 1;
  }
  ASSERT_TRUE(back) << "dead client's slots did not come back";
  EXPECT_EQ(survivor->Export(kModel, lost[0]).status().code(),
            absl::StatusCode::kFailedPrecondition);  // stale handle
  auto again = survivor->AllocateSlots(kModel, 3);
  EXPECT_TRUE(again.ok()) << again.status();
  for (const auto& m : server->registry().List()) EXPECT_TRUE(m->slots->CheckInvariants().ok());
}

TEST(FaultsTest, PoolExhaustionEvictsCheckpointsFirstThenResourceExhausted) {
  auto server = Start();
  auto client = Connect(*server);
  ASSERT_TRUE(client->RegisterModel(Registration(2, 2)).ok());
  auto slots = client->AllocateSlots(kModel, 2);
  ASSERT_TRUE(slots.ok());
  auto more = client->AllocateSlots(kModel, 1);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(more.status().message()), StartsWith("slots: requested 1 but only 0"));

  const SlotHandle s = (*slots)[0];
  const std::vector<int32_t> t1 = {1}, t2 = {1, 2}, t3 = {1, 2, 3}, t4 = {1, 2, 3, 4};
  ASSERT_TRUE(client->Snapshot(kModel, s, t1).ok());
  ASSERT_TRUE(client->Snapshot(kModel, s, t2).ok());
  // Full: the LRU checkpoint (t1) is evicted to make room.
  v1::SnapshotRequest req;
  req.set_model_id(kModel);
  req.mutable_slot()->set_id(s.id);
  req.mutable_slot()->set_generation(s.generation);
  for (int32_t t : t3) req.mutable_tokens()->add_ids(t);
  v1::SnapshotResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(client->stub().Snapshot(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(resp.evicted(), 1);
  auto miss = client->LookupPrefix(kModel, t1);
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->hit);
  // Lease both remaining checkpoints: nothing may be evicted now.
  auto l2 = client->LookupPrefix(kModel, t2, absl::Seconds(30));
  auto l3 = client->LookupPrefix(kModel, t3, absl::Seconds(30));
  ASSERT_TRUE(l2.ok() && l2->hit && l3.ok() && l3->hit);
  auto pinned = client->Snapshot(kModel, s, t4);
  EXPECT_EQ(pinned.status().code(), absl::StatusCode::kResourceExhausted) << pinned.status();
  // Consuming a lease (Restore) unpins: eviction works again.
  ASSERT_TRUE(client->Restore(kModel, (*slots)[1], l2->key, l2->lease_id).ok());
  EXPECT_TRUE(client->Snapshot(kModel, s, t4).ok());
  auto m = server->registry().Find(kModel);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->checkpoints->stats().evictions, 2);
  EXPECT_TRUE((*m)->checkpoints->CheckInvariants().ok());
  EXPECT_TRUE((*m)->slots->CheckInvariants().ok());
}

std::string TempDir(const char* name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base ? base : "/tmp", "/", name, "-", getpid());
  return dir;
}

TEST(FaultsTest, RestartReloadsModelsAndLayoutsButNotStates) {
  const std::string data_dir = TempDir("restart");
  ModelRegistration calibrated = Registration(3, 2);
  calibrated.model_id = "calibrated";
  calibrated.format = "damp-sr:8";
  const ModelGeometry g = Geometry();
  for (int l = 0; l < g.layers; ++l) {
    for (int h = 0; h < g.h_v; ++h) {
      for (int r = 0; r < g.d_k; ++r) calibrated.key_perm.push_back((r * 7 + l + h) % g.d_k);
      for (int j = 0; j < g.d_v; ++j) {
        calibrated.value_order.push_back(g.d_v - 1 - j);
        calibrated.value_scale.push_back(0.5f + 0.01f * j);
      }
    }
  }
  v1::ModelInfo before;
  SlotHandle old_slot;
  {
    StateCacheServer::Options so = Loopback();
    so.persistence.data_dir = data_dir;
    auto server = Start(std::move(so));
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(server->models_reloaded(), 0);
    auto client = Connect(*server);
    ASSERT_TRUE(client->RegisterModel(Registration(4, 2)).ok());
    auto info = client->RegisterModel(calibrated);
    ASSERT_TRUE(info.ok()) << info.status();
    before = *info;
    auto slots = client->AllocateSlots("calibrated", 1);
    ASSERT_TRUE(slots.ok());
    old_slot = (*slots)[0];
    ASSERT_TRUE(client->Snapshot("calibrated", old_slot, std::vector<int32_t>{5, 6}).ok());
    server->Shutdown(absl::Seconds(1));
  }
  {
    StateCacheServer::Options so = Loopback();
    so.persistence.data_dir = data_dir;
    auto server = Start(std::move(so));
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(server->models_reloaded(), 2);
    auto client = Connect(*server);
    auto after = client->DescribeModel("calibrated");
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->tags().layout_fingerprint(), before.tags().layout_fingerprint());
    EXPECT_EQ(after->tags().SerializeAsString(), before.tags().SerializeAsString());
    EXPECT_FALSE(after->identity_layout());
    EXPECT_EQ(after->stats().slot_capacity(), 3);
    EXPECT_EQ(after->stats().checkpoint_capacity(), 2);
    // States are volatile: no slot, no checkpoint survived.
    EXPECT_EQ(after->stats().slots_allocated(), 0);
    EXPECT_EQ(client->Export("calibrated", old_slot).status().code(), absl::StatusCode::kNotFound);
    auto lookup = client->LookupPrefix("calibrated", std::vector<int32_t>{5, 6});
    ASSERT_TRUE(lookup.ok());
    EXPECT_FALSE(lookup->hit);
    // Dropping removes the registration from data_dir too.
    ASSERT_TRUE(client->DropModel(kModel).ok());
    server->Shutdown(absl::Seconds(1));
  }
  {
    StateCacheServer::Options so = Loopback();
    so.persistence.data_dir = data_dir;
    auto server = Start(std::move(so));
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(server->models_reloaded(), 1);
    EXPECT_EQ(server->registry().Find(kModel).status().code(), absl::StatusCode::kNotFound);
  }
}

}  // namespace
}  // namespace statecache
