// The prefix-cache RPCs of issue 31 on loopback (CPU backend): SHA-256 and
// engine-provided keys next to the FNV-1a default, LookupPrefix peek,
// ReleaseLease with the lease gauges, and BatchSnapshot / BatchRestore /
// BatchLookupPrefix with per-item statuses. Bad input is INVALID_ARGUMENT
// naming the field; restored bytes equal the snapshotted slot's.
#include <cstdint>
#include <memory>
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
using ::testing::StartsWith;

constexpr char kModel[] = "m";
const ModelGeometry kGeo{Arch::kGdn, 2, 1, 2, 32, 32};  // 2 layers, h_v 2, 32 x 32

PrefixKey EngineKey(const std::string& bytes, int64_t n) {
  PrefixKey k;
  k.kind = PrefixKeyKind::kEngine;
  k.digest = bytes;
  k.num_tokens = n;
  return k;
}

class PrefixCacheRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLoggingEnabled(false);
    StateCacheServer::Options so = LoopbackOptions(16 << 20, 16 << 20);
    auto server = StateCacheServer::Create(std::move(so));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto client = StateCacheClient::Connect(LoopbackTarget(*server_));
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
    ASSERT_TRUE(client_->WaitForReady(absl::Seconds(5)).ok());
  }

  // Registers kModel and allocates `slots` slots, each filled with distinct
  // states (PrefillStates), so that a restore of the wrong checkpoint shows.
  std::vector<SlotHandle> Setup(int slots, int checkpoints) {
    ModelRegistration r;
    r.model_id = kModel;
    r.geometry = kGeo;
    r.format = "damp:8";
    r.slots = slots;
    r.checkpoints = checkpoints;
    auto info = client_->RegisterModel(r);
    EXPECT_TRUE(info.ok()) << info.status();
    auto handles = client_->AllocateSlots(kModel, slots);
    EXPECT_TRUE(handles.ok()) << handles.status();
    const int per_slot = kGeo.layers * kGeo.h_v * kGeo.d_k * kGeo.d_v;
    std::vector<float> states(static_cast<size_t>(per_slot) * slots);
    for (size_t i = 0; i < states.size(); ++i) {
      states[i] = 0.001f * static_cast<float>((i * 37 + i / per_slot * 11) % 997) - 0.4f;
    }
    EXPECT_TRUE(client_->PrefillStates(kModel, *handles, states).ok());
    return *handles;
  }

  std::string Bytes(SlotHandle h) {
    auto e = client_->Export(kModel, h);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? e->packed : "";
  }

  v1::ModelStats Stats() {
    auto s = client_->GetStats(kModel);
    EXPECT_TRUE(s.ok() && s->models_size() == 1);
    return s.ok() && s->models_size() == 1 ? s->models(0).stats() : v1::ModelStats();
  }

  std::unique_ptr<StateCacheServer> server_;
  std::unique_ptr<StateCacheClient> client_;
};

TEST_F(PrefixCacheRpcTest, Sha256KeysRoundTripAndStayApartFromFnvKeys) {
  const std::vector<SlotHandle> s = Setup(3, 4);
  ASSERT_NE(Bytes(s[0]), Bytes(s[1]));
  auto key = client_->Snapshot(kModel, s[0], {1, 2, 3}, {}, PrefixKeyKind::kSha256);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, Sha256KeyOfTokens({1, 2, 3}));  // the wire key, unsalted
  // Every prefix of the longer sequence is a SHA-256 candidate.
  auto hit = client_->LookupPrefix(kModel, {1, 2, 3, 4}, absl::ZeroDuration(),
                                   PrefixKeyKind::kSha256);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_TRUE(hit->hit);
  EXPECT_EQ(hit->key, *key);
  EXPECT_EQ(hit->candidate_tokens, 4);
  // The same tokens as FNV-1a keys name nothing.
  auto fnv = client_->LookupPrefix(kModel, {1, 2, 3, 4});
  ASSERT_TRUE(fnv.ok());
  EXPECT_FALSE(fnv->hit);
  // Keys the client chained itself hit the same checkpoint.
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  auto by_keys = client_->LookupPrefixKeys(kModel, ChainSha256PrefixKeys(tokens));
  ASSERT_TRUE(by_keys.ok());
  EXPECT_TRUE(by_keys->hit);
  EXPECT_EQ(by_keys->key, *key);
  auto restored = client_->Restore(kModel, s[1], hit->key, hit->lease_id);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->num_tokens, 3);
  EXPECT_EQ(Bytes(s[1]), Bytes(s[0]));
  ASSERT_TRUE(client_->Restore(kModel, s[2], by_keys->key, by_keys->lease_id).ok());
  EXPECT_EQ(Bytes(s[2]), Bytes(s[0]));
}

