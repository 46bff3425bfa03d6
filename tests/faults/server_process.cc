#include "tests/faults/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

extern char** environ;

namespace statecache {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ServerProcess::ServerProcess(const std::vector<std::string>& flags, const std::string& log)
    : log_(log) {
  std::vector<std::string> args = {"server/statecached", "--listen=127.0.0.1:0",
                                   "--metrics_port=-1", "--log_cache_events=false"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  EXPECT_EQ(posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  // The port is in the server_started line.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline && port_ == 0) {
    const std::string text = ReadAll(log);
    const size_t at = text.find("server_started");
    if (at != std::string::npos) {
      const size_t p = text.find(" port=", at);
      const size_t end = text.find(' ', p + 6);
      int port = 0;
      if (p != std::string::npos && absl::SimpleAtoi(text.substr(p + 6, end - p - 6), &port)) {
        port_ = port;
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !waited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

std::string ServerProcess::target() const { return absl::StrCat("127.0.0.1:", port_); }

void ServerProcess::Signal(int sig) { kill(pid_, sig); }

int ServerProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      waited_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return -1;
}

}  // namespace statecache
