#include "server/core/model_registry.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/pool/disk_tier.h"
#include "server/pool/prefix_key.h"
#include "server/pool/testing/fake_backend.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

ModelSpec Spec(const std::string& id, int64_t slots = 0, int64_t checkpoints = 0) {
  ModelSpec s;
  s.id = id;
  s.geometry = ModelGeometry{Arch::kGdn, 2, 1, 2, 32, 32};
  s.format = ParseFormatSpec("fp32").value();
  s.slots = slots;
  s.checkpoints = checkpoints;
  return s;
}

// fp32 slot of the geometry above: 2 layers * 2 heads * 32*32*4 = 16 KiB.
constexpr int64_t kSlot = 2 * 2 * 32 * 32 * 4;

class ModelRegistryTest : public ::testing::Test {
 protected:
  testing::FakeBackend backend_;
  ModelRegistry registry_{&backend_, {10 * kSlot, 4 * kSlot}};
};

TEST_F(ModelRegistryTest, DefaultsTakeTheRemainingBudget) {
  auto a = registry_.Register(Spec("a", /*slots=*/3, /*checkpoints=*/1));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->slots->capacity(), 3);
  EXPECT_EQ((*a)->checkpoints->capacity(), 1);
  auto b = registry_.Register(Spec("b"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->slots->capacity(), 7);
  EXPECT_EQ((*b)->checkpoints->capacity(), 3);
  EXPECT_EQ(registry_.state_reserved_bytes(), 10 * kSlot);
  EXPECT_EQ(registry_.checkpoint_reserved_bytes(), 4 * kSlot);
  // Nothing left: a third model cannot get a slot.
  auto c = registry_.Register(Spec("c"));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("--state_memory_bytes"));
  // Dropping returns the budget.
  ASSERT_TRUE(registry_.Drop("b", false).ok());
  EXPECT_EQ(registry_.state_reserved_bytes(), 3 * kSlot);
  auto c2 = registry_.Register(Spec("c", 0, 0));
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ((*c2)->slots->capacity(), 7);
}

