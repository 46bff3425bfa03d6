// RegisterModel's checkpoint_format: validation, the default, tiers holding
// the slot's bytes unchanged when the formats are equal, and disk files that
// record the cold format.
#include <dirent.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/core/model_registry.h"
#include "server/pool/prefix_key.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

constexpr int kHost = static_cast<int>(StoreTier::kHost);

ModelSpec Spec(const std::string& id, const char* format, const std::string& checkpoint_format) {
  ModelSpec s;
  s.id = id;
  s.geometry = ModelGeometry{Arch::kGdn, 2, 1, 2, 32, 64};
  s.format = ParseFormatSpec(format).value();
  s.slots = 2;
  s.checkpoints = 1;
  s.checkpoint_format = checkpoint_format;
  return s;
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base != nullptr ? base : "/tmp") + "/" + name;
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
  return dir;
}

// The contents of every *.ckpt file under `dir` (one level).
std::vector<std::string> CheckpointFiles(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 5 || name.substr(name.size() - 5) != ".ckpt") continue;
    std::ifstream in(dir + "/" + name, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    out.push_back(ss.str());
  }
  closedir(d);
  return out;
}

class CheckpointFormatTest : public ::testing::Test {
 protected:
  void SetUp() override { backend_ = CpuBackend::Create(CpuBackend::Options{}); }

  ModelRegistry::Options Budgets() {
    ModelRegistry::Options o;
    o.state_budget_bytes = int64_t{1} << 20;
    o.checkpoint_budget_bytes = int64_t{1} << 20;
    o.tiers.host_checkpoint_bytes = int64_t{1} << 20;
    return o;
  }

  // Packs random states into slot 0 of `m`, checkpoints it under {1, 2},
  // then checkpoints slot 1 under {3} (the single arena entry demotes {1, 2}).
  // Returns slot 0's packed bytes.
  std::string SnapshotAndEvict(Model& m) {
    const ModelGeometry& g = m.layout.geometry();
    std::vector<float> states(static_cast<size_t>(g.HeadsPerSlot()) * g.d_k * g.d_v);
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (float& x : states) x = n(rng);
    std::vector<SlotHandle> h = m.slots->Allocate(2).value();
    std::string bytes;
    {
      auto access = m.slots->Acquire(h, "slots").value();
      const int32_t s0 = access.indices()[0];
      const PoolView& view = m.slots->view();
      EXPECT_TRUE(backend_->PackStates(*m.prepared, view, &s0, 1, states.data()).ok());
      EXPECT_TRUE(m.checkpoints->Put(KeyOfTokens(std::vector<int32_t>{1, 2}), view, s0, {}).ok());
      EXPECT_TRUE(
          m.checkpoints->Put(KeyOfTokens(std::vector<int32_t>{3}), view, access.indices()[1], {})
              .ok());
      bytes.assign(reinterpret_cast<const char*>(view.slot(s0)),
                   static_cast<size_t>(m.layout.slot_bytes()));
    }
    EXPECT_TRUE(m.slots->Release(h).ok());
    return bytes;
  }

  std::unique_ptr<CpuBackend> backend_;
};

TEST_F(CheckpointFormatTest, InvalidSpecsAreRefusedNamingTheField) {
  ModelRegistry registry(backend_.get(), Budgets());
  struct Bad {
    const char* slot;
    const char* cold;
    const char* why;
  };
  for (const Bad& b : {Bad{"damp:16", "int3", "unknown"},
                       Bad{"damp:16", "damp:64", "k_hi 64 is outside 0..32"},
                       Bad{"fp32", "damp-sr", "value_order / value_scale"},
                       Bad{"damp:16", "damp-sr:8", "value_order / value_scale"}}) {
    auto m = registry.Register(Spec("m", b.slot, b.cold));
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << b.cold;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("checkpoint_format: ")) << b.cold;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(b.why)) << b.cold;
  }
  EXPECT_TRUE(registry.List().empty());
  // damp-sr checkpoints of a damp-sr model take its value maps.
  auto sr = registry.Register(Spec("sr", "damp-sr:16", "damp-sr:8"));
  ASSERT_TRUE(sr.ok()) << sr.status();
  EXPECT_EQ(FormatSpecName((*sr)->checkpoint_format), "damp-sr:8");
  // A bad server default fails each registration that uses it, naming it.
  ModelRegistry::Options o = Budgets();
  o.tiers.checkpoint_format = "fp12";
  ModelRegistry defaulted(backend_.get(), o);
  auto d = defaulted.Register(Spec("m", "damp:16", ""));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("checkpoint_format: "));
}

