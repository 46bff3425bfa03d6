// Cold checkpoint formats: a damp:16 store whose lower tiers hold int8-hadamard,
// int4-hadamard or stepquant-4 checkpoints restores states within that format's
// error, exactly as decode-encode through FP32 would, with the model's key
// permutation applied.
#include "server/pool/checkpoint_transcoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/host_tier.h"
#include "server/pool/prefix_key.h"
#include "server/pool/slot_pool.h"
#include "server/pool/testing/gated_remote.h"

namespace statecache {
namespace {

constexpr int kHost = static_cast<int>(StoreTier::kHost);

const ModelGeometry kGeo{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32,
                         /*d_v=*/64};

int64_t SlotValues() { return int64_t{kGeo.HeadsPerSlot()} * kGeo.d_k * kGeo.d_v; }

// A random key permutation per (layer, head): a store that ignored the
// layout's maps would restore rows in the wrong places.
std::vector<int32_t> RandomKeyPerm(int seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> perm;
  for (int h = 0; h < kGeo.HeadsPerSlot(); ++h) {
    std::vector<int32_t> p(kGeo.d_k);
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
    perm.insert(perm.end(), p.begin(), p.end());
  }
  return perm;
}

StateLayout Layout(const char* format, const std::vector<int32_t>& perm) {
  return StateLayout::Create(kGeo, ParseFormatSpec(format).value(), perm, {}, {}).value();
}

// Rows of very different magnitude, as recurrent states have.
std::vector<float> RandomStates(int seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> s(static_cast<size_t>(SlotValues()));
  for (size_t i = 0; i < s.size(); ++i) {
    const int row = static_cast<int>(i / kGeo.d_v) % kGeo.d_k;
    s[i] = n(rng) * (row % 4 == 0 ? 4.0f : 0.5f);
  }
  return s;
}

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    den += double{want[i]} * want[i];
  }
  return std::sqrt(num / den);
}

struct ColdCase {
  const char* format;
  double max_error;  // relative Frobenius error of the restored state
  double min_error;  // > 0: the cold format really was applied
};

class TranscoderTest : public ::testing::TestWithParam<ColdCase> {
 protected:
  void SetUp() override {
    backend_ = CpuBackend::Create(CpuBackend::Options{});
    perm_ = RandomKeyPerm(7);
    slot_layout_ = std::make_unique<StateLayout>(Layout("damp:16", perm_));
    prepared_ = backend_->Prepare(*slot_layout_).value();
    pool_ = SlotPool::Create(backend_.get(), *slot_layout_, 4).value();
    handles_ = pool_->Allocate(3).value();
    auto access = pool_->Acquire(handles_, "slots").value();
    for (int i = 0; i < 3; ++i) slot_[i] = access.indices()[i];
  }

  // The FP32 states of `slot` (natural order).
  std::vector<float> Unpack(const PreparedModel& model, const PoolView& view, int32_t slot) {
    std::vector<float> s(static_cast<size_t>(SlotValues()));
    EXPECT_TRUE(backend_->UnpackStates(model, view, &slot, 1, s.data()).ok());
    return s;
  }

  std::unique_ptr<CpuBackend> backend_;
  std::vector<int32_t> perm_;
  std::unique_ptr<StateLayout> slot_layout_;
  std::unique_ptr<PreparedModel> prepared_;
  std::unique_ptr<SlotPool> pool_;
  std::vector<SlotHandle> handles_;
  int32_t slot_[3] = {};
};

TEST_P(TranscoderTest, DemotedCheckpointRestoresWithinTheColdFormatsError) {
  const ColdCase& c = GetParam();
  const StateLayout cold = Layout(c.format, perm_);
  auto transcoder = CheckpointTranscoder::Create(backend_.get(), prepared_.get(), cold);
  ASSERT_TRUE(transcoder.ok()) << transcoder.status();
  EXPECT_EQ((*transcoder)->cold_slot_bytes(), cold.slot_bytes());
  EXPECT_LT(cold.slot_bytes(), slot_layout_->slot_bytes());

  // The live state: FP32 states packed into the damp:16 slot; `held` is what
  // the slot holds (the transcoding starts from it).
  const PoolView& view = pool_->view();
  const std::vector<float> fp32 = RandomStates(3);
  ASSERT_TRUE(backend_->PackStates(*prepared_, view, &slot_[0], 1, fp32.data()).ok());
  const std::vector<float> held = Unpack(*prepared_, view, slot_[0]);

  // One arena entry and a host tier: the second Put demotes the first.
  auto host = std::make_shared<HostTier>(int64_t{1} << 20);
  CheckpointStore::Options o;
  o.capacity = 1;
  o.host = host;
  o.transcoder = std::shared_ptr<CheckpointTranscoder>(std::move(*transcoder));
  auto store = CheckpointStore::Create(backend_.get(), *slot_layout_, o).value();
  const PrefixKey a = KeyOfTokens(std::vector<int32_t>{1, 2, 3});
  const PrefixKey b = KeyOfTokens(std::vector<int32_t>{9});
  ASSERT_TRUE(store->Put(a, view, slot_[0], {"aux"}).ok());
  ASSERT_TRUE(store->Put(b, view, slot_[1], {}).ok());
  CheckpointStats s = store->stats();
  EXPECT_EQ(s.transcodes_to_cold, 1);
  EXPECT_EQ(s.transcodes_from_cold, 0);
  // The host tier charges the cold bytes (+ 3 aux bytes), not the slot's.
  EXPECT_EQ(s.tiers[kHost].entries, 1);
  EXPECT_EQ(s.tiers[kHost].bytes, cold.slot_bytes() + 3);

  // A hit in the host tier is transcoded back on promotion.
  std::memset(view.slot(slot_[2]), 0x5a, static_cast<size_t>(view.slot_bytes()));
  auto hit = store->Lookup({a}, absl::ZeroDuration());
  ASSERT_TRUE(hit.ok() && hit->hit);
  EXPECT_EQ(hit->tier, StoreTier::kHost);
  auto restored = store->Restore(hit->key, hit->lease_id, view, slot_[2]);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_THAT(restored->aux, ::testing::ElementsAre("aux"));
  s = store->stats();
  EXPECT_EQ(s.transcodes_to_cold, 2);  // promoting `a` demoted `b`
  EXPECT_EQ(s.transcodes_from_cold, 1);
  EXPECT_TRUE(store->CheckInvariants().ok()) << store->CheckInvariants();

  const std::vector<float> back = Unpack(*prepared_, view, slot_[2]);
  const double err = RelativeError(back, held);
  EXPECT_LE(err, c.max_error) << c.format;
  EXPECT_GE(err, c.min_error) << c.format;

  // Exactly the decode-encode through FP32 of the two layouts.
  auto cold_prepared = backend_->Prepare(cold).value();
  auto cold_pool = SlotPool::Create(backend_.get(), cold, 1).value();
  auto cold_handle = cold_pool->Allocate(1).value();
  auto cold_access = cold_pool->Acquire(cold_handle, "slots").value();
  const int32_t cs = cold_access.indices()[0];
  ASSERT_TRUE(
      backend_->PackStates(*cold_prepared, cold_pool->view(), &cs, 1, held.data()).ok());
  const std::vector<float> via_cold = Unpack(*cold_prepared, cold_pool->view(), cs);
  ASSERT_TRUE(backend_->PackStates(*prepared_, view, &slot_[1], 1, via_cold.data()).ok());
  EXPECT_EQ(std::memcmp(view.slot(slot_[1]), view.slot(slot_[2]),
                        static_cast<size_t>(view.slot_bytes())),
            0)
      << "the restored slot differs from damp:16(" << c.format << "(held))";
}