TEST_F(PrefixCacheRpcTest, EngineBlockHashesAreKeys) {
  const std::vector<SlotHandle> s = Setup(2, 4);
  const PrefixKey block = EngineKey("vllm-block-hash:0123456789", 16);
  auto stored = client_->SnapshotKey(kModel, s[0], block, {"aux0", "aux1"});
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(*stored, block);
  const PrefixKey other = EngineKey("vllm-block-hash:0123456780", 16);
  auto hit = client_->LookupPrefixKeys(kModel, std::vector<PrefixKey>{other, block});
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_TRUE(hit->hit);
  EXPECT_EQ(hit->key, block);
  auto restored = client_->Restore(kModel, s[1], block, hit->lease_id);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->aux, (std::vector<std::string>{"aux0", "aux1"}));
  EXPECT_EQ(Bytes(s[1]), Bytes(s[0]));
  // The same bytes as a SHA-256 digest are another key.
  PrefixKey as_sha = block;
  as_sha.kind = PrefixKeyKind::kSha256;
  as_sha.digest = std::string(32, 'x');
  auto miss = client_->LookupPrefixKeys(kModel, std::vector<PrefixKey>{as_sha});
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->hit);
  // Engine keys cannot be computed from tokens.
  auto from_tokens = client_->Snapshot(kModel, s[0], {1, 2}, {}, PrefixKeyKind::kEngine);
  EXPECT_EQ(from_tokens.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(from_tokens.status().message()), StartsWith("key_kind: "));
}

