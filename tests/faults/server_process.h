// Test helper: the real statecached binary as a child process. Its stderr
// goes to `log`; the listening port is read from its server_started line
// (0 when it did not start within 30 s).
//
//   ServerProcess server({"--backend=cpu", "--data_dir=" + dir}, tmp + "/a.log");
//   ASSERT_GT(server.port(), 0) << server.log();
#ifndef STATECACHE_TESTS_FAULTS_SERVER_PROCESS_H_
#define STATECACHE_TESTS_FAULTS_SERVER_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace statecache {

std::string ReadAll(const std::string& path);

class ServerProcess {
 public:
  // Runs server/statecached (a data dependency of the test) with
  // --listen=127.0.0.1:0 --metrics_port=-1 --log_cache_events=false and `flags`.
  ServerProcess(const std::vector<std::string>& flags, const std::string& log);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  std::string target() const;
  void Signal(int sig);
  // Exit status, or -1 when it did not exit normally in time.
  int Wait(absl::Duration timeout);
  std::string log() const { return ReadAll(log_); }

 private:
  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
  bool waited_ = false;
};

}  // namespace statecache

#endif  // STATECACHE_TESTS_FAULTS_SERVER_PROCESS_H_
