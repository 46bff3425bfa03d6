// Unpack of a checkpoint by its prefix key (issue 31, FP32 read-back for
// engines that use statecache as a checkpoint store) on loopback, CPU
// backend: the checkpoint's FP32 states equal the slot's Unpack at snapshot
// time bit for bit (fp32), also after it was demoted to the host tier and
// through a lease (which stays usable); unknown keys are NOT_FOUND, states
// over --max_unpack_bytes RESOURCE_EXHAUSTED naming the limit.
#include <cstdint>
#include <cstring>
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
#include "server/pool/prefix_key.h"
#include "server/server.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

const ModelGeometry kGeo{Arch::kGdn, 2, 1, 2, 32, 32};  // 2 x 2 x 32 x 32 = 4096 values
constexpr int64_t kStateBytes = 2 * 2 * 32 * 32 * 4;

PrefixKey Key(int n) {
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = 40 + i;
  return Sha256KeyOfTokens(tokens);
}

std::vector<float> RandomStates(int seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> s(kStateBytes / 4);
  for (float& x : s) x = normal(rng);
  return s;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

class UnpackCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLoggingEnabled(false);
    StateCacheServer::Options so = LoopbackOptions(16 << 20, 16 << 20);
    so.memory.tiers.host_checkpoint_bytes = 4 * kStateBytes;  // per model
    so.limits.max_unpack_bytes = kStateBytes;           // kGeo fits exactly
    auto server = StateCacheServer::Create(std::move(so));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto client = StateCacheClient::Connect(LoopbackTarget(*server_));
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
    ASSERT_TRUE(client_->WaitForReady(absl::Seconds(5)).ok());
  }

  void Register(const std::string& id, ModelGeometry geo, int checkpoints) {
    ModelRegistration r;
    r.model_id = id;
    r.geometry = geo;
    r.format = "fp32";
    r.slots = 2;
    r.checkpoints = checkpoints;
    auto info = client_->RegisterModel(r);
    ASSERT_TRUE(info.ok()) << info.status();
  }

  std::unique_ptr<StateCacheServer> server_;
  std::unique_ptr<StateCacheClient> client_;
};

TEST_F(UnpackCheckpointTest, EqualsTheSlotsUnpackAtSnapshotTimeBitForBit) {
  Register("m", kGeo, /*checkpoints=*/1);
  auto slots = client_->AllocateSlots("m", 1);
  ASSERT_TRUE(slots.ok());
  const SlotHandle slot = (*slots)[0];
  std::vector<std::vector<float>> at_snapshot;
  for (int n = 1; n <= 2; ++n) {  // 1 is demoted to the host tier by 2
    ASSERT_TRUE(client_->PrefillStates("m", {slot}, RandomStates(n)).ok());
    auto unpacked = client_->Unpack("m", slot);
    ASSERT_TRUE(unpacked.ok()) << unpacked.status();
    EXPECT_TRUE(SameBits(*unpacked, RandomStates(n)));
    at_snapshot.push_back(*unpacked);
    ASSERT_TRUE(client_->SnapshotKey("m", slot, Key(n)).ok());
  }
  ASSERT_TRUE(client_->PrefillStates("m", {slot}, RandomStates(99)).ok());  // slot moves on

  auto c2 = client_->UnpackCheckpoint("m", Key(2));  // in the device arena
  ASSERT_TRUE(c2.ok()) << c2.status();
  EXPECT_TRUE(SameBits(*c2, at_snapshot[1]));
  auto c1 = client_->UnpackCheckpoint("m", Key(1));  // promoted from the host tier
  ASSERT_TRUE(c1.ok()) << c1.status();
  EXPECT_TRUE(SameBits(*c1, at_snapshot[0]));
  auto stats = client_->GetStats("m");
  ASSERT_TRUE(stats.ok() && stats->models_size() == 1) << stats.status();
  int64_t host_promotions = -1;
  for (const v1::CheckpointTierStats& t : stats->models(0).stats().checkpoint_tiers()) {
    if (t.tier() == v1::CHECKPOINT_TIER_HOST) host_promotions = t.promotions();
  }
  EXPECT_EQ(host_promotions, 1);

  // Through a lease: read, not consumed (Restore still takes it afterwards).
  auto hit = client_->LookupPrefixKeys("m", {Key(2)});
  ASSERT_TRUE(hit.ok() && hit->hit) << hit.status();
  auto leased = client_->UnpackCheckpoint("m", Key(2), hit->lease_id);
  ASSERT_TRUE(leased.ok()) << leased.status();
  EXPECT_TRUE(SameBits(*leased, at_snapshot[1]));
  auto wrong = client_->UnpackCheckpoint("m", Key(1), hit->lease_id);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("lease_id"));
  ASSERT_TRUE(client_->Restore("m", slot, Key(2), hit->lease_id).ok());
  auto restored = client_->Unpack("m", slot);
  ASSERT_TRUE(restored.ok());
  EXPECT_TRUE(SameBits(*restored, at_snapshot[1]));
}

TEST_F(UnpackCheckpointTest, UnknownKeysAreNotFoundAndBadKeysNameTheField) {
  Register("m", kGeo, /*checkpoints=*/2);
  Register("no-ckpt", kGeo, /*checkpoints=*/0);
  auto unknown = client_->UnpackCheckpoint("m", Key(7));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr(Key(7).DebugString()));
  EXPECT_EQ(client_->UnpackCheckpoint("m", Key(7), /*lease_id=*/12345).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->UnpackCheckpoint("no-ckpt", Key(7)).status().code(),
            absl::StatusCode::kNotFound);
  PrefixKey bad = Key(3);
  bad.num_tokens = 0;
  auto malformed = client_->UnpackCheckpoint("m", bad);
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.status().message(), HasSubstr("key.num_tokens"));
  // Another tenant's keys never meet: the wire key is salted with the
  // caller's tenant before the store sees it, so the raw salted form misses.
  auto slots = client_->AllocateSlots("m", 1);
  ASSERT_TRUE(slots.ok());
  ASSERT_TRUE(client_->SnapshotKey("m", (*slots)[0], Key(3)).ok());
  EXPECT_TRUE(client_->UnpackCheckpoint("m", Key(3)).ok());
  EXPECT_EQ(client_->UnpackCheckpoint("m", SaltKey("", Key(3))).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(UnpackCheckpointTest, StatesOverTheLimitAreResourceExhaustedNamingIt) {
  ModelGeometry big = kGeo;
  big.layers = 3;  // 6144 values: 24576 bytes > max_unpack_bytes 16384
  Register("big", big, /*checkpoints=*/1);
  auto slots = client_->AllocateSlots("big", 1);
  ASSERT_TRUE(slots.ok());
  ASSERT_TRUE(client_->SnapshotKey("big", (*slots)[0], Key(2)).ok());
  for (const absl::Status& s : {client_->Unpack("big", (*slots)[0]).status(),
                                client_->UnpackCheckpoint("big", Key(2)).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(s.message(), HasSubstr("max_unpack_bytes"));
    EXPECT_THAT(s.message(), HasSubstr("24576"));
  }
}

}  // namespace
}  // namespace statecache