TEST_F(CheckpointFormatTest, DefaultIsTheSlotFormatOrTheServerDefault) {
  ModelRegistry plain(backend_.get(), Budgets());
  auto a = plain.Register(Spec("a", "damp:16", ""));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(FormatSpecName((*a)->checkpoint_format), "damp:16");
  EXPECT_EQ((*a)->checkpoint_slot_bytes, (*a)->layout.slot_bytes());
  ModelRegistry::Options o = Budgets();
  o.tiers.checkpoint_format = "int4-hadamard";
  ModelRegistry defaulted(backend_.get(), o);
  auto b = defaulted.Register(Spec("b", "damp:16", ""));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(FormatSpecName((*b)->checkpoint_format), "int4-hadamard");
  EXPECT_LT((*b)->checkpoint_slot_bytes, (*b)->layout.slot_bytes());
  auto c = defaulted.Register(Spec("c", "damp:16", "damp:16"));  // the model's own choice wins
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(FormatSpecName((*c)->checkpoint_format), "damp:16");
}

TEST_F(CheckpointFormatTest, SameFormatKeepsTheSlotBytesExactly) {
  ModelRegistry registry(backend_.get(), Budgets());
  auto m = registry.Register(Spec("m", "damp:16", "damp:16"));
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string packed = SnapshotAndEvict(**m);
  CheckpointStats s = (*m)->checkpoints->stats();
  EXPECT_EQ(s.tiers[kHost].bytes, (*m)->layout.slot_bytes());
  EXPECT_EQ(s.transcodes_to_cold, 0);
  std::vector<SlotHandle> h = (*m)->slots->Allocate(1).value();
  auto access = (*m)->slots->Acquire(h, "slots").value();
  const PrefixKey key = KeyOfTokens(std::vector<int32_t>{1, 2});
  auto restored = (*m)->checkpoints->Restore(key, 0, (*m)->slots->view(), access.indices()[0]);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(std::memcmp((*m)->slots->view().slot(access.indices()[0]), packed.data(),
                        packed.size()),
            0);
  s = (*m)->checkpoints->stats();
  EXPECT_EQ(s.tiers[kHost].promotions, 1);
  EXPECT_EQ(s.transcodes_from_cold, 0);
}

TEST_F(CheckpointFormatTest, DiskFilesRecordTheColdFormatAndOtherFormatsNeverMatch) {
  const std::string dir = TempDir("cold_format_disk");
  ModelRegistry::Options o = Budgets();
  o.tiers.host_checkpoint_bytes = 0;
  o.tiers.disk_checkpoint_dir = dir;
  o.tiers.disk_checkpoint_bytes = int64_t{1} << 20;
  const std::string model_dir = dir + "/_/m";
  {
    ModelRegistry registry(backend_.get(), o);
    auto m = registry.Register(Spec("m", "damp:16", "int4-hadamard"));
    ASSERT_TRUE(m.ok()) << m.status();
    SnapshotAndEvict(**m);
    const CheckpointStats s = (*m)->checkpoints->stats();
    EXPECT_EQ(s.transcodes_to_cold, 1);
    const std::vector<std::string> files = CheckpointFiles(model_dir);
    ASSERT_EQ(files.size(), 1u);
    EXPECT_THAT(files[0], HasSubstr("format=int4-hadamard "));
    EXPECT_THAT(files[0], HasSubstr(absl::StrCat(" slot_bytes=", (*m)->checkpoint_slot_bytes,
                                                 " ")));
    EXPECT_LT(files[0].size(), static_cast<size_t>((*m)->layout.slot_bytes()));
  }
  {
    // Registered again with int4-hadamard checkpoints: the file is found
    // and restored through the transcoder.
    ModelRegistry registry(backend_.get(), o);
    auto m = registry.Register(Spec("m", "damp:16", "int4-hadamard"));
    ASSERT_TRUE(m.ok()) << m.status();
    auto hit = (*m)->checkpoints->Lookup({KeyOfTokens(std::vector<int32_t>{1, 2})},
                                         absl::ZeroDuration());
    ASSERT_TRUE(hit.ok() && hit->hit);
    EXPECT_EQ(hit->tier, StoreTier::kDisk);
    EXPECT_EQ((*m)->checkpoints->stats().transcodes_from_cold, 1);
  }
  {
    // Re-demote one, then register with the slot format as checkpoint
    // format: the int4-hadamard file is not read as damp:16 bytes, it is
    // deleted.
    ModelRegistry registry(backend_.get(), o);
    auto m = registry.Register(Spec("m", "damp:16", "int4-hadamard"));
    ASSERT_TRUE(m.ok()) << m.status();
    SnapshotAndEvict(**m);
  }
  ASSERT_FALSE(CheckpointFiles(model_dir).empty());
  ModelRegistry registry(backend_.get(), o);
  auto m = registry.Register(Spec("m", "damp:16", ""));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(CheckpointFiles(model_dir).empty());
  auto miss = (*m)->checkpoints->Lookup({KeyOfTokens(std::vector<int32_t>{1, 2})},
                                        absl::ZeroDuration());
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->hit);
}

}  // namespace
}  // namespace statecache