TEST_F(PrefixCacheRpcTest, BadKeysAreInvalidArgumentNamingTheField) {
  const std::vector<SlotHandle> s = Setup(1, 2);
  auto snapshot = [&](v1::PrefixKey key) {
    v1::SnapshotRequest req;
    req.set_model_id(kModel);
    req.mutable_slot()->set_id(s[0].id);
    req.mutable_slot()->set_generation(s[0].generation);
    *req.mutable_key() = key;
    v1::SnapshotResponse resp;
    grpc::ClientContext ctx;
    return client_->stub().Snapshot(&ctx, req, &resp);
  };
  struct Case {
    v1::PrefixKeyKind kind;
    uint64_t hash;
    std::string digest;
    int64_t num_tokens;
    std::string message_start;
  };
  const std::vector<Case> cases = {
      {v1::PREFIX_KEY_KIND_SHA256, 0, std::string(31, 'a'), 3,
       "key.digest: 31 bytes, PREFIX_KEY_KIND_SHA256 needs 32"},
      {v1::PREFIX_KEY_KIND_SHA256, 5, std::string(32, 'a'), 3,
       "key.hash: must be 0 for PREFIX_KEY_KIND_SHA256"},
      {v1::PREFIX_KEY_KIND_FNV64, 5, "x", 3,
       "key.digest: must be empty for PREFIX_KEY_KIND_FNV64"},
      {v1::PREFIX_KEY_KIND_ENGINE, 0, "", 3, "key.digest: 0 bytes, PREFIX_KEY_KIND_ENGINE needs 1..64"},
      {v1::PREFIX_KEY_KIND_ENGINE, 0, std::string(65, 'e'), 3,
       "key.digest: 65 bytes, PREFIX_KEY_KIND_ENGINE needs 1..64"},
      {static_cast<v1::PrefixKeyKind>(7), 0, "", 3, "key.kind: unknown prefix key kind 7"},
      {v1::PREFIX_KEY_KIND_ENGINE, 0, "e", 0, "key.num_tokens: 0 must be >= 1"},
  };
  for (const Case& c : cases) {
    v1::PrefixKey key;
    key.set_kind(c.kind);
    key.set_hash(c.hash);
    key.set_digest(c.digest);
    key.set_num_tokens(c.num_tokens);
    grpc::Status st = snapshot(key);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message_start;
    EXPECT_THAT(st.error_message(), StartsWith(c.message_start));
  }
  EXPECT_EQ(Stats().snapshots(), 0);

  // LookupPrefix: a bad candidate names its index; an unknown tokens kind.
  v1::LookupPrefixRequest lookup;
  lookup.set_model_id(kModel);
  {
    v1::PrefixKey* good = lookup.mutable_keys()->add_keys();
    good->set_hash(1);
    good->set_num_tokens(1);
    v1::PrefixKey* bad = lookup.mutable_keys()->add_keys();
    bad->set_kind(v1::PREFIX_KEY_KIND_SHA256);
    bad->set_digest("short");
    bad->set_num_tokens(2);
    v1::LookupPrefixResponse resp;
    grpc::ClientContext ctx;
    grpc::Status st = client_->stub().LookupPrefix(&ctx, lookup, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), StartsWith("keys.keys[1].digest: 5 bytes"));
  }
  {
    lookup.mutable_tokens()->add_ids(1);
    lookup.set_key_kind(static_cast<v1::PrefixKeyKind>(9));
    v1::LookupPrefixResponse resp;
    grpc::ClientContext ctx;
    grpc::Status st = client_->stub().LookupPrefix(&ctx, lookup, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), StartsWith("key_kind: unknown prefix key kind 9"));
  }
  EXPECT_EQ(Stats().lookups_hit() + Stats().lookups_miss(), 0);
  // ReleaseLease: 0 is no lease.
  auto zero = client_->ReleaseLease(kModel, 0);
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(zero.message()), "lease_id: must be non-zero");
}

TEST_F(PrefixCacheRpcTest, PeekTakesNoLeaseAndReleaseFreesTheCheckpoint) {
  const std::vector<SlotHandle> s = Setup(2, 1);  // one checkpoint entry
  ASSERT_TRUE(client_->Snapshot(kModel, s[0], {1, 2}).ok());
  LookupItem peek;
  peek.tokens = {1, 2, 3};
  auto peeked = client_->PeekPrefix(kModel, peek);
  ASSERT_TRUE(peeked.ok()) << peeked.status();
  EXPECT_TRUE(peeked->hit);
  EXPECT_EQ(peeked->key, KeyOfTokens({1, 2}));
  EXPECT_EQ(peeked->lease_id, 0u);
  EXPECT_EQ(peeked->candidate_tokens, 3);
  v1::ModelStats st = Stats();
  EXPECT_EQ(st.leases_active(), 0);
  EXPECT_EQ(st.checkpoints_leased(), 0);
  EXPECT_EQ(st.lookups_hit(), 0);  // peeks are not lookups in the statistics
  EXPECT_EQ(st.lookups_miss(), 0);
  // A peeked checkpoint is not pinned: a new snapshot evicts it.
  ASSERT_TRUE(client_->Snapshot(kModel, s[1], {7}).ok());
  peek.tokens = {1, 2};
  auto gone = client_->PeekPrefix(kModel, peek);
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->hit);

  // A lease pins; ReleaseLease unpins and keeps the gauges exact.
  auto lease = client_->LookupPrefix(kModel, {7});
  ASSERT_TRUE(lease.ok() && lease->hit);
  ASSERT_NE(lease->lease_id, 0u);
  st = Stats();
  EXPECT_EQ(st.leases_active(), 1);
  EXPECT_EQ(st.checkpoints_leased(), 1);
  EXPECT_EQ(st.lookups_hit(), 1);
  EXPECT_EQ(client_->Snapshot(kModel, s[0], {8}).status().code(),
            absl::StatusCode::kResourceExhausted);
  auto wrong_key = client_->Restore(kModel, s[0], KeyOfTokens({9}), lease->lease_id);
  EXPECT_EQ(wrong_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(wrong_key.status().message()),
            absl::StrCat("lease_id: the lease is for another key than ",
                         KeyOfTokens({9}).DebugString()));
  EXPECT_TRUE(client_->ReleaseLease(kModel, lease->lease_id).ok());
  st = Stats();
  EXPECT_EQ(st.leases_active(), 0);
  EXPECT_EQ(st.checkpoints_leased(), 0);
  EXPECT_EQ(st.leases_expired(), 0);  // released, not expired
  auto again = client_->ReleaseLease(kModel, lease->lease_id);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(again.message()), StartsWith("lease_id: unknown or expired lease"));
  EXPECT_EQ(client_->ReleaseLease("no-such-model", 5).code(), absl::StatusCode::kNotFound);
  // A restore with the released lease falls back to the index.
  ASSERT_TRUE(client_->Restore(kModel, s[0], lease->key, lease->lease_id).ok());
  EXPECT_EQ(Bytes(s[0]), Bytes(s[1]));
  // Unpinned: the next snapshot evicts it.
  auto evicting = client_->Snapshot(kModel, s[0], {8});
  ASSERT_TRUE(evicting.ok()) << evicting.status();
  EXPECT_EQ(Stats().evictions(), 2);
}

