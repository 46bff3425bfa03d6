#include "client/remote_store/child_server.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/cpp/statecache_client.h"

namespace statecache {
namespace {

bool IsExecutable(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

std::string Dirname(const std::string& p) {
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

}  // namespace

absl::StatusOr<std::string> FindStatecached(const std::string& flag_value) {
  if (!flag_value.empty()) {
    if (IsExecutable(flag_value)) return flag_value;
    return absl::NotFoundError(absl::StrCat("statecached: '", flag_value,
                                            "' is not an executable file"));
  }
  std::vector<std::string> tried;
  auto candidate = [&](const std::string& p) {
    tried.push_back(p);
    return IsExecutable(p);
  };
  if (const char* env = std::getenv("STATECACHED"); env != nullptr && *env != '\0') {
    if (candidate(env)) return std::string(env);
  }
  constexpr char kRel[] = "statecache/server/statecached";
  if (const char* srcdir = std::getenv("TEST_SRCDIR"); srcdir != nullptr) {
    const std::string p = absl::StrCat(srcdir, "/", kRel);
    if (candidate(p)) return p;
  }
  if (const char* rdir = std::getenv("RUNFILES_DIR"); rdir != nullptr) {
    const std::string p = absl::StrCat(rdir, "/", kRel);
    if (candidate(p)) return p;
  }
  const std::string exe = SelfExe();
  if (!exe.empty()) {
    const std::string runfiles = absl::StrCat(exe, ".runfiles/", kRel);
    if (candidate(runfiles)) return runfiles;
    const std::string sibling = absl::StrCat(Dirname(exe), "/statecached");
    if (candidate(sibling)) return sibling;
    const std::string bazel_bin = absl::StrCat(Dirname(exe), "/../../server/statecached");
    if (candidate(bazel_bin)) return bazel_bin;
  }
  return absl::NotFoundError(absl::StrCat(
      "statecached binary not found (build it: bazel build //server:statecached; or pass "
      "--statecached=PATH / set $STATECACHED); tried: ",
      absl::StrJoin(tried, ", ")));
}

absl::StatusOr<std::unique_ptr<ChildServer>> ChildServer::Start(const Options& options) {
  if (!IsExecutable(options.binary)) {
    return absl::InvalidArgumentError(
        absl::StrCat("binary: '", options.binary, "' is not an executable file"));
  }
  std::unique_ptr<ChildServer> s(new ChildServer());
  std::string tmpl = "/tmp/statecached-XXXXXX";
  if (::mkdtemp(&tmpl[0]) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  s->dir_ = tmpl;
  const std::string socket = absl::StrCat(s->dir_, "/statecached.sock");
  s->address_ = absl::StrCat("unix:", socket);
  if (options.log_path.empty()) {
    s->log_path_ = absl::StrCat(s->dir_, "/statecached.log");
    s->own_log_ = true;
  } else if (options.log_path != "-") {
    s->log_path_ = options.log_path;
  }

  std::vector<std::string> argv_s = {options.binary, absl::StrCat("--listen=", s->address_),
                                     "--metrics_port=-1"};
  argv_s.insert(argv_s.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(&a[0]);
  argv.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    if (!s->log_path_.empty()) {
      const int fd = ::open(s->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
    }
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  s->pid_ = pid;

  // Poll with a fresh channel each time: a channel that failed to connect
  // backs off for seconds before it retries.
  const absl::Time deadline = absl::Now() + options.ready_timeout;
  while (true) {
    int wstatus = 0;
    if (::waitpid(s->pid_, &wstatus, WNOHANG) == s->pid_) {
      s->pid_ = -1;
      return absl::UnavailableError(absl::StrCat("statecached exited during start-up (status ",
                                                 wstatus, "); log:\n", s->Log()));
    }
    struct stat st;
    if (::stat(socket.c_str(), &st) == 0) {
      StateCacheClient::Options copts;
      copts.timeout = absl::Seconds(2);
      absl::StatusOr<std::unique_ptr<StateCacheClient>> client =
          StateCacheClient::Connect(s->address_, copts);
      if (!client.ok()) return client.status();
      absl::StatusOr<bool> healthy = (*client)->CheckHealth();
      if (healthy.ok() && *healthy) break;
    }
    if (absl::Now() > deadline) {
      return absl::UnavailableError(absl::StrCat("statecached did not become healthy within ",
                                                 absl::FormatDuration(options.ready_timeout),
                                                 "; log:\n", s->Log()));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return s;
}

void ChildServer::Stop(absl::Duration grace) {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  absl::Time stopped_seen = absl::InfiniteFuture();
  while (true) {
    int wstatus = 0;
    const pid_t r = ::waitpid(pid_, &wstatus, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) break;
    // statecached logs server_stopped once every call has drained; its exit
    // can then still wait ~10 s inside grpc_shutdown (an executor thread in
    // a timed epoll_wait), which is of no use to anyone: kill it.
    if (stopped_seen == absl::InfiniteFuture() &&
        Log().find("server_stopped") != std::string::npos) {
      stopped_seen = absl::Now();
    }
    if (absl::Now() > deadline || absl::Now() > stopped_seen + absl::Milliseconds(200)) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &wstatus, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  pid_ = -1;
}

std::string ChildServer::Log() const {
  if (log_path_.empty()) return "";
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ChildServer::~ChildServer() {
  Stop();
  if (!dir_.empty()) {
    ::unlink(absl::StrCat(dir_, "/statecached.sock").c_str());
    if (own_log_) ::unlink(log_path_.c_str());
    ::rmdir(dir_.c_str());
  }
}

absl::StatusOr<std::unique_ptr<ChildServer>> StartCpuChild(int64_t state_memory_bytes,
                                                           int64_t checkpoint_memory_bytes) {
  absl::StatusOr<std::string> binary = FindStatecached("");
  if (!binary.ok()) return binary.status();
  ChildServer::Options options;
  options.binary = *binary;
  options.args = {"--backend=cpu", absl::StrCat("--state_memory_bytes=", state_memory_bytes),
                  absl::StrCat("--checkpoint_memory_bytes=", checkpoint_memory_bytes)};
  return ChildServer::Start(options);
}

}  // namespace statecache