// Bounds: about 1.5x the error each format has on these states (int8-hadamard
// 0.39%, int4-hadamard 8.1%, stepquant-4 7.4%: 8 vs 4 bits per value), and
// at least a third of it (a store that kept the damp:16 bytes would be exact).
INSTANTIATE_TEST_SUITE_P(ColdFormats, TranscoderTest,
                         ::testing::Values(ColdCase{"int8-hadamard", 0.006, 0.0013},
                                           ColdCase{"int4-hadamard", 0.12, 0.027},
                                           ColdCase{"stepquant-4", 0.12, 0.025}),
                         [](const ::testing::TestParamInfo<ColdCase>& info) {
                           std::string n = info.param.format;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// Write-through with a cold format: the remote tier receives the snapshot's
// cold encoding (encoded from the caller's slot outside the store's lock),
// byte for byte what the transcoder makes of the stored checkpoint.
TEST_F(TranscoderTest, WriteThroughSendsTheColdEncoding) {
  const StateLayout cold = Layout("int8-hadamard", perm_);
  std::shared_ptr<CheckpointTranscoder> transcoder =
      CheckpointTranscoder::Create(backend_.get(), prepared_.get(), cold).value();
  const PoolView& view = pool_->view();
  const std::vector<float> fp32 = RandomStates(5);
  ASSERT_TRUE(backend_->PackStates(*prepared_, view, &slot_[0], 1, fp32.data()).ok());
  auto remote = std::make_shared<GatedRemote>();
  CheckpointStore::Options o;
  o.capacity = 2;
  o.remote = remote;
  o.remote_write_through = true;
  o.transcoder = transcoder;
  auto store = CheckpointStore::Create(backend_.get(), *slot_layout_, o).value();
  const PrefixKey key = KeyOfTokens(std::vector<int32_t>{4, 5});
  ASSERT_TRUE(store->Put(key, view, slot_[0], {"aux"}).ok());
  CheckpointBlob sent;
  for (int i = 0; i < 500 && !remote->Held(key, &sent); ++i) absl::SleepFor(absl::Milliseconds(2));
  ASSERT_TRUE(remote->Held(key, &sent)) << "the write-through never reached the remote tier";
  const std::string want = transcoder->ToCold(view, slot_[0]).value();
  EXPECT_EQ(sent.packed.size(), static_cast<size_t>(cold.slot_bytes()));
  EXPECT_TRUE(sent.packed == want) << "the written-through bytes differ from the cold encoding";
  EXPECT_THAT(sent.aux, ::testing::ElementsAre("aux"));
  EXPECT_EQ(store->stats().transcodes_to_cold, 1);
  EXPECT_TRUE(store->Contains(key));
}

TEST_F(TranscoderTest, WrongSizeAndGeometryAreRefused) {
  const StateLayout cold = Layout("int4-hadamard", perm_);
  auto t = CheckpointTranscoder::Create(backend_.get(), prepared_.get(), cold).value();
  const absl::Status short_blob = t->FromCold(std::string(10, '\0'), pool_->view(), slot_[0]);
  EXPECT_EQ(short_blob.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(short_blob.message()), ::testing::HasSubstr("int4-hadamard"));
  ModelGeometry other = kGeo;
  other.layers = 3;
  const StateLayout wrong =
      StateLayout::Identity(other, ParseFormatSpec("int4-hadamard").value()).value();
  auto bad = CheckpointTranscoder::Create(backend_.get(), prepared_.get(), wrong);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("checkpoint_format"));
}

}  // namespace
}  // namespace statecache
