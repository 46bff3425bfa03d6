// Checkpoint tiers end to end (in-process server, CPU backend): checkpoints
// evicted from checkpoint memory are served from the host and disk tiers
// byte-identical, a corrupted or truncated disk file is never restored, a
// restart keeps the disk tier but not the host tier, and Updates keep
// working throughout.
#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/statecache_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/layout/state_layout.h"
#include "server/core/log.h"
#include "server/loopback.h"
#include "server/server.h"
#include "tests/load/workload.h"

namespace statecache {
namespace {

constexpr char kModel[] = "tiers-gdn";
constexpr char kFormat[] = "damp:8";

ModelGeometry Geometry() {
  return ModelGeometry{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};
}

int64_t SlotBytes() {
  return StateLayout::Identity(Geometry(), ParseFormatSpec(kFormat).value())->slot_bytes();
}

// Aux bytes each snapshot carries, one string per layer (5 bytes each).
std::vector<std::string> AuxOf(int n) {
  return {absl::StrCat("conv", n % 10), absl::StrCat("CONV", n % 10)};
}
constexpr int64_t kAuxBytes = 10;

std::string TempDir(const char* name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base ? base : "/tmp", "/", name, "-", getpid());
  EXPECT_EQ(std::system(absl::StrCat("rm -rf '", dir, "'").c_str()), 0);
  return dir;
}

// A server with 1 checkpoint of device memory per model, a host tier of one
// checkpoint and a disk tier of two.
std::unique_ptr<StateCacheServer> Start(const std::string& data_dir, const std::string& disk_dir,
                                        int host_checkpoints = 1) {
  SetLoggingEnabled(false);
  StateCacheServer::Options so = LoopbackOptions(16 << 20, 16 << 20);
  so.memory.tiers.host_checkpoint_bytes = host_checkpoints * (SlotBytes() + kAuxBytes);
  so.memory.tiers.disk_checkpoint_dir = disk_dir;
  so.memory.tiers.disk_checkpoint_bytes = 2 * (SlotBytes() + kAuxBytes);
  so.persistence.data_dir = data_dir;
  auto s = StateCacheServer::Create(std::move(so));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::unique_ptr<StateCacheClient> Connect(const StateCacheServer& s) {
  auto c = StateCacheClient::Connect(LoopbackTarget(s));
  EXPECT_TRUE(c.ok());
  return std::move(*c);
}

void SetTensor(const std::vector<float>& values, std::vector<int64_t> shape, v1::Tensor* t) {
  t->set_dtype(v1::DTYPE_FP32);
  for (int64_t d : shape) t->add_shape(d);
  t->set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
}

// One decode step (every layer) of `slot`; OK when each layer's Update is.
absl::Status Step(StateCacheClient& client, SlotHandle slot, int i) {
  const ModelGeometry g = Geometry();
  WorkloadSpec spec;
  spec.geometry = g;
  for (int layer = 0; layer < g.layers; ++layer) {
    OpInputs in = MakeOpInputs(spec, /*conversation=*/7, /*turn=*/0, i, layer, 1);
    v1::UpdateRequest req;
    req.set_model_id(kModel);
    req.set_layer(layer);
    v1::SlotHandle* h = req.add_slots();
    h->set_id(slot.id);
    h->set_generation(slot.generation);
    SetTensor(in.q, {1, g.h_qk, g.d_k}, req.mutable_q());
    SetTensor(in.k, {1, g.h_qk, g.d_k}, req.mutable_k());
    SetTensor(in.v, {1, g.h_v, g.d_v}, req.mutable_v());
    SetTensor(in.g, {1, g.h_v}, req.mutable_g());
    SetTensor(in.beta, {1, g.h_v}, req.mutable_beta());
    v1::UpdateResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = client.stub().Update(&ctx, req, &resp);
    if (!s.ok()) return absl::InternalError(s.error_message());
  }
  return absl::OkStatus();
}

std::vector<int32_t> Tokens(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = 500 + i;
  return t;
}

ModelRegistration Registration() {
  ModelRegistration r;
  r.model_id = kModel;
  r.geometry = Geometry();
  r.format = kFormat;
  r.slots = 4;
  r.checkpoints = 1;
  return r;
}

// Runs a conversation of 4 steps on `slot`, snapshotting after each step
// under the prefix of that many tokens; returns the packed slot at each
// snapshot (index n - 1). Device: 4; host: 3; disk: 2, 1.
std::vector<std::string> Conversation(StateCacheClient& client, SlotHandle slot) {
  std::vector<std::string> packed;
  for (int n = 1; n <= 4; ++n) {
    EXPECT_TRUE(Step(client, slot, n).ok());
    auto key = client.Snapshot(kModel, slot, Tokens(n), AuxOf(n));
    EXPECT_TRUE(key.ok()) << key.status();
    auto e = client.Export(kModel, slot);
    EXPECT_TRUE(e.ok()) << e.status();
    packed.push_back(e.ok() ? e->packed : "");
  }
  return packed;
}

// Looks `n` tokens up, restores the hit into `slot` and checks the bytes, the
// aux and the tier; then an Update of the restored slot must work.
void ExpectRestore(StateCacheClient& client, SlotHandle slot, int n, const std::string& packed,
                   v1::CheckpointTier tier) {
  v1::LookupPrefixRequest req;
  req.set_model_id(kModel);
  const PrefixKey want = KeyOfTokens(Tokens(n));  // this prefix only, not its shorter ones
  v1::PrefixKey* k = req.mutable_keys()->add_keys();
  k->set_hash(want.hash);
  k->set_num_tokens(want.num_tokens);
  v1::LookupPrefixResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(client.stub().LookupPrefix(&ctx, req, &resp).ok());
  ASSERT_TRUE(resp.hit()) << "prefix " << n;
  EXPECT_EQ(resp.key().num_tokens(), n);
  EXPECT_EQ(resp.tier(), tier) << "prefix " << n;
  PrefixKey key{resp.key().hash(), resp.key().num_tokens()};
  auto restored = client.Restore(kModel, slot, key, resp.lease_id());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->aux, AuxOf(n));
  auto e = client.Export(kModel, slot);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->packed == packed) << "prefix " << n << " restored different bytes";
  EXPECT_TRUE(Step(client, slot, 100 + n).ok());
}