TEST_F(PrefixCacheRpcTest, BatchesAnswerPerItemAndOneBadItemFailsOnlyItself) {
  const std::vector<SlotHandle> s = Setup(4, 8);
  std::vector<SnapshotItem> snaps(4);
  snaps[0].slot = s[0];
  snaps[0].tokens = {1, 2};
  snaps[1].slot = s[1];
  snaps[1].tokens = {3};
  snaps[1].aux = {"only one layer"};  // bad: 2 layers
  snaps[2].slot = s[1];
  snaps[2].tokens = {5, 6, 7};
  snaps[2].key_kind = PrefixKeyKind::kSha256;
  snaps[3].slot = s[2];
  snaps[3].key = EngineKey("blk", 4);
  auto snapped = client_->BatchSnapshot(kModel, snaps);
  ASSERT_TRUE(snapped.ok()) << snapped.status();
  ASSERT_EQ(snapped->size(), 4u);
  ASSERT_TRUE((*snapped)[0].ok()) << (*snapped)[0].status();
  EXPECT_EQ(*(*snapped)[0], KeyOfTokens({1, 2}));
  EXPECT_EQ((*snapped)[1].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string((*snapped)[1].status().message()), StartsWith("items[1].aux: 1 entries"));
  ASSERT_TRUE((*snapped)[2].ok());
  EXPECT_EQ(*(*snapped)[2], Sha256KeyOfTokens({5, 6, 7}));
  ASSERT_TRUE((*snapped)[3].ok());
  EXPECT_EQ(*(*snapped)[3], EngineKey("blk", 4));
  EXPECT_EQ(Stats().snapshots(), 3);

  std::vector<LookupItem> lookups(4);
  lookups[0].tokens = {1, 2, 9};
  lookups[1].tokens = {5, 6, 7, 8};
  lookups[1].key_kind = PrefixKeyKind::kSha256;
  lookups[1].peek = true;
  lookups[2].keys = {EngineKey("blk", 4)};
  lookups[3].keys = {EngineKey(std::string(65, 'z'), 4)};  // bad digest
  auto looked = client_->BatchLookupPrefix(kModel, lookups);
  ASSERT_TRUE(looked.ok()) << looked.status();
  ASSERT_EQ(looked->size(), 4u);
  ASSERT_TRUE((*looked)[0].ok() && (*looked)[1].ok() && (*looked)[2].ok());
  EXPECT_TRUE((*looked)[0]->hit);
  EXPECT_NE((*looked)[0]->lease_id, 0u);
  EXPECT_EQ((*looked)[0]->candidate_tokens, 3);
  EXPECT_TRUE((*looked)[1]->hit);
  EXPECT_EQ((*looked)[1]->lease_id, 0u);  // peek
  EXPECT_EQ((*looked)[1]->key, Sha256KeyOfTokens({5, 6, 7}));
  EXPECT_TRUE((*looked)[2]->hit);
  EXPECT_EQ((*looked)[3].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string((*looked)[3].status().message()),
              StartsWith("items[3].keys.keys[0].digest: 65 bytes"));
  EXPECT_EQ(Stats().leases_active(), 2);

  std::vector<RestoreItem> restores(4);
  restores[0] = {s[3], (*looked)[0]->key, (*looked)[0]->lease_id};
  restores[1] = {s[3], KeyOfTokens({4, 4}), 0};  // never snapshotted
  restores[2] = {SlotHandle{0x1234567, 1}, (*looked)[2]->key, (*looked)[2]->lease_id};
  restores[3] = {s[2], (*looked)[1]->key, 0};
  auto restored = client_->BatchRestore(kModel, restores);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->size(), 4u);
  ASSERT_TRUE((*restored)[0].ok()) << (*restored)[0].status();
  EXPECT_EQ((*restored)[0]->num_tokens, 2);
  EXPECT_EQ((*restored)[1].status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string((*restored)[1].status().message()),
            absl::StrCat("items[1].key: no checkpoint for prefix ",
                         KeyOfTokens({4, 4}).DebugString()));
  EXPECT_EQ((*restored)[2].status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string((*restored)[2].status().message()), StartsWith("items[2].slot"));
  ASSERT_TRUE((*restored)[3].ok());
  EXPECT_EQ((*restored)[3]->num_tokens, 3);
  EXPECT_EQ(Bytes(s[3]), Bytes(s[0]));
  EXPECT_EQ(Bytes(s[2]), Bytes(s[1]));
  // Item 0's lease was consumed; item 2's (failed) lease is still held.
  EXPECT_EQ(Stats().leases_active(), 1);
  EXPECT_TRUE(client_->ReleaseLease(kModel, (*looked)[2]->lease_id).ok());
  EXPECT_EQ(Stats().leases_active(), 0);
}

