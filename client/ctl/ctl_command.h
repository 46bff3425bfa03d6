// Subcommands of statecachectl.
//
// A subcommand is a name, a one-line summary, usage and help text and a
// function over a CtlContext (the global flags and a lazily connected
// client) plus everything after its name on the command line (it parses its
// own flags, see ParseCommandFlags). To add one: write a
// `Command FooCommand()` in its own ctl_foo.cc, declare it here, and add it
// to AllCommands() in statecachectl_main.cc.
//
// Exit codes of statecachectl (ExitCode below; README "statecachectl"):
//   0 success; 1 the server refused or failed the call; 2 usage: unknown
//   command or flag, a malformed argument or --server address (also when the
//   server answers INVALID_ARGUMENT); 3 the server cannot be reached
//   (UNAVAILABLE, DEADLINE_EXCEEDED).
//
//   Command StatusCommand();  // "statecachectl status"
#ifndef STATECACHE_CLIENT_CTL_CTL_COMMAND_H_
#define STATECACHE_CLIENT_CTL_CTL_COMMAND_H_

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cpp/statecache_client.h"
#include "client/ctl_calibration/cli_flags.h"

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
  // kInvalidArgument "--server: malformed address ..." for an address that
  // cannot name a server (ValidateServerAddress); kUnavailable "cannot reach
  // statecached at ..." when a well-formed address does not answer.
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
  std::string usage;    // synopsis: "models [--json] [MODEL_ID...]"
  std::function<absl::Status(CtlContext& ctx, const std::vector<std::string>& args)> run;
  // When true the command prints its own help for --help / -h (demo,
  // serve-bench, calibrate, evaluate); otherwise statecachectl prints
  // usage + `help` for `CMD --help`, `CMD -h` and `help CMD`.
  bool own_flags = false;
  // Optional: an entry that reports its own errors and returns the exit
  // code; used instead of `run` (calibrate, evaluate).
  std::function<int(CtlContext& ctx, const std::vector<std::string>& args)> main;
  // The command's flags and arguments, one per line (without own_flags).
  std::string help;
};

// Parses a command's arguments (everything after its name): the flags of
// `spec`, plus --help/-h. Deprecation warnings go to stderr. An unknown flag
// that is one of statecachectl's global flags says to give it before the
// command name.
absl::StatusOr<CliFlags> ParseCommandFlags(const std::vector<std::string>& args,
                                           CliFlags::Spec spec);

// The process exit code for a command's status (see the table above).
int ExitCode(const absl::Status& status);

// Names of statecachectl's global flags (given before the command name).
const std::vector<std::string>& GlobalFlagNames();

// OK for "host:port", "[v6]:port", "unix:/path", "unix-abstract:name",
// "dns:[//authority/]host:port", "ipv4:a.b.c.d:port", "ipv6:[v6]:port";
// kInvalidArgument "--server: malformed address '...': <why>" otherwise
// (no port, port out of 1..65535, empty host, spaces, an unbracketed IPv6).
absl::Status ValidateServerAddress(absl::string_view address);

// "0123456789abcdef/3" (SlotHandle::DebugString) -> handle; kInvalidArgument
// naming `field` otherwise.
absl::StatusOr<SlotHandle> ParseSlotHandle(absl::string_view text, absl::string_view field);
// "0123456789abcdef@12" (PrefixKey::DebugString) -> key.
absl::StatusOr<PrefixKey> ParsePrefixKey(absl::string_view text, absl::string_view field);
// --key_kind=fnv64|sha256 (default fnv64): the chain computed from tokens.
absl::StatusOr<PrefixKeyKind> KeyKindFromFlags(const CliFlags& flags);
// Token ids separated by commas and/or whitespace ("1,2 3").
absl::StatusOr<std::vector<int32_t>> ParseTokenList(absl::string_view text,
                                                    absl::string_view field);
// The prefix of lookup / snapshot from --tokens=LIST or --tokens_file=FILE
// (exactly one; kInvalidArgument otherwise).
absl::StatusOr<std::vector<int32_t>> TokensFromFlags(const CliFlags& flags);

// Whole file / whole-file write; kNotFound / kInvalidArgument naming `field`.
absl::StatusOr<std::string> ReadFileBytes(const std::string& path, absl::string_view field);
absl::Status WriteFileBytes(const std::string& path, absl::string_view bytes,
                            absl::string_view field);

// Server health, backend, memory budgets and per-model use.
Command StatusCommand();
// Registered models: format, geometry, sizes, slots and checkpoints.
Command ModelsCommand();
// Register a model (geometry + format, or a layout file) / drop one
// (ctl_register.cc).
Command RegisterCommand();
Command DropCommand();
// Slots of a model: list (counts), allocate, release (ctl_slots.cc).
Command SlotsCommand();
// Prefix cache: longest cached prefix, checkpoint a slot (ctl_prefix.cc).
Command LookupCommand();
Command SnapshotCommand();
// A slot's packed state to / from a file (ctl_transfer.cc).
Command ExportCommand();
Command ImportCommand();
// A slot's or a checkpoint's states as FP32 to a file (ctl_transfer.cc).
Command UnpackCommand();

// The shipped GDN model served with DAMP states vs FP32 (ctl_demo.cc).
Command DemoCommand();
// fp32 / bf16 / damp under one checkpoint-memory budget (ctl_serve_bench.cc).
Command ServeBenchCommand();
// DAMP / DAMP-SR calibration and evaluation (client/ctl_calibration); with
// --model, calibration of a model the server runs through the Calibrate RPC
// (ctl_calibration.cc).
Command CalibrateCommand();
Command EvaluateCommand();

// The table of `models` / `register`, and its --json form
// {"models": [ModelInfo, ...]} (ctl_models.cc).
void PrintModels(std::FILE* out, const std::vector<v1::ModelInfo>& models);
std::string ModelsJson(const std::vector<v1::ModelInfo>& models);

// "12.3 MiB".
std::string HumanBytes(double bytes);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CTL_CTL_COMMAND_H_
