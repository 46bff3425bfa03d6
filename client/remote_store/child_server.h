// ChildServer: a statecached started as a child process on a private
// unix-domain socket, for the demo, benchmarks and tests of the worker side.
//
// A child process, not StateCacheServer in process, because that is what a
// real deployment looks like: the worker and the server share no memory.
//
//   ASSIGN_OR_RETURN(std::string bin, FindStatecached(""));
//   ChildServer::Options o;
//   o.binary = bin;
//   o.args = {"--backend=cpu", "--state_memory_bytes=67108864"};
//   ASSIGN_OR_RETURN(auto server, ChildServer::Start(o));
//   ASSIGN_OR_RETURN(auto client, StateCacheClient::Connect(server->address()));
//   // ~ChildServer: SIGTERM (graceful drain), waits, removes the socket dir.
//
// Not thread-safe; one object per child.
#ifndef STATECACHE_CLIENT_REMOTE_STORE_CHILD_SERVER_H_
#define STATECACHE_CLIENT_REMOTE_STORE_CHILD_SERVER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace statecache {

// Path of the statecached binary: `flag_value` when non-empty (kNotFound if
// it is not an executable file); else $STATECACHED; else the Bazel runfiles
// of the running binary or test (<runfiles>/statecache/server/statecached,
// declared as `data`); else beside the running binary in bazel-bin
// (<exe dir>/../../server/statecached). kNotFound listing the places tried.
absl::StatusOr<std::string> FindStatecached(const std::string& flag_value);

class ChildServer {
 public:
  struct Options {
    std::string binary;             // statecached
    std::vector<std::string> args;  // extra flags (--listen and --metrics_port are set here)
    // Where the child's stdout/stderr go ("" = a log file in the socket dir,
    // removed with it; "-" = inherit).
    std::string log_path;
    absl::Duration ready_timeout = absl::Seconds(30);
  };

  // Forks and execs the binary listening on unix:<tmpdir>/statecached.sock
  // with --metrics_port=-1, and waits until it answers a health check
  // (kUnavailable with the log's tail when it exits or times out first).
  static absl::StatusOr<std::unique_ptr<ChildServer>> Start(const Options& options);
  ~ChildServer();

  // "unix:/tmp/.../statecached.sock".
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // SIGTERM, wait for the exit (SIGKILL after `grace`, or 200 ms after the
  // child logged server_stopped, i.e. finished draining). Idempotent.
  void Stop(absl::Duration grace = absl::Seconds(10));
  // The child's log so far (empty when it is inherited).
  std::string Log() const;

 private:
  ChildServer() = default;

  pid_t pid_ = -1;
  std::string dir_;
  std::string address_;
  std::string log_path_;
  bool own_log_ = false;
};

// A CPU-backend child (FindStatecached("")) with the given state and
// checkpoint budgets: the small servers of the worker-side tests.
absl::StatusOr<std::unique_ptr<ChildServer>> StartCpuChild(int64_t state_memory_bytes,
                                                           int64_t checkpoint_memory_bytes);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_REMOTE_STORE_CHILD_SERVER_H_