bool Misses(StateCacheClient& client, int n) {
  const PrefixKey key = KeyOfTokens(Tokens(n));
  auto l = client.LookupPrefixKeys(kModel, absl::MakeConstSpan(&key, 1));
  return l.ok() && !l->hit;
}

const v1::CheckpointTierStats* TierStats(const v1::ModelStats& s, v1::CheckpointTier tier) {
  for (const auto& t : s.checkpoint_tiers()) {
    if (t.tier() == tier) return &t;
  }
  return nullptr;
}

std::vector<std::string> CheckpointFiles(const std::string& disk_dir) {
  std::vector<std::string> files;
  const std::string dir = absl::StrCat(disk_dir, "/_/", kModel);
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      if (absl::EndsWith(e->d_name, ".ckpt")) files.push_back(absl::StrCat(dir, "/", e->d_name));
    }
    closedir(d);
  }
  return files;
}

TEST(TiersTest, EvictedCheckpointsComeBackFromHostAndDiskByteIdentical) {
  const std::string disk_dir = TempDir("tiers-disk");
  auto server = Start(/*data_dir=*/"", disk_dir);
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  ASSERT_TRUE(client->RegisterModel(Registration()).ok());
  auto slots = client->AllocateSlots(kModel, 2);
  ASSERT_TRUE(slots.ok());
  const std::vector<std::string> packed = Conversation(*client, (*slots)[0]);
  EXPECT_EQ(CheckpointFiles(disk_dir).size(), 2u);

  ExpectRestore(*client, (*slots)[1], 4, packed[3], v1::CHECKPOINT_TIER_DEVICE);
  ExpectRestore(*client, (*slots)[1], 3, packed[2], v1::CHECKPOINT_TIER_HOST);
  ExpectRestore(*client, (*slots)[1], 1, packed[0], v1::CHECKPOINT_TIER_DISK);
  // The conversation's own slot kept updating meanwhile.
  EXPECT_TRUE(Step(*client, (*slots)[0], 50).ok());

  auto stats = client->GetStats(kModel);
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->models_size(), 1);
  const v1::ModelStats& s = stats->models(0).stats();
  ASSERT_EQ(s.checkpoint_tiers_size(), 3);
  const auto* device = TierStats(s, v1::CHECKPOINT_TIER_DEVICE);
  const auto* host = TierStats(s, v1::CHECKPOINT_TIER_HOST);
  const auto* disk = TierStats(s, v1::CHECKPOINT_TIER_DISK);
  ASSERT_TRUE(device && host && disk);
  EXPECT_EQ(device->hits(), 1);
  EXPECT_EQ(host->hits(), 1);
  EXPECT_EQ(host->promotions(), 1);
  EXPECT_EQ(disk->hits(), 1);
  EXPECT_EQ(disk->promotions(), 1);
  EXPECT_EQ(device->demotions(), 5);  // 3 by the snapshots, 2 by the promotions
  EXPECT_EQ(host->capacity_bytes(), SlotBytes() + kAuxBytes);
  EXPECT_LE(host->bytes(), host->capacity_bytes());
  EXPECT_LE(disk->bytes(), disk->capacity_bytes());
  EXPECT_EQ(disk->checkpoints(), static_cast<int64_t>(CheckpointFiles(disk_dir).size()));
  for (const auto& m : server->registry().List()) {
    EXPECT_TRUE(m->checkpoints->CheckInvariants().ok()) << m->checkpoints->CheckInvariants();
  }
}

