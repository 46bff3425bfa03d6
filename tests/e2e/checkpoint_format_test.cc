// RegisterModelRequest.checkpoint_format on loopback (in-process server, CPU
// backend, one device checkpoint, a host tier): the server default applies,
// bad specs are INVALID_ARGUMENT naming the field, a checkpoint evicted to
// the host tier is stored in the cold format, and a lookup that promotes it
// reports that format and restores states within its error.
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/statecache_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/log.h"
#include "server/loopback.h"
#include "server/server.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

ModelGeometry Geometry() {
  return ModelGeometry{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/64};
}

class CheckpointFormatRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLoggingEnabled(false);
    StateCacheServer::Options so = LoopbackOptions(16 << 20, 16 << 20);
    so.memory.tiers.host_checkpoint_bytes = 4 << 20;
    so.memory.tiers.checkpoint_format = "int8-hadamard";
    auto s = StateCacheServer::Create(std::move(so));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    client_ = StateCacheClient::Connect(LoopbackTarget(*server_)).value();
  }

  ModelRegistration Registration(const std::string& id, const std::string& checkpoint_format) {
    ModelRegistration r;
    r.model_id = id;
    r.geometry = Geometry();
    r.format = "damp:16";
    r.slots = 2;
    r.checkpoints = 1;
    r.checkpoint_format = checkpoint_format;
    return r;
  }

  std::unique_ptr<StateCacheServer> server_;
  std::unique_ptr<StateCacheClient> client_;
};

TEST_F(CheckpointFormatRpcTest, BadSpecsAndTheServerDefault) {
  for (const char* bad : {"int3", "damp-sr", "damp:99"}) {
    auto m = client_->RegisterModel(Registration("bad", bad));
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("checkpoint_format: ")) << bad;
  }
  auto d = client_->RegisterModel(Registration("defaulted", ""));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format(), "damp:16");
  EXPECT_EQ(d->checkpoint_format(), "int8-hadamard");
  EXPECT_GT(d->checkpoint_format_slot_bytes(), 0);
  EXPECT_LT(d->checkpoint_format_slot_bytes(), d->slot_bytes());
  auto same = client_->RegisterModel(Registration("same", "damp:16"));
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->checkpoint_format(), "damp:16");
  EXPECT_EQ(same->checkpoint_format_slot_bytes(), same->slot_bytes());
}

TEST_F(CheckpointFormatRpcTest, ColdHitReportsItsFormatAndRestoresWithinItsError) {
  auto info = client_->RegisterModel(Registration("m", "int4-hadamard"));
  ASSERT_TRUE(info.ok()) << info.status();
  const ModelGeometry g = Geometry();
  std::vector<float> states(static_cast<size_t>(g.HeadsPerSlot()) * g.d_k * g.d_v);
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (float& x : states) x = n(rng);
  auto slots = client_->AllocateSlots("m", 2);
  ASSERT_TRUE(slots.ok()) << slots.status();
  ASSERT_TRUE(client_->PrefillStates("m", {(*slots)[0]}, states).ok());
  auto held = client_->Unpack("m", (*slots)[0]);  // what the damp:16 slot holds
  ASSERT_TRUE(held.ok()) << held.status();
  const std::vector<int32_t> tokens = {4, 5, 6};
  auto key = client_->Snapshot("m", (*slots)[0], tokens);
  ASSERT_TRUE(key.ok()) << key.status();
  ASSERT_TRUE(client_->Snapshot("m", (*slots)[1], std::vector<int32_t>{9}).ok());  // evicts

  v1::LookupPrefixRequest req;
  req.set_model_id("m");
  for (int32_t t : tokens) req.mutable_tokens()->add_ids(t);
  v1::LookupPrefixResponse resp;
  grpc::ClientContext ctx;
  client_->PrepareContext(&ctx);
  ASSERT_TRUE(client_->stub().LookupPrefix(&ctx, req, &resp).ok());
  ASSERT_TRUE(resp.hit());
  EXPECT_EQ(resp.tier(), v1::CHECKPOINT_TIER_HOST);
  EXPECT_EQ(resp.checkpoint_format(), "int4-hadamard");
  EXPECT_EQ(resp.key().num_tokens(), 3);
  auto restored = client_->Restore("m", (*slots)[1], *key, resp.lease_id());
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto back = client_->Unpack("m", (*slots)[1]);
  ASSERT_TRUE(back.ok()) << back.status();
  double num = 0, den = 0;
  for (size_t i = 0; i < held->size(); ++i) {
    num += std::pow(double{(*back)[i]} - (*held)[i], 2);
    den += std::pow(double{(*held)[i]}, 2);
  }
  // int4-hadamard: about 8% relative error on Gaussian states; damp:16 bytes
  // kept unchanged would give 0.
  EXPECT_LT(std::sqrt(num / den), 0.12);
  EXPECT_GT(std::sqrt(num / den), 0.02);

  auto stats = client_->GetStats("m");
  ASSERT_TRUE(stats.ok()) << stats.status();
  const v1::ModelStats& ms = stats->models(0).stats();
  EXPECT_EQ(ms.checkpoint_transcodes_to_cold(), 2);  // {4,5,6}, then {9} on the promotion
  EXPECT_EQ(ms.checkpoint_transcodes_from_cold(), 1);
}

}  // namespace
}  // namespace statecache
