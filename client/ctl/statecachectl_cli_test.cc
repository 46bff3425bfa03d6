// The statecachectl binary end to end: help conventions, suggestions, flag
// aliases, environment defaults, exit codes, --json output (parsed back with
// kernels/io/json) and the operator commands against a statecached child.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/remote_store/child_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/io/json.h"
#include "server/pool/prefix_key.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int rc = -1;
  std::string out;
  std::string err;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

std::string Ctl() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir == nullptr ? "." : srcdir, "/statecache/client/ctl/statecachectl");
}

// Runs statecachectl with `args` and extra environment `env` ("K=V"), with
// STATECACHE_SERVER / STATECACHE_TOKEN_FILE unset unless given.
Result RunCtl(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  const std::string dir = ::testing::TempDir();
  std::string cmd = "env -u STATECACHE_SERVER -u STATECACHE_TOKEN_FILE";
  for (const std::string& e : env) absl::StrAppend(&cmd, " ", Quote(e));
  absl::StrAppend(&cmd, " ", Quote(Ctl()));
  for (const std::string& a : args) absl::StrAppend(&cmd, " ", Quote(a));
  absl::StrAppend(&cmd, " >", dir, "/ctl.out 2>", dir, "/ctl.err");
  const int status = std::system(cmd.c_str());
  Result r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadAll(dir + "/ctl.out");
  r.err = ReadAll(dir + "/ctl.err");
  return r;
}

std::string Show(const Result& r) {
  return absl::StrCat("rc=", r.rc, "\nstdout:\n", r.out, "\nstderr:\n", r.err);
}

JsonValue Json(const Result& r) {
  absl::StatusOr<JsonValue> v = ParseJson(r.out);
  EXPECT_TRUE(v.ok()) << v.status() << "\n" << Show(r);
  return v.ok() ? *v : JsonValue();
}

int64_t Int(const JsonValue* v) {
  EXPECT_NE(v, nullptr);
  return v == nullptr ? -1 : v->AsInt64().value_or(-1);
}

std::string Str(const JsonValue* v) {
  EXPECT_NE(v, nullptr);
  return v == nullptr ? "" : v->AsString().value_or("");
}

TEST(StatecachectlHelpTest, HelpIsConventional) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--help"}, {"-h"}, {"help"}}) {
    Result r = RunCtl(args);
    EXPECT_EQ(r.rc, 0) << Show(r);
    EXPECT_THAT(r.out, HasSubstr("Commands:"));
    EXPECT_THAT(r.out, HasSubstr("Exit codes:"));
    EXPECT_EQ(r.err, "");
  }
  for (const std::string& cmd : {"status", "models", "register", "slots", "lookup", "export"}) {
    Result r = RunCtl({cmd, "--help"});
    EXPECT_EQ(r.rc, 0) << Show(r);
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("Usage: statecachectl [GLOBAL FLAGS] ", cmd)));
    EXPECT_THAT(r.out, Not(HasSubstr("Commands:")));  // not the global help
    EXPECT_EQ(RunCtl({cmd, "-h"}).out, r.out);
    EXPECT_EQ(RunCtl({"help", cmd}).out, r.out);
  }
  Result calibrate = RunCtl({"help", "calibrate"});
  EXPECT_EQ(calibrate.rc, 0) << Show(calibrate);
  EXPECT_THAT(calibrate.out, HasSubstr("--model=ID"));
  EXPECT_THAT(calibrate.out, HasSubstr("--sample_every=8"));
  Result demo = RunCtl({"demo", "-h"});
  EXPECT_EQ(demo.rc, 0) << Show(demo);
  EXPECT_THAT(demo.out, HasSubstr("statecachectl demo"));
}

