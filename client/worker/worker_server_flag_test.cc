// `worker eval --server=ADDR` (issue 4): the worker CLI driving a live
// statecached child through RemoteStateStore gives bits/byte bit-identical to
// the same eval in process (BackendStateStore on the CPU backend, same
// format and layout), and `worker generate --server` prints the same text.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/remote_store/child_server.h"
#include "gtest/gtest.h"
#include "kernels/io/test_data.h"

namespace statecache {
namespace {

std::string WorkerBinary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir ? srcdir : ".", "/statecache/client/worker/worker");
}

// Runs `command`, returns its stdout; *rc gets the exit status.
std::string RunCommand(const std::string& command, int* rc) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) {
    *rc = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// The value after "bits/byte exact " ("" when missing).
std::string ExactBitsPerByte(const std::string& out) {
  const std::string tag = "bits/byte exact ";
  const size_t at = out.find(tag);
  if (at == std::string::npos) return "";
  const size_t end = out.find('\n', at);
  return out.substr(at + tag.size(), end - at - tag.size());
}

class WorkerServerFlagTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = SharedDataPath("models/gdn-tiny");
    ASSERT_TRUE(model.ok()) << model.status();
    model_dir_ = *model;
    const char* tmp = std::getenv("TEST_TMPDIR");
    corpus_ = absl::StrCat(tmp ? tmp : "/tmp", "/worker_server_flag_corpus.jsonl");
    std::ofstream f(corpus_);
    f << "{\"domain\": \"code\", \"text\": \"def add(a, b):\\n    return a + b\\n\"}\n"
      << "{\"domain\": \"prose\", \"text\": \"The cache keeps every state small.\"}\n";
    f.close();
    ASSERT_TRUE(f.good());
    auto server = StartCpuChild(8388608, 4194304);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  std::string Worker(const std::string& args, int* rc) {
    return RunCommand(absl::StrCat(WorkerBinary(), " ", args, " --model=", model_dir_,
                            " --threads=2 --layouts=identity"),
               rc);
  }

  std::string model_dir_;
  std::string corpus_;
  std::unique_ptr<ChildServer> server_;
};

TEST_F(WorkerServerFlagTest, EvalThroughServerBitIdenticalToInProcess) {
  for (const std::string format : {"damp:16", "int4-hadamard"}) {
    int rc = 0;
    const std::string eval = absl::StrCat("eval --corpus=", corpus_, " --format=", format);
    const std::string local = Worker(eval + " --backend=cpu", &rc);
    ASSERT_EQ(rc, 0) << local;
    const std::string remote = Worker(eval + " --server=" + server_->address(), &rc);
    ASSERT_EQ(rc, 0) << remote;
    EXPECT_NE(remote.find("statecached"), std::string::npos) << remote;
    EXPECT_EQ(local.find("statecached"), std::string::npos) << local;
    const std::string a = ExactBitsPerByte(local);
    ASSERT_FALSE(a.empty()) << local;
    const double bpb = std::stod(a);
    EXPECT_GT(bpb, 0.5) << format;
    EXPECT_LT(bpb, 8.0) << format;
    EXPECT_EQ(ExactBitsPerByte(remote), a) << format << "\n" << local << "\n" << remote;
  }
}

TEST_F(WorkerServerFlagTest, GenerateThroughServerPrintsTheSameText) {
  int rc = 0;
  const std::string gen = "generate --prompt='def ' --max_new=24 --format=damp:16 2>/dev/null";
  const std::string local = Worker(gen + " --backend=cpu", &rc);
  ASSERT_EQ(rc, 0);
  const std::string remote = Worker(gen + " --server=" + server_->address(), &rc);
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(local.size(), 4u + 24u + 1u) << local;  // prompt, new bytes, "\n"
  EXPECT_EQ(local.substr(0, 4), "def ");
  EXPECT_EQ(remote, local);
}

TEST_F(WorkerServerFlagTest, UnreachableServerFails) {
  int rc = 0;
  const std::string out = Worker(absl::StrCat("eval --corpus=", corpus_,
                                              " --format=int8 --server=unix:/nonexistent/sock "
                                              "2>&1"),
                                 &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("--server=unix:/nonexistent/sock"), std::string::npos) << out;
}

}  // namespace
}  // namespace statecache