TEST(TiersTest, CorruptOrTruncatedDiskFilesAreMissesAndNeverRestored) {
  const std::string disk_dir = TempDir("tiers-corrupt");
  auto server = Start(/*data_dir=*/"", disk_dir);
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  ASSERT_TRUE(client->RegisterModel(Registration()).ok());
  auto slots = client->AllocateSlots(kModel, 2);
  ASSERT_TRUE(slots.ok());
  (void)Conversation(*client, (*slots)[0]);
  const std::vector<std::string> files = CheckpointFiles(disk_dir);
  ASSERT_EQ(files.size(), 2u);
  // One file loses its tail, the other has one payload byte flipped.
  ASSERT_EQ(truncate(files[0].c_str(), 64), 0);
  {
    std::fstream f(files[1], std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-40, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(-40, std::ios::end);
    f.write(&c, 1);
  }
  auto before = client->Export(kModel, (*slots)[1]);
  ASSERT_TRUE(before.ok());
  EXPECT_TRUE(Misses(*client, 1));
  EXPECT_TRUE(Misses(*client, 2));
  auto r = client->Restore(kModel, (*slots)[1], KeyOfTokens(Tokens(1)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  auto after = client->Export(kModel, (*slots)[1]);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->packed == before->packed) << "a failed restore wrote the slot";
  EXPECT_TRUE(CheckpointFiles(disk_dir).empty());
  EXPECT_TRUE(Step(*client, (*slots)[0], 9).ok());
  EXPECT_TRUE(Step(*client, (*slots)[1], 9).ok());
  auto stats = client->GetStats(kModel);
  ASSERT_TRUE(stats.ok());
  const auto* disk = TierStats(stats->models(0).stats(), v1::CHECKPOINT_TIER_DISK);
  ASSERT_NE(disk, nullptr);
  EXPECT_EQ(disk->dropped_corrupt(), 2);
  EXPECT_EQ(disk->promotions(), 0);
}

TEST(TiersTest, RestartKeepsTheDiskTierNotTheHostOrDeviceTiers) {
  const std::string data_dir = TempDir("tiers-data");
  const std::string disk_dir = TempDir("tiers-restart");
  std::vector<std::string> packed;
  {
    auto server = Start(data_dir, disk_dir);
    ASSERT_NE(server, nullptr);
    auto client = Connect(*server);
    ASSERT_TRUE(client->RegisterModel(Registration()).ok());
    auto slots = client->AllocateSlots(kModel, 1);
    ASSERT_TRUE(slots.ok());
    packed = Conversation(*client, (*slots)[0]);
    server->Shutdown(absl::Seconds(1));
  }
  {
    auto server = Start(data_dir, disk_dir);  // reloads the model from data_dir
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(server->models_reloaded(), 1);
    auto client = Connect(*server);
    auto slots = client->AllocateSlots(kModel, 1);
    ASSERT_TRUE(slots.ok());
    EXPECT_TRUE(Misses(*client, 4));  // was in device checkpoint memory
    EXPECT_TRUE(Misses(*client, 3));  // was in the host tier
    ExpectRestore(*client, (*slots)[0], 2, packed[1], v1::CHECKPOINT_TIER_DISK);
    ExpectRestore(*client, (*slots)[0], 1, packed[0], v1::CHECKPOINT_TIER_DISK);
    server->Shutdown(absl::Seconds(1));
  }
  {
    // Registered again under another format: the files are not served (and
    // are deleted).
    auto server = Start(/*data_dir=*/"", disk_dir);
    ASSERT_NE(server, nullptr);
    auto client = Connect(*server);
    ModelRegistration other = Registration();
    other.format = "int8";
    ASSERT_TRUE(client->RegisterModel(other).ok());
    EXPECT_TRUE(Misses(*client, 1));
    EXPECT_TRUE(Misses(*client, 2));
    EXPECT_TRUE(CheckpointFiles(disk_dir).empty());
  }
}

TEST(TiersTest, TierFlagsAreValidated) {
  SetLoggingEnabled(false);
  auto options = [](int64_t host_bytes, std::string disk_dir, int64_t disk_bytes) {
    StateCacheServer::Options so = LoopbackOptions(1 << 20, 1 << 20);
    so.memory.tiers.host_checkpoint_bytes = host_bytes;
    so.memory.tiers.disk_checkpoint_dir = std::move(disk_dir);
    so.memory.tiers.disk_checkpoint_bytes = disk_bytes;
    return so;
  };
  auto s = StateCacheServer::Create(options(0, TempDir("tiers-flags"), 0));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("disk_checkpoint_bytes"));
  EXPECT_EQ(StateCacheServer::Create(options(-1, "", 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace statecache
