// RemoteStateStore against a real statecached (a child process on a private
// unix socket, CPU backend; see child_server.h for why not in process): the reference worker running gdn-tiny on the remote store
// produces logits bit-identical to the same worker on an in-process
// BackendStateStore with the same (calibrated-style, permuted) DAMP layout,
// including across a checkpoint: snapshot with the conv windows as aux bytes,
// restore into another slot and session, continue.
#include "client/remote_store/remote_state_store.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "client/model/backend_state_store.h"
#include "client/model/model.h"
#include "kernels/backend/backend.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/io/test_data.h"
#include "client/remote_store/child_server.h"

namespace statecache {
namespace {

using ::absl::StatusCode;
using ::testing::HasSubstr;

// A damp:16 layout with a random key permutation per head (stands in for a
// calibrated one: the server must apply exactly the same maps).
StateLayout PermutedLayout(const ModelGeometry& g, const std::string& format) {
  std::mt19937 rng(7);
  std::vector<int32_t> perm;
  for (int h = 0; h < g.layers * g.h_v; ++h) {
    std::vector<int32_t> p(g.d_k);
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
    perm.insert(perm.end(), p.begin(), p.end());
  }
  return StateLayout::Create(g, ParseFormatSpec(format).value(), perm, {}, {}).value();
}

std::vector<int32_t> Bytes(const std::string& s) {
  std::vector<int32_t> out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}

class RemoteStateStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto dir = SharedDataPath("models/gdn-tiny");
    ASSERT_TRUE(dir.ok()) << dir.status();
    auto model = LanguageModel::Load(*dir, {});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(model_, nullptr);
    auto server = StartCpuChild(8388608, 4194304);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto client = StateCacheClient::Connect(server_->address());
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
    geometry_ = model_->config().Geometry();
    layout_ = PermutedLayout(geometry_, "damp:16");
    ModelRegistration r;
    r.model_id = "gdn";
    r.geometry = geometry_;
    r.format = "damp:16";
    r.key_perm = layout_->all_key_perms();
    r.slots = 4;
    auto info = client_->RegisterModel(r);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_FALSE(info->identity_layout());
    ASSERT_EQ(info->tags().layout_fingerprint(), layout_->Fingerprint());
    backend_ = CreateBackend("cpu").value();
  }

