// statecachectl: command-line tool for statecached.
//
//   statecachectl --server=127.0.0.1:50051 status
//   statecachectl models [MODEL_ID...]
//   statecachectl demo [--conversations=4 ...]    (own flags: demo --help)
//   statecachectl calibrate --help
//
// Subcommands live in ctl_*.cc (see ctl_command.h for how to add one).
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cpp/ctl_command.h"
#include "kernels/common/status_macros.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051",
          "statecached address: host:port or unix:/path/to.sock.");
ABSL_FLAG(int64_t, connect_timeout_ms, 5000, "How long to wait for the server to be reachable.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token sent with every call (servers started with "
          "--tenants_file require one). Empty: no token.");
ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM root CA that verifies the server; setting it (or --tls_cert_file) switches "
          "the channel to TLS. Empty with TLS: the system roots.");
ABSL_FLAG(std::string, tls_cert_file, "", "PEM client certificate for mutual TLS.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");

namespace statecache {
namespace {

// Client options from --token_file and the --tls_* flags.
absl::StatusOr<StateCacheClient::Options> ClientOptionsFromFlags() {
  StateCacheClient::Options options;
  const std::string token_file = absl::GetFlag(FLAGS_token_file);
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in) return absl::InvalidArgumentError(absl::StrCat("token_file: cannot read ", token_file));
    std::getline(in, options.bearer_token);
    if (options.bearer_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("token_file: ", token_file, " is empty"));
    }
  }
  const std::string ca = absl::GetFlag(FLAGS_tls_ca_file);
  const std::string cert = absl::GetFlag(FLAGS_tls_cert_file);
  const std::string key = absl::GetFlag(FLAGS_tls_key_file);
  if (!ca.empty() || !cert.empty() || !key.empty()) {
    ASSIGN_OR_RETURN(options.credentials, StateCacheClient::TlsCredentials(ca, cert, key));
  }
  return options;
}

std::vector<Command> AllCommands() {
  return {StatusCommand(), ModelsCommand(), DemoCommand(), ServeBenchCommand(),
          CalibrateCommand(), EvaluateCommand()};
}

std::string CommandList() {
  std::string s = "Commands:\n";
  for (const Command& c : AllCommands()) {
    absl::StrAppend(&s, absl::StrFormat("  %-10s %s\n             usage: statecachectl [flags] %s\n",
                                        c.name, c.summary, c.usage));
  }
  return s;
}

int Main(const std::vector<char*>& positional) {
  // positional[0] is the program name.
  if (positional.size() < 2) {
    std::fprintf(stderr, "statecachectl: missing command\n%s", CommandList().c_str());
    return 2;
  }
  const std::string name = positional[1];
  std::vector<std::string> args(positional.begin() + 2, positional.end());
  for (const Command& c : AllCommands()) {
    if (c.name != name) continue;
    absl::StatusOr<StateCacheClient::Options> options = ClientOptionsFromFlags();
    if (!options.ok()) {
      std::fprintf(stderr, "statecachectl: %s\n", options.status().ToString().c_str());
      return 2;
    }
    CtlContext ctx(absl::GetFlag(FLAGS_server),
                   absl::Milliseconds(absl::GetFlag(FLAGS_connect_timeout_ms)), stdout,
                   *std::move(options));
    absl::Status status = c.run(ctx, args);
    if (!status.ok()) {
      std::fprintf(stderr, "statecachectl %s: %s\n", name.c_str(), status.ToString().c_str());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "statecachectl: unknown command '%s'\n%s", name.c_str(),
               CommandList().c_str());
  return 2;
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(absl::StrCat(
      "statecachectl: talk to a statecached server.\n"
      "Usage: statecachectl [--server=host:port] COMMAND [ARGS...]\n",
      statecache::CommandList()));
  // Commands with their own flags (demo, calibrate, ...): statecachectl's
  // flags are the ones before the command name, the rest is the command's.
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    for (const statecache::Command& c : statecache::AllCommands()) {
      if (!c.own_flags || c.name != argv[i]) continue;
      bool server_given = false;
      for (int j = 1; j < i; ++j) {
        server_given |= std::string(argv[j]).rfind("--server", 0) == 0;
      }
      absl::ParseCommandLine(i, argv);
      if (c.main) return c.main(argc - i, argv + i);
      // The command's default server is its own choice unless --server was given.
      absl::StatusOr<statecache::StateCacheClient::Options> options =
          statecache::ClientOptionsFromFlags();
      if (!options.ok()) {
        std::fprintf(stderr, "statecachectl: %s\n", options.status().ToString().c_str());
        return 2;
      }
      statecache::CtlContext ctx(server_given ? absl::GetFlag(FLAGS_server) : "",
                                 absl::Milliseconds(absl::GetFlag(FLAGS_connect_timeout_ms)),
                                 stdout, *std::move(options));
      absl::Status status = c.run(ctx, std::vector<std::string>(argv + i + 1, argv + argc));
      if (!status.ok()) {
        std::fprintf(stderr, "statecachectl %s: %s\n", c.name.c_str(), status.ToString().c_str());
        return 1;
      }
      return 0;
    }
    break;  // the first positional argument is the command
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  return statecache::Main(positional);
}
