// Security tests of statecached on loopback: TLS and mutual TLS with
// certificates generated at test time, the loopback-only plaintext rule,
// bearer-token authentication, tenant isolation (another tenant's model,
// handle or prefix key is indistinguishable from an unknown one), per-tenant
// quotas, per-request work bounds and unguessable handles.
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/statecache_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth/tenants.h"
#include "server/core/log.h"
#include "server/loopback.h"
#include "server/pool/prefix_key.h"
#include "server/server.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string TmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// Certificates are generated once per test binary run (never committed).
const std::string& CertDir() {
  static const std::string* dir = [] {
    auto* d = new std::string(TmpDir() + "/certs");
    const std::string cmd = absl::StrCat("bash tests/e2e/testdata/make_test_certs.sh '", *d, "'");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return *dir;
}
std::string Cert(const char* name) { return CertDir() + "/" + name; }

ModelRegistration Tiny(const std::string& id, int64_t slots = 4, int64_t checkpoints = 2) {
  ModelRegistration r;
  r.model_id = id;
  r.geometry = ModelGeometry{Arch::kGdn, 2, 1, 2, 32, 32};
  r.format = "damp:8";
  r.slots = slots;
  r.checkpoints = checkpoints;
  return r;
}

StateCacheServer::Options BaseOptions() {
  SetLoggingEnabled(false);
  StateCacheServer::Options so = LoopbackOptions(16 << 20, 16 << 20);
  return so;
}

TEST(LoopbackTest, Addresses) {
  for (const char* a :
       {"127.0.0.1:1", "127.1.2.3:0", "localhost:50051", "[::1]:7", "unix:/tmp/x.sock"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:1", "[::]:1", "10.0.0.1:5", "example.com:1", "127.evil.com:1",
                        "[::ffff:10.0.0.1]:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(TransportTest, PlaintextOnlyOnLoopbackUnlessOverridden) {
  StateCacheServer::Options so = BaseOptions();
  so.sockets.listen = "0.0.0.0:0";
  auto refused = StateCacheServer::Create(std::move(so));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              StartsWith("listen: refusing a plaintext listener on non-loopback address"));
  so = BaseOptions();
  so.sockets.listen = "0.0.0.0:0";
  so.security.allow_insecure_remote = true;
  EXPECT_TRUE(StateCacheServer::Create(std::move(so)).ok());
  so = BaseOptions();
  so.security.tls_cert_file = Cert("server.pem");  // key missing
  EXPECT_EQ(StateCacheServer::Create(std::move(so)).status().code(),
            absl::StatusCode::kInvalidArgument);
  so = BaseOptions();
  so.security.tls_client_ca_file = Cert("ca.pem");  // mTLS without TLS
  EXPECT_EQ(StateCacheServer::Create(std::move(so)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

std::unique_ptr<StateCacheClient> Client(int port, StateCacheClient::Options o) {
  o.timeout = absl::Seconds(5);
  // 127.0.0.1, not localhost: no DNS resolver (c-ares) involved; the test
  // certificate carries IP:127.0.0.1.
  auto c = StateCacheClient::Connect(absl::StrCat("127.0.0.1:", port), o);
  EXPECT_TRUE(c.ok());
  return std::move(*c);
}

TEST(TransportTest, TlsServesOnlyTlsClients) {
  StateCacheServer::Options so = BaseOptions();
  so.security.tls_cert_file = Cert("server.pem");
  so.security.tls_key_file = Cert("server.key");
  so.sockets.listen = "0.0.0.0:0";  // TLS may listen anywhere
  auto server = StateCacheServer::Create(std::move(so));
  ASSERT_TRUE(server.ok()) << server.status();
  StateCacheClient::Options tls;
  tls.credentials = StateCacheClient::TlsCredentials(Cert("ca.pem")).value();
  EXPECT_TRUE(Client((*server)->port(), tls)->RegisterModel(Tiny("m")).ok());
  EXPECT_EQ(Client((*server)->port(), {})->ListModels().status().code(),
            absl::StatusCode::kUnavailable);  // plaintext client
  StateCacheClient::Options wrong_ca;
  wrong_ca.credentials = StateCacheClient::TlsCredentials(Cert("rogue.pem")).value();
  EXPECT_EQ(Client((*server)->port(), wrong_ca)->ListModels().status().code(),
            absl::StatusCode::kUnavailable);  // server not trusted
}

TEST(TransportTest, MutualTlsRequiresAClientCertificateFromTheCa) {
  StateCacheServer::Options so = BaseOptions();
  so.security.tls_cert_file = Cert("server.pem");
  so.security.tls_key_file = Cert("server.key");
  so.security.tls_client_ca_file = Cert("ca.pem");
  auto server = StateCacheServer::Create(std::move(so));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  StateCacheClient::Options mtls;
  mtls.credentials =
      StateCacheClient::TlsCredentials(Cert("ca.pem"), Cert("client.pem"), Cert("client.key"))
          .value();
  auto ok = Client(port, mtls)->ListModels();
  EXPECT_TRUE(ok.ok()) << ok.status();
  StateCacheClient::Options no_cert;
  no_cert.credentials = StateCacheClient::TlsCredentials(Cert("ca.pem")).value();
  EXPECT_EQ(Client(port, no_cert)->ListModels().status().code(), absl::StatusCode::kUnavailable);
  StateCacheClient::Options rogue;
  rogue.credentials =
      StateCacheClient::TlsCredentials(Cert("ca.pem"), Cert("rogue.pem"), Cert("rogue.key"))
          .value();
  EXPECT_EQ(Client(port, rogue)->ListModels().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StateCacheClient::TlsCredentials(Cert("nope.pem")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A server with tenants a (quotas), b, c (no quotas) and r (rate-limited).
class TenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = TmpDir() + "/tenants";
    std::ofstream(path) << "# test tenants\n"
                        << "tenant a max_slots=3 max_checkpoint_bytes=" << 3 * SlotBytes()
                        << " max_models=2\n"
                        << "token a sha256:" << Sha256Hex("token-a") << "\n"
                        << "tenant b\ntoken b sha256:" << Sha256Hex("token-b") << "\n"
                        << "tenant c\ntoken c sha256:" << Sha256Hex("token-c") << "\n"
                        << "tenant r requests_per_second=1 burst=3\n"
                        << "token r sha256:" << Sha256Hex("token-r") << "\n";
    StateCacheServer::Options so = BaseOptions();
    so.security.tenants_file = path;
    so.limits.max_work_heads = 8;  // B x h_v: batches of up to 4 slots
    auto server = StateCacheServer::Create(std::move(so));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    a_ = As("token-a");
    b_ = As("token-b");
    c_ = As("token-c");
  }
  static int64_t SlotBytes() {
    return StateLayout::Identity(Tiny("x").geometry, ParseFormatSpec("damp:8").value())
        .value()
        .slot_bytes();
  }
  std::unique_ptr<StateCacheClient> As(const std::string& token) {
    StateCacheClient::Options o;
    o.bearer_token = token;
    return Client(server_->port(), o);
  }

  std::unique_ptr<StateCacheServer> server_;
  std::unique_ptr<StateCacheClient> a_, b_, c_;
};

TEST_F(TenantsTest, CallsWithoutAValidTokenAreUnauthenticated) {
  auto none = Client(server_->port(), {});
  auto s = none->ListModels();
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(s.status().message()), StartsWith("authorization: missing"));
  auto wrong = As("token-x");
  EXPECT_EQ(wrong->ListModels().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(wrong->RegisterModel(Tiny("m")).status().code(), absl::StatusCode::kUnauthenticated);
  auto stream = wrong->OpenUpdateStream();
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ((*stream)->Finish().code(), absl::StatusCode::kUnauthenticated);
  // The digest itself is not a credential.
  EXPECT_EQ(As(Sha256Hex("token-a"))->ListModels().status().code(),
            absl::StatusCode::kUnauthenticated);
  // Health stays open for load balancers.
  EXPECT_TRUE(none->CheckHealth().ok());
}

TEST_F(TenantsTest, AnotherTenantsModelsHandlesAndKeysLookUnknown) {
  ASSERT_TRUE(a_->RegisterModel(Tiny("shared-name")).ok());
  auto slots = a_->AllocateSlots("shared-name", 1);
  ASSERT_TRUE(slots.ok());
  const std::vector<int32_t> tokens = {7, 8, 9};
  ASSERT_TRUE(a_->Snapshot("shared-name", (*slots)[0], tokens).ok());

  // b and c (no models at all) get byte-identical answers for a's model.
  auto b_desc = b_->DescribeModel("shared-name");
  auto c_desc = c_->DescribeModel("shared-name");
  EXPECT_EQ(b_desc.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b_desc.status(), c_desc.status());
  auto b_alloc = b_->AllocateSlots("shared-name", 1);
  EXPECT_EQ(b_alloc.status(), c_->AllocateSlots("shared-name", 1).status());
  EXPECT_EQ(b_alloc.status().code(), absl::StatusCode::kNotFound);
  auto b_models = b_->ListModels();
  ASSERT_TRUE(b_models.ok());
  EXPECT_TRUE(b_models->empty());
  auto b_stats = b_->GetStats();
  ASSERT_TRUE(b_stats.ok());
  EXPECT_EQ(b_stats->models_size(), 0);
  EXPECT_EQ(b_stats->state_memory_reserved_bytes(), 0);
  EXPECT_EQ(b_->DropModel("shared-name", true).code(), absl::StatusCode::kNotFound);

  // b registers the same name in its own namespace.
  ASSERT_TRUE(b_->RegisterModel(Tiny("shared-name")).ok());
  // a's handle on b's model = a handle that never existed, same message shape.
  const SlotHandle stolen = (*slots)[0];
  const SlotHandle forged{stolen.id ^ 0x5a5a5a5a5a5a5a5aull, stolen.generation};
  auto via_stolen = b_->Export("shared-name", stolen);
  auto via_forged = b_->Export("shared-name", forged);
  EXPECT_EQ(via_stolen.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(via_forged.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(via_stolen.status().message()),
            absl::StrCat("slot[0]: unknown slot handle ", stolen.DebugString()));
  EXPECT_EQ(std::string(via_forged.status().message()),
            absl::StrCat("slot[0]: unknown slot handle ", forged.DebugString()));
  EXPECT_EQ(b_->ReleaseSlots("shared-name", {stolen}).code(), absl::StatusCode::kNotFound);
  // a's prefix key: b misses, and Restore says what it says for any unknown key.
  auto b_slot = b_->AllocateSlots("shared-name", 1);
  ASSERT_TRUE(b_slot.ok());
  auto lookup = b_->LookupPrefix("shared-name", tokens);
  ASSERT_TRUE(lookup.ok());
  EXPECT_FALSE(lookup->hit);
  const PrefixKey a_key = KeyOfTokens(tokens);
  const PrefixKey never = KeyOfTokens(std::vector<int32_t>{1, 2, 3});
  auto r1 = b_->Restore("shared-name", (*b_slot)[0], a_key);
  auto r2 = b_->Restore("shared-name", (*b_slot)[0], never);
  EXPECT_EQ(r1.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(r1.status().message()),
            absl::StrCat("key: no checkpoint for prefix ", a_key.DebugString()));
  EXPECT_EQ(std::string(r2.status().message()),
            absl::StrCat("key: no checkpoint for prefix ", never.DebugString()));
  // a's state is untouched and still its own.
  auto still = a_->LookupPrefix("shared-name", tokens);
  ASSERT_TRUE(still.ok());
  EXPECT_TRUE(still->hit);
  EXPECT_TRUE(a_->Export("shared-name", stolen).ok());
}

// Issue 31: every key kind is salted with the tenant; the same wire key of
// another tenant misses on lookup, peek, batch lookup and restore.
TEST_F(TenantsTest, SameWireKeyOfAnotherTenantNeverHits) {
  ASSERT_TRUE(a_->RegisterModel(Tiny("shared-name", 2, 3)).ok());  // one checkpoint per kind
  ASSERT_TRUE(b_->RegisterModel(Tiny("shared-name")).ok());
  auto a_slot = a_->AllocateSlots("shared-name", 1);
  auto b_slot = b_->AllocateSlots("shared-name", 1);
  ASSERT_TRUE(a_slot.ok() && b_slot.ok());
  const std::vector<int32_t> tokens = {7, 8, 9};
  PrefixKey engine;
  engine.kind = PrefixKeyKind::kEngine;
  engine.digest = "engine-block-7-8-9";
  engine.num_tokens = 3;
  const std::vector<PrefixKey> keys = {KeyOfTokens(tokens), Sha256KeyOfTokens(tokens), engine};
  for (const PrefixKey& key : keys) {
    ASSERT_TRUE(a_->SnapshotKey("shared-name", (*a_slot)[0], key).ok()) << key.DebugString();
    auto a_hit = a_->LookupPrefixKeys("shared-name", std::vector<PrefixKey>{key});
    ASSERT_TRUE(a_hit.ok());
    EXPECT_TRUE(a_hit->hit) << key.DebugString();
    ASSERT_TRUE(a_->ReleaseLease("shared-name", a_hit->lease_id).ok());

    auto b_lookup = b_->LookupPrefixKeys("shared-name", std::vector<PrefixKey>{key});
    ASSERT_TRUE(b_lookup.ok());
    EXPECT_FALSE(b_lookup->hit) << key.DebugString();
    LookupItem item;
    item.keys = {key};
    auto b_peek = b_->PeekPrefix("shared-name", item);
    ASSERT_TRUE(b_peek.ok());
    EXPECT_FALSE(b_peek->hit) << key.DebugString();
    auto b_batch = b_->BatchLookupPrefix("shared-name", std::vector<LookupItem>{item});
    ASSERT_TRUE(b_batch.ok() && b_batch->size() == 1 && (*b_batch)[0].ok());
    EXPECT_FALSE((*b_batch)[0]->hit) << key.DebugString();
    auto b_restore = b_->Restore("shared-name", (*b_slot)[0], key);
    EXPECT_EQ(b_restore.status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(std::string(b_restore.status().message()),
              absl::StrCat("key: no checkpoint for prefix ", key.DebugString()));
  }
  // a's lease ids are unknown to b.
  auto a_lease = a_->LookupPrefix("shared-name", tokens);
  ASSERT_TRUE(a_lease.ok() && a_lease->hit);
  EXPECT_EQ(b_->ReleaseLease("shared-name", a_lease->lease_id).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(a_->ReleaseLease("shared-name", a_lease->lease_id).ok());
}

TEST_F(TenantsTest, QuotasFailWithResourceExhaustedNamingTheQuota) {
  // max_checkpoint_bytes = 3 checkpoints: 4 explicit ones exceed it.
  auto too_many = a_->RegisterModel(Tiny("m1", 4, 4));
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(too_many.status().message()),
              StartsWith("quota max_checkpoint_bytes: tenant 'a' has"));
  // 0 = "what is left": capped to the quota (3), not the server budget.
  auto m1 = a_->RegisterModel(Tiny("m1", 4, 0));
  ASSERT_TRUE(m1.ok()) << m1.status();
  EXPECT_EQ(m1->stats().checkpoint_capacity(), 3);
  auto m2 = a_->RegisterModel(Tiny("m2", 4, 1));
  EXPECT_EQ(m2.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(m2.status().message()), StartsWith("quota max_checkpoint_bytes"));
  // Within the checkpoint quota the LRU evicts instead of failing.
  auto slot = a_->AllocateSlots("m1", 1);
  ASSERT_TRUE(slot.ok());
  for (int i = 1; i <= 6; ++i) {
    ASSERT_TRUE(a_->Snapshot("m1", (*slot)[0], std::vector<int32_t>(i, 4)).ok()) << i;
  }
  // max_slots = 3 over all of a's models.
  auto two = a_->AllocateSlots("m1", 2);
  ASSERT_TRUE(two.ok());
  auto over = a_->AllocateSlots("m1", 1);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.status().message(),
            "quota max_slots: tenant 'a' has 3 slots allocated; 1 more would exceed its quota "
            "of 3");
  ASSERT_TRUE(a_->ReleaseSlots("m1", *two).ok());
  EXPECT_TRUE(a_->AllocateSlots("m1", 2).ok());
  // max_models = 2.
  ASSERT_TRUE(a_->RegisterModel(Tiny("nock", 1, 0)).status().code() ==
              absl::StatusCode::kResourceExhausted);  // no checkpoint bytes left
  // b is unaffected by a's quotas.
  EXPECT_TRUE(b_->RegisterModel(Tiny("m1", 8, 8)).ok());
  EXPECT_TRUE(b_->AllocateSlots("m1", 8).ok());
}

TEST_F(TenantsTest, RequestRateQuota) {
  auto r = As("token-r");
  int exhausted = 0;
  absl::Status last;
  for (int i = 0; i < 6; ++i) {
    absl::Status s = r->ListModels().status();
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      ++exhausted;
      last = s;
    }
  }
  EXPECT_GE(exhausted, 2);  // burst 3, 1/s refill
  EXPECT_THAT(std::string(last.message()),
              StartsWith("quota requests_per_second: tenant 'r' exceeds 1 requests/s"));
  EXPECT_TRUE(b_->ListModels().ok());  // other tenants unaffected
}

TEST_F(TenantsTest, PerRequestWorkBoundAndUnguessableHandles) {
  ASSERT_TRUE(b_->RegisterModel(Tiny("w", 16, 1)).ok());
  auto slots = b_->AllocateSlots("w", 5);
  ASSERT_TRUE(slots.ok());
  // h_v = 2: 5 slots = 10 head updates > max_work_heads = 8.
  std::vector<float> q(5 * 32, 0.f), v(5 * 2 * 32, 0.f), g(5 * 2, 0.f), beta(5 * 2, 0.f);
  UpdateCall call;
  call.slots = *slots;
  call.q = HostTensor::Fp32(q);
  call.k = HostTensor::Fp32(q);
  call.v = HostTensor::Fp32(v);
  call.g = g;
  call.beta = beta;
  auto o = b_->Update("w", call);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(o.status().message()), StartsWith("slots: 10 head updates"));
  call.slots.resize(4);
  q.resize(4 * 32);
  v.resize(4 * 64);
  g.resize(8);
  beta.resize(8);
  call.q = HostTensor::Fp32(q);
  call.k = HostTensor::Fp32(q);
  call.v = HostTensor::Fp32(v);
  call.g = g;
  call.beta = beta;
  EXPECT_TRUE(b_->Update("w", call).ok());
  // Handles are random 64-bit ids, never indices: distinct, spread over the
  // whole range (all 5 below 2^40 has probability 2^-120).
  int high = 0;
  for (const SlotHandle& h : *slots) high += h.id >= (uint64_t{1} << 40);
  EXPECT_GE(high, 4);
  EXPECT_EQ((*slots)[0].generation, 1u);
}

}  // namespace
}  // namespace statecache