  std::unique_ptr<RemoteStateStore> Remote(bool stream = true, bool with_layout = true) {
    RemoteStateStore::Options o;
    o.use_stream = stream;
    if (with_layout) o.layout = *layout_;
    auto s = RemoteStateStore::Create(client_.get(), "gdn", o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static LanguageModel* model_;
  std::unique_ptr<ChildServer> server_;
  std::unique_ptr<StateCacheClient> client_;
  ModelGeometry geometry_;
  std::optional<StateLayout> layout_;
  std::unique_ptr<Backend> backend_;
};

LanguageModel* RemoteStateStoreTest::model_ = nullptr;

// Runs the fixed script: prefill `a`, then decode `b` one byte per call, then
// one multi-token decode call of `c`. Returns all logits.
std::vector<float> RunScript(ModelSession& s, const std::vector<int32_t>& a,
                             const std::vector<int32_t>& b, const std::vector<int32_t>& c) {
  std::vector<float> all, logits;
  EXPECT_TRUE(s.Forward(a, RecurrentMode::kPrefill, &logits).ok());
  all.insert(all.end(), logits.begin(), logits.end());
  for (int32_t t : b) {
    absl::Status st = s.Forward({t}, RecurrentMode::kDecode, &logits);
    EXPECT_TRUE(st.ok()) << st;
    all.insert(all.end(), logits.begin(), logits.end());
  }
  absl::Status st = s.Forward(c, RecurrentMode::kDecode, &logits);
  EXPECT_TRUE(st.ok()) << st;
  all.insert(all.end(), logits.begin(), logits.end());
  return all;
}

bool BitIdentical(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

TEST_F(RemoteStateStoreTest, WorkerOutputsBitIdenticalToInProcessBackendAcrossCheckpoint) {
  const std::vector<int32_t> text = Bytes(
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
      "    for _ in range(n):\n        a, b = b, a + b\n    return a\n");
  const std::vector<int32_t> p1(text.begin(), text.begin() + 40), d1(text.begin() + 40,
                                                                    text.begin() + 46),
      m1(text.begin() + 46, text.begin() + 60);
  const std::vector<int32_t> p2(text.begin() + 60, text.begin() + 90),
      d2(text.begin() + 90, text.begin() + 95), m2(text.begin() + 95, text.begin() + 110);
  const std::vector<int32_t> turn1(text.begin(), text.begin() + 60);

  // In process: one session straight through.
  auto local = BackendStateStore::Create(backend_.get(), *layout_);
  ASSERT_TRUE(local.ok());
  ModelSession ref(model_, local->get());
  const std::vector<float> ref1 = RunScript(ref, p1, d1, m1);
  auto ref_states = (*local)->ReadStates();
  ASSERT_TRUE(ref_states.ok());
  const std::vector<float> ref2 = RunScript(ref, p2, d2, m2);

  // Remote, turn 1, then a checkpoint.
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "UpdateStream" : "unary Update");
    auto a = Remote(stream);
    ASSERT_NE(a, nullptr);
    ModelSession sa(model_, a.get());
    EXPECT_TRUE(BitIdentical(RunScript(sa, p1, d1, m1), ref1));
    // 6 single-token decode calls + one 14-token call, 4 layers each.
    EXPECT_EQ(a->update_micros().size(), static_cast<size_t>((6 + 14) * geometry_.layers));
    auto states = a->ReadStates();
    ASSERT_TRUE(states.ok()) << states.status();
    EXPECT_TRUE(BitIdentical(*states, *ref_states));
    auto key = SnapshotSession(sa, *a, turn1);
    ASSERT_TRUE(key.ok()) << key.status();
    EXPECT_EQ(key->num_tokens, 60);

    // Turn 2 in a fresh slot and session: restore the longest prefix of the
    // whole turn-2 prompt, run only the new bytes.
    auto b = Remote(stream);
    ASSERT_NE(b, nullptr);
    ModelSession sb(model_, b.get());
    std::vector<int32_t> prompt2 = turn1;
    prompt2.insert(prompt2.end(), p2.begin(), p2.end());
    auto r = RestoreSession(sb, *b, prompt2);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->hit);
    EXPECT_EQ(r->restored_tokens, 60);
    EXPECT_TRUE(BitIdentical(RunScript(sb, p2, d2, m2), ref2));

    // The checkpoint was copied, not moved: a second restore still hits.
    auto c = Remote(stream);
    ASSERT_NE(c, nullptr);
    ModelSession sc(model_, c.get());
    auto r2 = RestoreSession(sc, *c, prompt2);
    ASSERT_TRUE(r2.ok());
    EXPECT_TRUE(r2->hit);
    EXPECT_TRUE(BitIdentical(RunScript(sc, p2, d2, m2), ref2));
  }
}

TEST_F(RemoteStateStoreTest, ConvWindowsAreNeededAndMissResetsTheSession) {
  const std::vector<int32_t> text = Bytes("The quick brown fox jumps over the lazy dog. 0123456789");
  const std::vector<int32_t> head(text.begin(), text.begin() + 30), tail(text.begin() + 30,
                                                                         text.end());
  auto a = Remote();
  ASSERT_NE(a, nullptr);
  ModelSession sa(model_, a.get());
  std::vector<float> logits, want;
  ASSERT_TRUE(sa.Forward(head, RecurrentMode::kPrefill, &logits).ok());
  ASSERT_TRUE(SnapshotSession(sa, *a, head).ok());
  // Checkpoint without aux bytes under a different prefix.
  const std::vector<int32_t> other(text.begin(), text.begin() + 29);
  ASSERT_TRUE(a->Snapshot(other, {}).ok());
  ASSERT_TRUE(sa.Forward(tail, RecurrentMode::kDecode, &want).ok());

  // Restoring the states without the conv windows would give other logits:
  auto b = Remote();
  ModelSession sb(model_, b.get());
  ASSERT_TRUE(b->RestoreLongestPrefix(head).ok());
  ASSERT_TRUE(sb.Forward(tail, RecurrentMode::kDecode, &logits).ok());
  EXPECT_FALSE(BitIdentical(logits, want));
  // ... with them, identical.
  auto c = Remote();
  ModelSession sc(model_, c.get());
  auto r = RestoreSession(sc, *c, text);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->restored_tokens, 30);
  ASSERT_TRUE(sc.Forward(tail, RecurrentMode::kDecode, &logits).ok());
  EXPECT_TRUE(BitIdentical(logits, want));

  // The aux-less checkpoint is the longest cached prefix of `other`+1 byte.
  std::vector<int32_t> probe = other;
  probe.push_back('x');
  auto bad = RestoreSession(sc, *c, probe);
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("aux"));

  // A miss resets the session: zero states, and then the run equals a fresh
  // session's.
  auto d = Remote();
  ModelSession sd(model_, d.get());
  ASSERT_TRUE(sd.Forward(head, RecurrentMode::kPrefill, &logits).ok());
  auto miss = RestoreSession(sd, *d, Bytes("zzz"));
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->hit);
  EXPECT_EQ(miss->restored_tokens, 0);
  auto zero = d->ReadStates();
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(std::all_of(zero->begin(), zero->end(), [](float x) { return x == 0.f; }));
  EXPECT_EQ(sd.ExportAuxBytes(), std::string(sd.ExportAuxBytes().size(), '\0'));
}