TEST_F(PrefixCacheRpcTest, BatchCallsFailAsAWholeOnlyForTheBatch) {
  const std::vector<SlotHandle> s = Setup(1, 2);
  auto empty = client_->BatchSnapshot(kModel, {});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(empty.status().message()), "items: empty batch");
  EXPECT_EQ(client_->BatchRestore(kModel, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->BatchLookupPrefix(kModel, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<LookupItem> many(4097);
  for (LookupItem& l : many) l.tokens = {1};
  auto too_many = client_->BatchLookupPrefix(kModel, many);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(too_many.status().message()), "items: 4097 items exceed the limit of 4096");
  std::vector<LookupItem> one(1);
  one[0].tokens = {1};
  EXPECT_EQ(client_->BatchLookupPrefix("no-such-model", one).status().code(),
            absl::StatusCode::kNotFound);

  // An item naming another model fails alone.
  v1::BatchLookupPrefixRequest req;
  req.set_model_id(kModel);
  req.add_items()->mutable_tokens()->add_ids(1);
  v1::LookupPrefixRequest* other = req.add_items();
  other->set_model_id("other");
  other->mutable_tokens()->add_ids(1);
  v1::LookupPrefixRequest* same = req.add_items();
  same->set_model_id(kModel);
  same->mutable_tokens()->add_ids(1);
  v1::BatchLookupPrefixResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(client_->stub().BatchLookupPrefix(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 3);
  EXPECT_EQ(resp.results(0).error().code(), 0);
  EXPECT_EQ(resp.results(1).error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(resp.results(1).error().message(),
            "items[1].model_id: 'other' differs from the batch's model_id");
  EXPECT_FALSE(resp.results(1).has_response());
  EXPECT_EQ(resp.results(2).error().code(), 0);
  EXPECT_EQ(Stats().lookups_miss(), 2);
}

}  // namespace
}  // namespace statecache
