// Subcommands of statecachectl.
//
// A subcommand is a name, a one-line summary, usage text and a function over
// a CtlContext (the shared flags and a lazily connected client) plus its
// positional arguments. To add one (demo, calibrate, evaluate, ...): write a
// `Command FooCommand()` in its own ctl_foo.cc, declare it here, and add it
// to AllCommands() in statecachectl_main.cc.
//
//   Command StatusCommand();  // "statecachectl status"
#ifndef STATECACHE_CLIENT_CPP_CTL_COMMAND_H_
#define STATECACHE_CLIENT_CPP_CTL_COMMAND_H_

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/statecache_client.h"

namespace statecache {

// What every subcommand can use.
class CtlContext {
 public:
  CtlContext(std::string server, absl::Duration connect_timeout, std::FILE* out,
             StateCacheClient::Options client_options = {})
      : server_(std::move(server)),
        connect_timeout_(connect_timeout),
        out_(out),
        client_options_(std::move(client_options)) {}

  const std::string& server() const { return server_; }
  std::FILE* out() const { return out_; }

  // Connects on first use (waiting up to the connect timeout).
  absl::StatusOr<StateCacheClient*> client();

 private:
  std::string server_;
  absl::Duration connect_timeout_;
  std::FILE* out_;
  StateCacheClient::Options client_options_;  // bearer token, TLS credentials
  std::unique_ptr<StateCacheClient> client_;
};

struct Command {
  std::string name;
  std::string summary;  // one line, for the command list
  std::string usage;    // arguments and what they do
  std::function<absl::Status(CtlContext& ctx, const std::vector<std::string>& args)> run;
  // When true the command parses its own flags: everything after its name
  // reaches it verbatim (flags included), and only the flags before the name
  // are statecachectl's (--server, ...).
  bool own_flags = false;
  // Optional, with own_flags: a process-style entry (argv[0] = the command
  // name) that reports its own errors and returns the exit code; used
  // instead of `run` (calibrate, evaluate).
  std::function<int(int argc, char** argv)> main;
};

// Server health, backend, memory budgets and per-model use.
Command StatusCommand();
// Registered models: format, geometry, sizes, slots and checkpoints.
Command ModelsCommand();

// The shipped GDN model served with DAMP states vs FP32 (ctl_demo.cc).
Command DemoCommand();
// fp32 / bf16 / damp under one checkpoint-memory budget (ctl_serve_bench.cc).
Command ServeBenchCommand();
// DAMP / DAMP-SR calibration and evaluation (client/ctl_calibration).
Command CalibrateCommand();
Command EvaluateCommand();

// "12.3 MiB".
std::string HumanBytes(double bytes);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CPP_CTL_COMMAND_H_
