// statecachectl: command-line tool for statecached.
//
//   statecachectl [GLOBAL FLAGS] COMMAND [COMMAND FLAGS] [ARGS...]
//   statecachectl --server=127.0.0.1:50051 status --json
//   statecachectl help models          (= statecachectl models --help)
//
// Global flags come before the command name; STATECACHE_SERVER and
// STATECACHE_TOKEN_FILE are the defaults of --server and --token_file (read
// here, once). Exit codes: ExitCode() in ctl_command.h. Subcommands live in
// ctl_*.cc (see ctl_command.h for how to add one).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/ctl/ctl_command.h"
#include "client/ctl_calibration/cli_flags.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

constexpr char kDefaultServer[] = "127.0.0.1:50051";

// The process environment statecachectl reads (main() fills it once).
struct Environment {
  std::string server;      // STATECACHE_SERVER
  std::string token_file;  // STATECACHE_TOKEN_FILE
};

std::vector<Command> AllCommands() {
  return {StatusCommand(),   ModelsCommand(),    RegisterCommand(),   DropCommand(),
          SlotsCommand(),    LookupCommand(),    SnapshotCommand(),   ExportCommand(),
          ImportCommand(),   UnpackCommand(),    CalibrateCommand(),  EvaluateCommand(),
          DemoCommand(),     ServeBenchCommand()};
}

std::vector<std::string> CommandNames() {
  std::vector<std::string> names = {"help"};
  for (const Command& c : AllCommands()) names.push_back(c.name);
  return names;
}

std::string GlobalHelp() {
  std::string s =
      "statecachectl: talk to a statecached server.\n"
      "\n"
      "Usage: statecachectl [GLOBAL FLAGS] COMMAND [FLAGS] [ARGS...]\n"
      "       statecachectl help [COMMAND]      (or COMMAND --help, COMMAND -h)\n"
      "\n"
      "Commands:\n";
  for (const Command& c : AllCommands()) {
    absl::StrAppend(&s, absl::StrFormat("  %-12s %s\n", c.name, c.summary));
  }
  absl::StrAppend(
      &s,
      "\nGlobal flags (before COMMAND):\n"
      "  --server=ADDR            statecached address: host:port, [ipv6]:port, unix:/path or\n"
      "                           dns:///host:port (default: $STATECACHE_SERVER, else ",
      kDefaultServer,
      ")\n"
      "  --connect_timeout_ms=N   how long to wait for the server to be reachable (5000)\n"
      "  --token_file=FILE        bearer token sent with every call (default:\n"
      "                           $STATECACHE_TOKEN_FILE, else none)\n"
      "  --tls_ca_file=FILE       PEM root CA verifying the server; setting it or\n"
      "                           --tls_cert_file switches to TLS (empty: system roots)\n"
      "  --tls_cert_file=FILE     PEM client certificate (mutual TLS)\n"
      "  --tls_key_file=FILE      PEM private key of --tls_cert_file\n"
      "  -h, --help               this help\n"
      "Flags are snake_case; the kebab-case spelling (--token-file) is a deprecated alias.\n"
      "\n"
      "Exit codes: 0 ok; 1 the server refused or failed the call; 2 usage error (unknown\n"
      "command or flag, malformed argument or --server address, INVALID_ARGUMENT);\n"
      "3 server unreachable (UNAVAILABLE, DEADLINE_EXCEEDED).\n");
  return s;
}

std::string CommandHelp(const Command& c) {
  return absl::StrCat(c.summary, "\n\nUsage: statecachectl [GLOBAL FLAGS] ", c.usage, "\n",
                      c.help.empty() ? "" : absl::StrCat("\n", c.help),
                      "  -h, --help   this help\n");
}

const Command* FindCommand(const std::vector<Command>& commands, const std::string& name) {
  for (const Command& c : commands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "statecachectl: %s\nRun 'statecachectl --help' for usage.\n",
               message.c_str());
  return 2;
}

bool AsksForHelp(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--") break;
    if (a == "--help" || a == "-h" || a == "--help=true" || a == "-help") return true;
  }
  return false;
}

absl::StatusOr<StateCacheClient::Options> ClientOptions(const CliFlags& flags,
                                                        const Environment& env) {
  StateCacheClient::Options options;
  const std::string token_file = flags.Get("token_file", env.token_file);
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file: cannot read ", token_file));
    }
    std::getline(in, options.bearer_token);
    if (options.bearer_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file: ", token_file, " is empty"));
    }
  }
  const std::string ca = flags.Get("tls_ca_file", "");
  const std::string cert = flags.Get("tls_cert_file", "");
  const std::string key = flags.Get("tls_key_file", "");
  if (!ca.empty() || !cert.empty() || !key.empty()) {
    ASSIGN_OR_RETURN(options.credentials, StateCacheClient::TlsCredentials(ca, cert, key));
  }
  return options;
}

int Main(const std::vector<std::string>& args, const Environment& env) {
  CliFlags::Spec spec;
  spec.value_flags = {GlobalFlagNames().begin(), GlobalFlagNames().end()};
  spec.bool_flags = {"help"};
  spec.stop_at_positional = true;
  absl::StatusOr<CliFlags> flags = CliFlags::Parse(args, spec);
  if (!flags.ok()) return UsageError(std::string(flags.status().message()));
  for (const std::string& w : flags->warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (flags->Has("help")) {
    std::fputs(GlobalHelp().c_str(), stdout);
    return 0;
  }
  if (flags->rest().empty()) return UsageError("missing command");
  const std::vector<Command> commands = AllCommands();
  std::string name = flags->rest()[0];
  std::vector<std::string> command_args(flags->rest().begin() + 1, flags->rest().end());
  if (name == "help") {
    if (command_args.empty()) {
      std::fputs(GlobalHelp().c_str(), stdout);
      return 0;
    }
    name = command_args[0];
    command_args = {"--help"};
  }
  const Command* c = FindCommand(commands, name);
  if (c == nullptr) {
    return UsageError(
        absl::StrCat("unknown command '", name, "'", DidYouMean(name, CommandNames())));
  }
  if (!c->own_flags && AsksForHelp(command_args)) {
    std::fputs(CommandHelp(*c).c_str(), stdout);
    return 0;
  }
  int timeout_ms = 0;
  absl::StatusOr<int> timeout = flags->GetInt("connect_timeout_ms", 5000);
  if (!timeout.ok()) return UsageError(std::string(timeout.status().message()));
  timeout_ms = *timeout;
  absl::StatusOr<StateCacheClient::Options> options = ClientOptions(*flags, env);
  if (!options.ok()) return UsageError(std::string(options.status().message()));
  // demo / serve-bench start their own statecached unless a server is named.
  const bool server_given = flags->Has("server") || !env.server.empty();
  const std::string server =
      flags->Get("server", env.server.empty() ? std::string(kDefaultServer) : env.server);
  CtlContext ctx(c->own_flags && !server_given ? "" : server, absl::Milliseconds(timeout_ms),
                 stdout, *std::move(options));
  if (c->main) return c->main(ctx, command_args);
  const absl::Status status = c->run(ctx, command_args);
  if (!status.ok()) {
    std::fprintf(stderr, "statecachectl %s: %s\n", c->name.c_str(), status.ToString().c_str());
  }
  return ExitCode(status);
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  statecache::Environment env;
  if (const char* s = std::getenv("STATECACHE_SERVER")) env.server = s;
  if (const char* t = std::getenv("STATECACHE_TOKEN_FILE")) env.token_file = t;
  return statecache::Main(std::vector<std::string>(argv + 1, argv + argc), env);
}