TEST_F(RemoteStateStoreTest, StatesRoundTripAndReset) {
  auto a = Remote();
  ASSERT_NE(a, nullptr);
  const int64_t n = StateElements(geometry_);
  std::vector<float> states(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 0.5f);
  for (float& x : states) x = normal(rng);
  ASSERT_TRUE(a->WriteStates(states).ok());
  // Same packing as in process.
  auto local = BackendStateStore::Create(backend_.get(), *layout_);
  ASSERT_TRUE((*local)->WriteStates(states).ok());
  EXPECT_TRUE(BitIdentical(*a->ReadStates(), *(*local)->ReadStates()));

  const SlotHandle before = a->slot();
  ASSERT_TRUE(a->Reset().ok());
  EXPECT_NE(a->slot(), before);
  auto zero = a->ReadStates();
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(std::all_of(zero->begin(), zero->end(), [](float x) { return x == 0.f; }));
  // The old handle is stale on the server.
  EXPECT_EQ(client_->Export("gdn", before).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(RemoteStateStoreTest, Errors) {
  RemoteStateStore::Options o;
  EXPECT_EQ(RemoteStateStore::Create(client_.get(), "nope", o).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(RemoteStateStore::Create(nullptr, "gdn", o).status().code(),
            StatusCode::kInvalidArgument);
  o.pipeline = 0;
  EXPECT_EQ(RemoteStateStore::Create(client_.get(), "gdn", o).status().code(),
            StatusCode::kInvalidArgument);
  o.pipeline = 8;
  o.layout = StateLayout::Identity(geometry_, *ParseFormatSpec("damp:16")).value();
  auto wrong = RemoteStateStore::Create(client_.get(), "gdn", o);
  EXPECT_EQ(wrong.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("fingerprint"));

  auto a = Remote(/*stream=*/true, /*with_layout=*/false);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->ReadStates().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->WriteStates({1.f}).code(), StatusCode::kInvalidArgument);
  std::vector<float> q(geometry_.h_qk * geometry_.d_k, 0.f), v(geometry_.h_v * geometry_.d_v),
      gate(geometry_.h_v, -0.1f), beta(geometry_.h_v, 0.5f), o_out(v.size());
  q[0] = 1.f;
  RecurrentInputs in{1, q.data(), q.data(), v.data(), gate.data(), beta.data()};
  EXPECT_EQ(a->Decode(geometry_.layers, in, o_out.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Decode(0, in, nullptr).code(), StatusCode::kInvalidArgument);
  // A server-side rejection (NaN) comes back with its code and the stream
  // keeps working.
  v[0] = std::nanf("");
  absl::Status nan = a->Decode(0, in, o_out.data());
  EXPECT_EQ(nan.code(), StatusCode::kInvalidArgument) << nan;
  v[0] = 0.f;
  EXPECT_TRUE(a->Decode(0, in, o_out.data()).ok());
  // Pool full: 4 slots, `a` holds one.
  std::vector<std::unique_ptr<RemoteStateStore>> more;
  for (int i = 0; i < 3; ++i) more.push_back(Remote());
  EXPECT_EQ(RemoteStateStore::Create(client_.get(), "gdn", {}).status().code(),
            StatusCode::kResourceExhausted);
  more.clear();  // releases
  EXPECT_TRUE(RemoteStateStore::Create(client_.get(), "gdn", {}).ok());
}

}  // namespace
}  // namespace statecache
