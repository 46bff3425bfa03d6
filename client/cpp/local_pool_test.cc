// LocalPool on the CPU backend: a pool over caller memory is a faithful pool
// (ops on it give the bytes and outputs of the validated path on a pool the
// backend allocated), a calibrated layout file is used, and bad options or
// memory are refused naming the field.
#include "client/cpp/local_pool.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/stream_ops.h"
#include "kernels/formats/format.h"
#include "kernels/layout/layout_file.h"
#include "kernels/layout/state_layout.h"

namespace statecache {
namespace {

const ModelGeometry kGeo{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32,
                         /*d_v=*/32};

LocalPoolOptions Options(const char* format) {
  LocalPoolOptions o;
  o.backend = "cpu";
  o.geometry = kGeo;
  o.format = ParseFormatSpec(format).value();
  return o;
}

// 256-byte aligned caller memory (an engine's tensor).
struct Memory {
  explicit Memory(int64_t n) : bytes(n), data(static_cast<uint8_t*>(std::aligned_alloc(256, n))) {
    std::memset(data, 0, n);
  }
  ~Memory() { std::free(data); }
  int64_t bytes;
  uint8_t* data;
};

std::vector<float> Random(size_t n, int seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

TEST(LocalPoolTest, OpsOnCallerMemoryEqualTheValidatedPathOnABackendPool) {
  const LocalPoolOptions o = Options("damp:8");
  const StateLayout layout = LocalPool::Layout(o).value();
  const int64_t sb = layout.slot_bytes();
  Memory mem(3 * sb + 100);  // three slots and a remainder
  auto local = LocalPool::Create(o, mem.data, mem.bytes);
  ASSERT_TRUE(local.ok()) << local.status();
  LocalPool& p = **local;
  EXPECT_EQ(p.pool().num_slots, 3);
  EXPECT_EQ(p.pool().slot_bytes(), sb);
  EXPECT_EQ(p.pool().base, mem.data);

  // The reference: a pool the backend allocated, same layout, validated calls.
  Backend& backend = p.backend();
  auto ref_buf = backend.Allocate(3 * sb).value();
  PoolView ref = p.pool();
  ref.base = ref_buf->data();

  const int64_t per_slot = kGeo.HeadsPerSlot() * kGeo.d_k * kGeo.d_v;
  const std::vector<float> states = Random(2 * per_slot, 1, 0.3f);
  const int32_t slots[2] = {2, 0};
  StreamOps& ops = backend.stream_ops();
  std::vector<uint8_t> record_mem(ops.RecordBytes(3) + 16);
  OpRecord record{record_mem.data(), ops.RecordBytes(3)};
  ASSERT_TRUE(ops.InitRecord(record, nullptr).ok());
  ASSERT_TRUE(ops.EnqueuePack(p.prepared(), p.pool(), slots, 2, states.data(), record, nullptr)
                  .ok());
  ASSERT_TRUE(backend.PackStates(p.prepared(), ref, slots, 2, states.data()).ok());

  const std::vector<float> q = Random(2 * kGeo.h_qk * kGeo.d_k, 2, 0.2f);
  const std::vector<float> k = Random(2 * kGeo.h_qk * kGeo.d_k, 3, 0.2f);
  const std::vector<float> v = Random(2 * kGeo.h_v * kGeo.d_v, 4, 1.0f);
  const std::vector<float> g(2 * kGeo.h_v, -0.1f), beta(2 * kGeo.h_v, 0.5f);
  std::vector<float> o_local(2 * kGeo.h_v * kGeo.d_v), o_ref(o_local.size());
  DecodeInputs in;
  in.batch = 2;
  in.slots = slots;
  in.q = q.data();
  in.k = k.data();
  in.v = v.data();
  in.g = g.data();
  in.beta = beta.data();
  in.o = o_local.data();
  ASSERT_TRUE(ops.EnqueueDecode(p.prepared(), p.pool(), 1, in, record, nullptr).ok());
  in.o = o_ref.data();
  ASSERT_TRUE(backend.DecodeUpdate(p.prepared(), ref, 1, in).ok());
  ASSERT_TRUE(ops.CheckRecord(record, nullptr, /*reset=*/true).ok());
  EXPECT_EQ(o_local, o_ref);
  EXPECT_EQ(0, std::memcmp(mem.data, ref_buf->data(), 3 * sb));
  for (int64_t i = 3 * sb; i < mem.bytes; ++i) ASSERT_EQ(mem.data[i], 0) << "byte " << i;

  // Bad data is recorded and writes nothing, as on any pool.
  const std::vector<uint8_t> before(mem.data, mem.data + 3 * sb);
  std::vector<float> bad_beta = beta;
  bad_beta[3] = 7.0f;
  in.beta = bad_beta.data();
  in.o = o_local.data();
  ASSERT_TRUE(ops.EnqueueDecode(p.prepared(), p.pool(), 0, in, record, nullptr).ok());
  const absl::Status recorded = ops.CheckRecord(record, nullptr, /*reset=*/true);
  EXPECT_EQ(recorded.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(recorded.message().find("beta[3]"), std::string::npos) << recorded;
  EXPECT_EQ(0, std::memcmp(mem.data, before.data(), before.size()));
}

// Slots inside bigger records (an engine's pages): as many as fit, the last
// one needing only slot_bytes.
TEST(LocalPoolTest, StrideCountsTheSlotsThatFit) {
  const LocalPoolOptions o = Options("damp:8");
  const int64_t sb = LocalPool::Layout(o).value().slot_bytes();
  const int64_t stride = sb + 256;
  Memory mem(2 * stride + sb);
  auto pool = LocalPool::Create(o, mem.data, mem.bytes, stride);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->pool().num_slots, 3);
  EXPECT_EQ((*pool)->pool().stride(), stride);
  EXPECT_EQ((*pool)->pool().slot(2), mem.data + 2 * stride);
  auto short_tail = LocalPool::Create(o, mem.data, mem.bytes - 1, stride);
  ASSERT_TRUE(short_tail.ok()) << short_tail.status();
  EXPECT_EQ((*short_tail)->pool().num_slots, 2);
  auto packed = LocalPool::Create(o, mem.data, mem.bytes, sb);  // stride == slot_bytes
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ((*packed)->pool().slot_stride, 0);
  EXPECT_EQ((*packed)->pool().num_slots, mem.bytes / sb);
}

TEST(LocalPoolTest, UsesTheLayoutFile) {
  LocalPoolOptions o = Options("damp:8");
  std::vector<int32_t> perm;
  for (int h = 0; h < kGeo.HeadsPerSlot(); ++h) {
    for (int r = 0; r < kGeo.d_k; ++r) perm.push_back((r * 7 + h) % kGeo.d_k);
  }
  const StateLayout calibrated = StateLayout::Create(kGeo, o.format, perm, {}, {}).value();
  const char* tmp = std::getenv("TEST_TMPDIR");
  o.layout_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/local_pool_layout.safetensors";
  ASSERT_TRUE(WriteLayoutFile(calibrated, {}, {}, o.layout_path).ok());
  const StateLayout read = LocalPool::Layout(o).value();
  EXPECT_EQ(read.all_key_perms(), calibrated.all_key_perms());
  EXPECT_NE(read.all_key_perms(), LocalPool::Layout(Options("damp:8")).value().all_key_perms());

  LocalPoolOptions other = o;
  other.geometry.layers = 3;  // the file was written for 2 layers
  const absl::Status wrong = LocalPool::Layout(other).status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("geometry"), std::string::npos) << wrong;
}

// One pool per layer over a file of several layers (vLLM's pages: one pool
// per state tensor) takes that layer's maps.
TEST(LocalPoolTest, LayoutLayerTakesOneLayerOfTheFile) {
  LocalPoolOptions o = Options("damp-sr:8");
  std::vector<int32_t> perm, order;
  std::vector<float> scale;
  for (int h = 0; h < kGeo.HeadsPerSlot(); ++h) {
    for (int r = 0; r < kGeo.d_k; ++r) perm.push_back((r * 5 + 3 * h + 1) % kGeo.d_k);
    for (int c = 0; c < kGeo.d_v; ++c) {
      order.push_back((c * 7 + h) % kGeo.d_v);
      scale.push_back(0.5f + 0.01f * (h * kGeo.d_v + c));
    }
  }
  const StateLayout two = StateLayout::Create(kGeo, o.format, perm, order, scale).value();
  const char* tmp = std::getenv("TEST_TMPDIR");
  o.layout_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/local_pool_layers.safetensors";
  ASSERT_TRUE(WriteLayoutFile(two, {}, {}, o.layout_path).ok());
  o.geometry.layers = 1;
  o.layout_layer = 1;
  const StateLayout one = LocalPool::Layout(o).value();
  EXPECT_EQ(one.geometry().layers, 1);
  const int64_t kn = int64_t{kGeo.h_v} * kGeo.d_k, vn = int64_t{kGeo.h_v} * kGeo.d_v;
  EXPECT_EQ(one.all_key_perms(), std::vector<int32_t>(perm.begin() + kn, perm.end()));
  EXPECT_EQ(one.all_value_orders(), std::vector<int32_t>(order.begin() + vn, order.end()));
  EXPECT_EQ(one.all_value_scales(), std::vector<float>(scale.begin() + vn, scale.end()));
  EXPECT_EQ(one.slot_bytes() * 2, two.slot_bytes());

  auto expect = [](const LocalPoolOptions& bad, const char* field) {
    const absl::Status s = LocalPool::Layout(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  };
  LocalPoolOptions bad = o;
  bad.layout_layer = 2;
  expect(bad, "layout_layer: 2 is outside");
  bad = o;
  bad.geometry.layers = 2;
  expect(bad, "layout_layer: a pool of one file layer");
  bad = o;
  bad.geometry.h_v = 4;
  bad.geometry.h_qk = 2;
  expect(bad, "geometry");
  bad = o;
  bad.layout_path.clear();
  expect(bad, "layout_layer: set without");
  EXPECT_EQ(two.Layer(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalPoolTest, BadOptionsAndMemoryNameTheField) {
  LocalPoolOptions o = Options("int8-hadamard");
  const int64_t sb = LocalPool::Layout(o).value().slot_bytes();
  Memory mem(2 * sb + 64);
  auto expect = [](const absl::Status& s, absl::StatusCode code, const char* field) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  };
  expect(LocalPool::Create(o, nullptr, mem.bytes).status(), absl::StatusCode::kInvalidArgument,
         "base");
  expect(LocalPool::Create(o, mem.data + 8, mem.bytes - 8).status(),
         absl::StatusCode::kInvalidArgument, "base");
  expect(LocalPool::Create(o, mem.data, sb - 1).status(), absl::StatusCode::kInvalidArgument,
         "bytes");
  expect(LocalPool::Create(o, mem.data, mem.bytes, sb - 16).status(),
         absl::StatusCode::kInvalidArgument, "slot_stride");
  expect(LocalPool::Create(o, mem.data, mem.bytes, sb + 8).status(),
         absl::StatusCode::kInvalidArgument, "slot_stride");
  LocalPoolOptions bad = o;
  bad.geometry.d_v = 48;  // not a multiple of 32
  expect(LocalPool::Layout(bad).status(), absl::StatusCode::kInvalidArgument, "d_v");
  LocalPoolOptions step = Options("stepquant-4");
  expect(LocalPool::Layout(step).status(), absl::StatusCode::kUnimplemented, "format");
  LocalPoolOptions nobackend = o;
  nobackend.backend = "tpu";
  expect(LocalPool::Create(nobackend, mem.data, mem.bytes).status(),
         absl::StatusCode::kInvalidArgument, "tpu");
  for (const char* name : {"cuda:x", "cuda:-1", "cuda:"}) {
    nobackend.backend = name;
    expect(LocalPool::Create(nobackend, mem.data, mem.bytes).status(),
           absl::StatusCode::kInvalidArgument, "does not name a device");
  }
}

}  // namespace
}  // namespace statecache
