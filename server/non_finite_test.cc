// NaN / Inf handling of the compute RPCs: rejected (INVALID_ARGUMENT, nothing
// written) by default; with sanitize_non_finite they are replaced by 0 and
// the result equals that of the same request with explicit zeros.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/formats/numeric.h"
#include "server/core/log.h"
#include "server/core/model_registry.h"
#include "server/core/proto_convert.h"
#include "server/statecache_service.h"

namespace statecache {
namespace {

using ::testing::StartsWith;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

void Fp32(const std::vector<float>& v, std::vector<int64_t> shape, v1::Tensor* t) {
  t->set_dtype(v1::DTYPE_FP32);
  for (int64_t d : shape) t->add_shape(d);
  t->set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
}

class NonFiniteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLoggingEnabled(false);
    backend_ = CpuBackend::Create({1});
    ModelRegistry::Options ro;
    ro.state_budget_bytes = 1 << 20;
    ro.checkpoint_budget_bytes = 0;
    registry_ = std::make_unique<ModelRegistry>(backend_.get(), ro);
    service_ = std::make_unique<StateCacheService>(backend_.get(), registry_.get(), nullptr,
                                                   StateCacheService::Limits());
    v1::RegisterModelRequest reg;
    reg.set_model_id("m");
    reg.set_format("damp:8");
    *reg.mutable_geometry() = GeometryToProto({Arch::kGdn, 1, 1, 1, 32, 32});
    reg.set_slots(2);
    v1::RegisterModelResponse info;
    ASSERT_TRUE(service_->DoRegisterModel(caller(), reg, &info).ok());
    v1::AllocateSlotsRequest a;
    a.set_model_id("m");
    a.set_count(2);
    ASSERT_TRUE(service_->DoAllocateSlots(caller(), a, &slots_).ok());
  }
  Tenant& caller() { return service_->default_tenant(); }
  std::string Packed(int slot) {
    v1::ExportRequest e;
    e.set_model_id("m");
    *e.mutable_slot() = slots_.slots(slot);
    v1::ExportResponse out;
    EXPECT_TRUE(service_->DoExport(caller(), e, &out).ok());
    return out.packed();
  }
  v1::UpdateRequest Update(int slot, std::vector<float> v, float g, float beta) {
    v1::UpdateRequest u;
    u.set_model_id("m");
    *u.add_slots() = slots_.slots(slot);
    std::vector<float> q(32, 0.f);
    q[0] = 1.f;
    Fp32(q, {1, 1, 32}, u.mutable_q());
    Fp32(q, {1, 1, 32}, u.mutable_k());
    Fp32(v, {1, 1, 32}, u.mutable_v());
    Fp32({g}, {1, 1}, u.mutable_g());
    Fp32({beta}, {1, 1}, u.mutable_beta());
    return u;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ModelRegistry> registry_;
  std::unique_ptr<StateCacheService> service_;
  v1::AllocateSlotsResponse slots_;
};

TEST_F(NonFiniteTest, RejectedByDefaultAndNothingWritten) {
  std::vector<float> v(32, 0.5f);
  v[3] = kNaN;
  const std::string before = Packed(0);
  v1::UpdateResponse resp;
  absl::Status s = service_->DoUpdate(caller(), Update(0, v, -0.1f, 0.5f), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("v"));
  EXPECT_EQ(Packed(0), before);
  s = service_->DoUpdate(caller(), Update(0, std::vector<float>(32, 0.5f), -kInf, 0.5f), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = service_->DoUpdate(caller(), Update(0, std::vector<float>(32, 0.5f), -0.1f, kNaN), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Packed(0), before);
}

TEST_F(NonFiniteTest, SanitizeReplacesByZeroExactly) {
  std::vector<float> dirty(32, 0.5f), clean(32, 0.5f);
  dirty[3] = kNaN;
  dirty[9] = -kInf;
  clean[3] = clean[9] = 0.f;
  v1::UpdateRequest a = Update(0, dirty, kNaN, 0.5f);
  a.set_sanitize_non_finite(true);
  v1::UpdateResponse ra, rb;
  ASSERT_TRUE(service_->DoUpdate(caller(), a, &ra).ok());
  EXPECT_EQ(ra.sanitized_values(), 3);
  ASSERT_TRUE(service_->DoUpdate(caller(), Update(1, clean, 0.f, 0.5f), &rb).ok());
  EXPECT_EQ(rb.sanitized_values(), 0);
  EXPECT_EQ(ra.o().data(), rb.o().data());
  EXPECT_EQ(Packed(0), Packed(1));
}

TEST_F(NonFiniteTest, SanitizeHalfPrecisionAndPrefill) {
  // bf16 q with an Inf: replaced.
  v1::UpdateRequest u = Update(0, std::vector<float>(32, 0.25f), -0.1f, 0.5f);
  std::vector<uint16_t> half(32, FloatToBf16Bits(0.f));
  half[0] = FloatToBf16Bits(1.f);
  half[5] = 0x7f80;  // +Inf
  auto set16 = [&](v1::Tensor* t, const std::vector<uint16_t>& bits) {
    t->set_dtype(v1::DTYPE_BF16);
    t->set_data(std::string(reinterpret_cast<const char*>(bits.data()), bits.size() * 2));
  };
  set16(u.mutable_q(), half);
  std::vector<uint16_t> kbits(32, FloatToBf16Bits(0.f));
  kbits[0] = FloatToBf16Bits(1.f);
  set16(u.mutable_k(), kbits);
  std::vector<uint16_t> vbits(32, FloatToBf16Bits(0.25f));
  set16(u.mutable_v(), vbits);
  v1::UpdateResponse r;
  EXPECT_EQ(service_->DoUpdate(caller(), u, &r).code(), absl::StatusCode::kInvalidArgument);
  u.set_sanitize_non_finite(true);
  ASSERT_TRUE(service_->DoUpdate(caller(), u, &r).ok());
  EXPECT_EQ(r.sanitized_values(), 1);
  for (int i = 0; i < 32; ++i) {
    float o;
    std::memcpy(&o, r.o().data().data() + 4 * i, 4);
    EXPECT_TRUE(std::isfinite(o));
  }

  v1::PrefillRequest p;
  p.set_model_id("m");
  *p.add_slots() = slots_.slots(1);
  v1::PrefillTokens* t = p.mutable_tokens();
  std::vector<float> q(2 * 32, 0.f);
  q[0] = q[32] = 1.f;
  Fp32(q, {1, 2, 1, 32}, t->mutable_q());
  Fp32(q, {1, 2, 1, 32}, t->mutable_k());
  std::vector<float> v(2 * 32, 0.5f);
  v[40] = kNaN;
  Fp32(v, {1, 2, 1, 32}, t->mutable_v());
  Fp32({-0.1f, -kInf}, {1, 2, 1}, t->mutable_g());
  Fp32({0.5f, 0.5f}, {1, 2, 1}, t->mutable_beta());
  const std::string before = Packed(1);
  v1::PrefillResponse pr;
  EXPECT_EQ(service_->DoPrefill(caller(), p, &pr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Packed(1), before);
  t->set_sanitize_non_finite(true);
  ASSERT_TRUE(service_->DoPrefill(caller(), p, &pr).ok());
  EXPECT_EQ(pr.sanitized_values(), 2);
  EXPECT_NE(Packed(1), before);
}

TEST_F(NonFiniteTest, FiniteButHugeInputsAreRejectedBeforeTheyOverflow) {
  // Found by request_fuzz: keys around 1e33 overflowed the FP32 recurrence
  // into NaN. q / k must be L2-normalized, |v| bounded.
  const std::string before = Packed(0);
  v1::UpdateRequest u = Update(0, std::vector<float>(32, 0.5f), -0.1f, 0.5f);
  std::vector<float> k(32, 0.f);
  k[0] = 1.2e33f;
  u.clear_k();
  Fp32(k, {1, 1, 32}, u.mutable_k());
  v1::UpdateResponse r;
  absl::Status s = service_->DoUpdate(caller(), u, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("k: row 0 has L2 norm 1.2e+33 > 1"));
  std::vector<float> big(32, 0.5f);
  big[7] = 1e6f;
  s = service_->DoUpdate(caller(), Update(0, big, -0.1f, 0.5f), &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("v: element 7 = 1e+06 exceeds |v| <= 65504"));
  EXPECT_EQ(Packed(0), before);
  // A slightly-over-1 norm from half-precision rounding is fine.
  std::vector<float> q(32, 0.f);
  q[0] = 1.004f;
  v1::UpdateRequest ok = Update(0, std::vector<float>(32, 0.5f), -0.1f, 0.5f);
  ok.clear_q();
  Fp32(q, {1, 1, 32}, ok.mutable_q());
  EXPECT_TRUE(service_->DoUpdate(caller(), ok, &r).ok());
}

}  // namespace
}  // namespace statecache