TEST(StatecachectlHelpTest, MistakesAreUsageErrorsWithSuggestions) {
  Result r = RunCtl({"stauts"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown command 'stauts' (did you mean 'status'?)"));
  r = RunCtl({"help", "modles"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("did you mean 'models'?"));
  r = RunCtl({"--servr=127.0.0.1:1", "status"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown flag --servr (did you mean '--server'?)"));
  r = RunCtl({"--server=127.0.0.1:1", "status", "--jsno"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("did you mean '--json'?"));
  r = RunCtl({"status", "--server=127.0.0.1:1"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("--server is a global flag: give it before the command name"));
  r = RunCtl({});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("missing command"));
}

TEST(StatecachectlAddressTest, MalformedIsNotUnreachable) {
  for (const std::string& bad :
       {"localhost:99999", "localhost", "a b:1", "::1:50051", ":50051", "unix:", "host:port"}) {
    Result r = RunCtl({"--server=" + bad, "--connect_timeout_ms=100", "status"});
    EXPECT_EQ(r.rc, 2) << bad << "\n" << Show(r);
    EXPECT_THAT(r.err, HasSubstr("--server: malformed address '" + bad + "'"));
  }
  Result r = RunCtl({"--server=127.0.0.1:1", "--connect_timeout_ms=200", "status"});
  EXPECT_EQ(r.rc, 3) << Show(r);
  EXPECT_THAT(r.err, HasSubstr("cannot reach statecached at 127.0.0.1:1"));
  EXPECT_THAT(r.err, Not(HasSubstr("malformed")));
  // The environment default is checked the same way.
  r = RunCtl({"--connect_timeout_ms=100", "status"}, {"STATECACHE_SERVER=nohost"});
  EXPECT_EQ(r.rc, 2) << Show(r);
  EXPECT_THAT(r.err, HasSubstr("malformed address 'nohost'"));
}

class StatecachectlServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ChildServer::Options o;
    o.binary = FindStatecached("").value();
    o.args = {"--backend=cpu", "--state_memory_bytes=16777216",
              "--checkpoint_memory_bytes=8388608"};
    auto s = ChildServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = s->release();
  }
  static void TearDownTestSuite() { delete server_; }

  Result Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), "--server=" + server_->address());
    return RunCtl(args);
  }

  static ChildServer* server_;
};
ChildServer* StatecachectlServerTest::server_ = nullptr;

constexpr char kGeometry[] = "arch=gdn,layers=1,h_qk=1,h_v=2,d_k=32,d_v=32";
constexpr char kSynthetic[] =
    "--synthetic=arch=gdn,layers=1,h_qk=1,h_v=2,d_k=32,d_v=32,docs=4,tokens=64,domains=2";

TEST_F(StatecachectlServerTest, EnvironmentAndDeprecatedFlagSpellings) {
  Result r = RunCtl({"status"}, {"STATECACHE_SERVER=" + server_->address()});
  EXPECT_EQ(r.rc, 0) << Show(r);
  EXPECT_THAT(r.out, HasSubstr("SERVING"));
  r = RunCtl({"--server", server_->address(), "--connect-timeout-ms=3000", "status"});
  EXPECT_EQ(r.rc, 0) << Show(r);
  EXPECT_THAT(r.err, HasSubstr("warning: --connect-timeout-ms is deprecated: use --connect_timeout_ms"));
}

TEST_F(StatecachectlServerTest, OperatorCommandsWithJson) {
  Result r = Ctl({"register", "tiny", std::string("--geometry=") + kGeometry, "--format=damp:8",
                  "--slots=4", "--checkpoints=2", "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  JsonValue reg = Json(r);
  ASSERT_EQ(reg.Find("models")->size(), 1u);
  EXPECT_EQ(Str(reg.Find("models")->array()[0].Find("model_id")), "tiny");
  EXPECT_EQ(Int(reg.Find("models")->array()[0].Find("stats")->Find("slot_capacity")), 4);

  r = Ctl({"status", "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  JsonValue status = Json(r);
  EXPECT_TRUE(status.Find("serving")->AsBool().value());
  EXPECT_EQ(Str(status.Find("stats")->Find("backend")), "cpu");
  EXPECT_EQ(Int(status.Find("stats")->Find("state_memory_budget_bytes")), 16777216);
  ASSERT_EQ(status.Find("stats")->Find("models")->size(), 1u);

  r = Ctl({"models", "--json", "tiny"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  const JsonValue models = Json(r);
  const JsonValue& tiny = models.Find("models")->array()[0];
  EXPECT_EQ(Str(tiny.Find("format")), "damp:8");
  EXPECT_EQ(Int(tiny.Find("geometry")->Find("d_k")), 32);
  EXPECT_EQ(Str(tiny.Find("geometry")->Find("arch")), "ARCH_GDN");
  EXPECT_TRUE(tiny.Find("identity_layout")->AsBool().value());

  r = Ctl({"slots", "allocate", "tiny", "--count=2", "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  JsonValue alloc = Json(r);
  ASSERT_EQ(alloc.Find("slots")->size(), 2u);
  const std::string h0 = Str(&alloc.Find("slots")->array()[0]);
  const std::string h1 = Str(&alloc.Find("slots")->array()[1]);

  r = Ctl({"snapshot", "tiny", h0, "--tokens=5,6,7", "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  EXPECT_EQ(Int(Json(r).Find("tokens")), 3);
  r = Ctl({"lookup", "tiny", "--tokens=5 6 7 8", "--lease_ms=10", "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  JsonValue hit = Json(r);
  EXPECT_TRUE(hit.Find("hit")->AsBool().value());
  EXPECT_EQ(Int(hit.Find("tokens")), 3);
  EXPECT_EQ(Int(hit.Find("candidate_tokens")), 4);
  r = Ctl({"lookup", "tiny", "--tokens=9,9", "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  EXPECT_FALSE(Json(r).Find("hit")->AsBool().value());
  // SHA-256 keys: a snapshot under the sha256 chain, found by it (peek: no
  // lease) and not by the FNV-1a chain of the same tokens.
  r = Ctl({"snapshot", "tiny", h1, "--tokens=5,6,7", "--key_kind=sha256", "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  EXPECT_EQ(Str(Json(r).Find("key")), Sha256KeyOfTokens({5, 6, 7}).DebugString());
  r = Ctl({"lookup", "tiny", "--tokens=5,6,7,8", "--key_kind=sha256", "--peek", "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  JsonValue peeked = Json(r);
  EXPECT_TRUE(peeked.Find("hit")->AsBool().value());
  EXPECT_EQ(Str(peeked.Find("key")), Sha256KeyOfTokens({5, 6, 7}).DebugString());
  EXPECT_EQ(peeked.Find("lease_id"), nullptr);
  r = Ctl({"lookup", "tiny", "--tokens=5,6", "--key_kind=md5"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("--key_kind: 'md5' is not fnv64 or sha256"));
  r = Ctl({"lookup", "tiny", "--tokens=5,6", "--peek", "--lease_ms=5"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("--peek takes no lease"));
  r = Ctl({"lookup", "tiny", "--tokens=5,x"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("--tokens: 'x' is not a token id"));

  const std::string file = ::testing::TempDir() + "/slot.scstate";
  r = Ctl({"export", "tiny", h0, "--out=" + file});
  ASSERT_EQ(r.rc, 0) << Show(r);
  EXPECT_EQ(ReadAll(file).rfind("statecache-slot v1\n", 0), 0u);
  r = Ctl({"import", "tiny", "--in=" + file, "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  JsonValue imported = Json(r);
  EXPECT_EQ(Str(imported.Find("tags")->Find("format")), "damp:8");
  EXPECT_NE(Str(imported.Find("slot")), h0);
  r = Ctl({"import", "tiny", h1, "--in=" + file});
  EXPECT_EQ(r.rc, 0) << Show(r);
  r = Ctl({"import", "tiny", "--in=" + file + ".none"});
  EXPECT_EQ(r.rc, 1);  // NOT_FOUND: no such file

  // Another format: the server refuses the state, the allocated slot is released.
  r = Ctl({"register", "other", std::string("--geometry=") + kGeometry, "--format=fp32",
           "--slots=2", "--checkpoints=1"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  r = Ctl({"import", "other", "--in=" + file});
  EXPECT_EQ(r.rc, 1) << Show(r);
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION"));
  r = Ctl({"slots", "list", "--json", "tiny", "other"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  JsonValue list = Json(r);
  EXPECT_EQ(Int(list.Find("models")->array()[0].Find("slots_allocated")), 3);
  EXPECT_EQ(Int(list.Find("models")->array()[0].Find("slots_free")), 1);
  EXPECT_EQ(Int(list.Find("models")->array()[1].Find("slots_allocated")), 0);

  r = Ctl({"slots", "release", "tiny", h0, h1});
  ASSERT_EQ(r.rc, 0) << Show(r);
  r = Ctl({"slots", "release", "tiny", h0});
  EXPECT_EQ(r.rc, 1) << Show(r);  // stale handle: FAILED_PRECONDITION
  r = Ctl({"slots", "release", "tiny", "nothex"});
  EXPECT_EQ(r.rc, 2);
  r = Ctl({"slots", "lst"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("did you mean 'list'?"));

  r = Ctl({"drop", "tiny"});
  EXPECT_EQ(r.rc, 1) << Show(r);  // a slot is still allocated
  r = Ctl({"drop", "tiny", "--force", "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  EXPECT_EQ(Str(Json(r).Find("dropped")), "tiny");
  r = Ctl({"drop", "other"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  r = Ctl({"models", "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  EXPECT_EQ(Json(r).Find("models")->size(), 0u);
  r = Ctl({"models", "nope"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
}

TEST_F(StatecachectlServerTest, RegisterLayoutFileAndCalibrateARunningModel) {
  const std::string dir = ::testing::TempDir();
  const std::string trajectories = dir + "/trajectories";
  ASSERT_EQ(std::system(("mkdir -p " + trajectories).c_str()), 0);
  // Local calibration (also writes the synthetic documents as trajectories).
  Result r = RunCtl({"calibrate", kSynthetic, "--format=damp:8", "--out=" + dir + "/local.layout",
                     "--save_synthetic=" + trajectories, "--no_stability", "--no_progress",
                     "--json=-"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  const std::string local_fingerprint = Str(Json(r).Find("fingerprint"));

  r = Ctl({"register", "cal", "--layout=" + dir + "/local.layout", "--slots=1", "--checkpoints=1",
           "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  const JsonValue cal = Json(r);
  EXPECT_FALSE(cal.Find("models")->array()[0].Find("identity_layout")->AsBool().value());
  EXPECT_EQ(Str(cal.Find("models")->array()[0].Find("tags")->Find("layout_fingerprint")),
            local_fingerprint);

  // The running model "serving" (identity layout) calibrated by the server.
  r = Ctl({"register", "serving", std::string("--geometry=") + kGeometry, "--format=damp:8",
           "--slots=1", "--checkpoints=1"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  r = Ctl({"calibrate", "--model=serving", "--trajectories=" + trajectories,
           "--out=" + dir + "/remote.layout", "--register_as=serving-cal", "--slots=1",
           "--checkpoints=1", "--json"});
  ASSERT_EQ(r.rc, 0) << Show(r);
  const JsonValue remote = Json(r);
  const JsonValue* resp = remote.Find("response");
  ASSERT_NE(resp, nullptr);
  EXPECT_EQ(Str(resp->Find("layout_fingerprint")), local_fingerprint);
  EXPECT_EQ(Int(resp->Find("tokens")), 4 * 64);
  EXPECT_EQ(resp->Find("domains")->size(), 2u);
  EXPECT_EQ(Str(resp->Find("model")->Find("model_id")), "serving-cal");
  EXPECT_EQ(ReadAll(dir + "/remote.layout").empty(), false);
  r = Ctl({"calibrate", "--model=nope", "--trajectories=" + trajectories});
  EXPECT_EQ(r.rc, 1) << Show(r);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  for (const std::string& id : {"cal", "serving", "serving-cal"}) {
    EXPECT_EQ(Ctl({"drop", id}).rc, 0);
  }
}

}  // namespace
}  // namespace statecache
