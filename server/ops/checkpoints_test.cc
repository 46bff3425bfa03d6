// ops::Snapshot / Restore / LookupPrefix / ReleaseLease and the batch ops
// without gRPC: key kinds and their field errors, the tenant salt, peek,
// per-item batch statuses and the whole-batch bounds.
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/core/log.h"
#include "server/core/model_registry.h"
#include "server/ops/state_ops.h"
#include "server/pool/prefix_key.h"

namespace statecache {
namespace {

using ::testing::StartsWith;

class CheckpointOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLoggingEnabled(false);
    backend_ = CpuBackend::Create({/*threads=*/1});
    ModelRegistry::Options ro;
    ro.state_budget_bytes = 4 << 20;
    ro.checkpoint_budget_bytes = 4 << 20;
    registry_ = std::make_unique<ModelRegistry>(backend_.get(), ro);
    ctx_.backend = backend_.get();
    ctx_.limits.max_batch = 8;
    ctx_.limits.max_lookup_tokens = 10;
  }

  std::shared_ptr<Model> Register(const std::string& tenant) {
    ModelSpec spec;
    spec.id = "m";
    spec.tenant = tenant;
    spec.geometry = ModelGeometry{Arch::kGdn, 2, 1, 2, 32, 32};
    spec.format = ParseFormatSpec("int8").value();
    spec.slots = 4;
    spec.checkpoints = 4;
    auto m = registry_->Register(spec);
    EXPECT_TRUE(m.ok()) << m.status();
    return *m;
  }

  static v1::SlotHandle Handle(Model& m) {
    const SlotHandle h = m.slots->Allocate(1).value()[0];
    v1::SlotHandle out;
    out.set_id(h.id);
    out.set_generation(h.generation);
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ModelRegistry> registry_;
  ops::Context ctx_;
};

TEST_F(CheckpointOpsTest, StoredKeysAreSaltedWithTheModelsTenant) {
  std::shared_ptr<Model> m = Register("tenant-a");
  v1::SnapshotRequest snap;
  *snap.mutable_slot() = Handle(*m);
  snap.mutable_tokens()->add_ids(9);
  snap.mutable_tokens()->add_ids(8);
  snap.set_key_kind(v1::PREFIX_KEY_KIND_SHA256);
  v1::SnapshotResponse resp;
  ASSERT_TRUE(ops::Snapshot(ctx_, *m, snap, &resp).ok());
  const PrefixKey wire = Sha256KeyOfTokens({9, 8});
  EXPECT_EQ(resp.key().kind(), v1::PREFIX_KEY_KIND_SHA256);
  EXPECT_EQ(resp.key().digest(), wire.digest);  // the caller's key, unsalted
  EXPECT_TRUE(m->checkpoints->Contains(SaltKey("tenant-a", wire)));
  EXPECT_FALSE(m->checkpoints->Contains(wire));
  EXPECT_FALSE(m->checkpoints->Contains(SaltKey("", wire)));
  // Lookup answers with the wire key.
  v1::LookupPrefixRequest look;
  look.mutable_tokens()->add_ids(9);
  look.mutable_tokens()->add_ids(8);
  look.mutable_tokens()->add_ids(7);
  look.set_key_kind(v1::PREFIX_KEY_KIND_SHA256);
  look.set_peek(true);
  v1::LookupPrefixResponse hit;
  ASSERT_TRUE(ops::LookupPrefix(ctx_, *m, look, &hit).ok());
  EXPECT_TRUE(hit.hit());
  EXPECT_EQ(hit.key().digest(), wire.digest);
  EXPECT_EQ(hit.key().num_tokens(), 2);
  EXPECT_EQ(hit.lease_id(), 0u);
  EXPECT_EQ(hit.lease_expiry_unix_ms(), 0);
}

TEST_F(CheckpointOpsTest, BatchLookupBoundsTheCandidatesOfAllItems) {
  std::shared_ptr<Model> m = Register("");
  v1::BatchLookupPrefixRequest req;
  for (int i = 0; i < 3; ++i) {
    v1::LookupPrefixRequest* item = req.add_items();
    for (int t = 0; t < 4; ++t) item->mutable_tokens()->add_ids(t);
  }
  v1::BatchLookupPrefixResponse resp;
  absl::Status s = ops::BatchLookupPrefix(ctx_, *m, req, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()), "items: 12 candidates in all exceed the limit of 10");
  EXPECT_EQ(resp.results_size(), 0);
  req.mutable_items()->RemoveLast();
  ASSERT_TRUE(ops::BatchLookupPrefix(ctx_, *m, req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 2);
  EXPECT_EQ(resp.results(0).error().code(), 0);
  EXPECT_FALSE(resp.results(0).response().hit());
  EXPECT_EQ(resp.results(0).response().candidate_tokens(), 4);
  for (int i = 0; i < 9; ++i) req.add_items();
  v1::BatchLookupPrefixResponse too_many;
  s = ops::BatchLookupPrefix(ctx_, *m, req, &too_many);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()), "items: 11 items exceed the limit of 8");
}