TEST_F(ModelRegistryTest, CapsAndExplicitCounts) {
  ModelSpec s = Spec("a");
  s.max_state_bytes = 2 * kSlot + 5;
  s.max_checkpoint_bytes = kSlot;
  auto a = registry_.Register(s);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->slots->capacity(), 2);
  EXPECT_EQ((*a)->checkpoints->capacity(), 1);
  EXPECT_EQ(registry_.Register(Spec("b", /*slots=*/9)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(registry_.Register(Spec("b", 1, /*checkpoints=*/4)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(registry_.Register(Spec("b", -1)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelRegistryTest, NoCheckpointMemoryMeansNoStore) {
  ModelRegistry registry(&backend_, {kSlot, 0});
  auto a = registry.Register(Spec("a"));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->checkpoints, nullptr);
}

// Disk checkpoints stored under the v1 key salt (tags without "keys=v2")
// are deleted when the model's disk tier opens: never restored, never left
// unreachable. A v2 file of the same model is kept.
TEST_F(ModelRegistryTest, DiskFilesOfOldSaltedKeysAreDroppedOnOpen) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/salt_migration";
  ASSERT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
  ModelSpec spec = Spec("a", 1, 1);
  spec.tenant = "t";
  const StateLayout layout = StateLayout::Identity(spec.geometry, spec.format).value();
  const std::string tags = CheckpointTierTags("t", "a", layout);
  EXPECT_THAT(tags, HasSubstr(" keys=v2"));
  const std::string model_dir = dir + "/74/a";  // hex("t") / model id
  auto blob = [&](int n) {
    CheckpointBlob b;
    b.key = SaltKey("t", KeyOfTokens(std::vector<int32_t>(n, 3)));
    b.packed = std::string(kSlot, static_cast<char>(n));
    return b;
  };
  std::vector<CheckpointBlob> evicted;
  {
    auto v1 = DiskTier::Create(model_dir, absl::StrReplaceAll(tags, {{" keys=v2", ""}}),
                               10 * kSlot);
    ASSERT_TRUE(v1.ok()) << v1.status();
    ASSERT_TRUE((*v1)->Put(blob(1), &evicted).ok());
  }
  {
    auto v2 = DiskTier::Create(model_dir + ".v2", tags, 10 * kSlot);
    ASSERT_TRUE(v2.ok()) << v2.status();
    ASSERT_TRUE((*v2)->Put(blob(2), &evicted).ok());
  }
  ASSERT_EQ(std::system(("mv '" + model_dir + ".v2'/* '" + model_dir + "'/").c_str()), 0);
  ModelRegistry::Options o;
  o.state_budget_bytes = 10 * kSlot;
  o.checkpoint_budget_bytes = 4 * kSlot;
  o.tiers.disk_checkpoint_dir = dir;
  o.tiers.disk_checkpoint_bytes = 10 * kSlot;
  ModelRegistry registry(&backend_, o);
  auto a = registry.Register(spec);
  ASSERT_TRUE(a.ok()) << a.status();
  const CheckpointStats s = (*a)->checkpoints->stats();
  EXPECT_EQ(s.tiers[static_cast<int>(StoreTier::kDisk)].entries, 1);  // the v2 file
  auto hit = (*a)->checkpoints->Lookup({blob(1).key, blob(2).key}, absl::ZeroDuration());
  ASSERT_TRUE(hit.ok());
  ASSERT_TRUE(hit->hit);
  EXPECT_EQ(hit->key, blob(2).key);
  EXPECT_FALSE((*a)->checkpoints->Peek({blob(1).key}).hit);
}

TEST_F(ModelRegistryTest, IdsAndValidation) {
  ASSERT_TRUE(registry_.Register(Spec("m.1_x-y", 1)).ok());
  EXPECT_EQ(registry_.Register(Spec("m.1_x-y", 1)).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry_.Register(Spec("", 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.Register(Spec("a/b", 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.Register(Spec(std::string(129, 'a'), 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelSpec bad = Spec("bad", 1);
  bad.geometry.h_v = 3;  // not a multiple of h_qk = 2
  bad.geometry.h_qk = 2;
  auto r = registry_.Register(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("geometry.h_v"));
  ModelSpec perm = Spec("perm", 1);
  perm.key_perm.assign(2 * 2 * 32, 0);
  auto p = registry_.Register(perm);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("layout.key_perm"));
  EXPECT_EQ(registry_.Find("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ModelRegistryTest, DropRefusesLiveSlotsUnlessForcedAndKeepsModelAliveForUsers) {
  auto a = registry_.Register(Spec("a", 2, 1));
  ASSERT_TRUE(a.ok());
  std::shared_ptr<Model> user = *a;
  auto h = user->slots->Allocate(1);
  ASSERT_TRUE(h.ok());
  auto d = registry_.Drop("a", false);
  EXPECT_EQ(d.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(d.message()), HasSubstr("1 allocated slots"));
  ASSERT_TRUE(registry_.Drop("a", true).ok());
  EXPECT_EQ(registry_.Find("a").status().code(), absl::StatusCode::kNotFound);
  // An in-flight user still holds a working model.
  EXPECT_TRUE(user->slots->Release(*h).ok());
  EXPECT_EQ(registry_.Drop("a", true).code(), absl::StatusCode::kNotFound);
  const int64_t live = backend_.live_bytes();
  user.reset();
  a->reset();
  EXPECT_LT(backend_.live_bytes(), live);  // arenas freed with the last user
}

TEST_F(ModelRegistryTest, ListIsSortedById) {
  ASSERT_TRUE(registry_.Register(Spec("b", 1)).ok());
  ASSERT_TRUE(registry_.Register(Spec("a", 1)).ok());
  auto list = registry_.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0]->id, "a");
  EXPECT_EQ(list[1]->id, "b");
}

}  // namespace
}  // namespace statecache