TEST_F(CheckpointOpsTest, BatchItemsFailAloneWithTheirIndexAndField) {
  std::shared_ptr<Model> m = Register("");
  const v1::SlotHandle slot = Handle(*m);
  v1::BatchSnapshotRequest req;
  v1::SnapshotRequest* ok = req.add_items();
  *ok->mutable_slot() = slot;
  ok->mutable_tokens()->add_ids(1);
  v1::SnapshotRequest* no_prefix = req.add_items();
  *no_prefix->mutable_slot() = slot;
  v1::SnapshotRequest* bad_kind = req.add_items();
  *bad_kind->mutable_slot() = slot;
  bad_kind->mutable_key()->set_num_tokens(1);
  bad_kind->mutable_key()->set_kind(static_cast<v1::PrefixKeyKind>(3));
  v1::SnapshotRequest* stale = req.add_items();
  stale->mutable_slot()->set_id(slot.id() ^ 1);
  stale->mutable_tokens()->add_ids(2);
  v1::BatchSnapshotResponse resp;
  ASSERT_TRUE(ops::BatchSnapshot(ctx_, *m, req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 4);
  EXPECT_EQ(resp.results(0).error().code(), 0);
  EXPECT_EQ(resp.results(0).response().key().num_tokens(), 1);
  EXPECT_EQ(resp.results(1).error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(resp.results(1).error().message(), "items[1].prefix: set tokens or key");
  EXPECT_EQ(resp.results(2).error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(resp.results(2).error().message(), "items[2].key.kind: unknown prefix key kind 3");
  EXPECT_EQ(resp.results(3).error().code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(resp.results(3).error().message(), StartsWith("items[3].slot"));
  EXPECT_FALSE(resp.results(3).has_response());
  EXPECT_EQ(m->checkpoints->stats().snapshots, 1);

  v1::BatchRestoreRequest restore;
  restore.add_items();  // no key
  v1::BatchRestoreResponse restored;
  ASSERT_TRUE(ops::BatchRestore(ctx_, *m, restore, &restored).ok());
  ASSERT_EQ(restored.results_size(), 1);
  EXPECT_EQ(restored.results(0).error().message(), "items[0].key: missing");
  v1::BatchRestoreRequest empty;
  EXPECT_EQ(ops::BatchRestore(ctx_, *m, empty, &restored).code(),
            absl::StatusCode::kInvalidArgument);

  v1::ReleaseLeaseRequest release;
  EXPECT_EQ(ops::ReleaseLease(ctx_, *m, release).code(), absl::StatusCode::kInvalidArgument);
  release.set_lease_id(42);
  EXPECT_EQ(ops::ReleaseLease(ctx_, *m, release).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace statecache
