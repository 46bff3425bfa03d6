#include "client/ctl/ctl_command.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

absl::Status Malformed(absl::string_view address, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--server: malformed address '", address, "': ", why,
      " (want host:port, [ipv6]:port, unix:/path or dns:///host:port)"));
}

// "host:port" / "[v6]:port" after any scheme.
absl::Status ValidateHostPort(absl::string_view address, absl::string_view host_port) {
  std::string host, port;
  if (absl::StartsWith(host_port, "[")) {
    const size_t close = host_port.find(']');
    if (close == absl::string_view::npos) return Malformed(address, "unterminated '['");
    host = std::string(host_port.substr(1, close - 1));
    absl::string_view after = host_port.substr(close + 1);
    if (!absl::StartsWith(after, ":")) return Malformed(address, "missing :port");
    port = std::string(after.substr(1));
  } else {
    const size_t colon = host_port.rfind(':');
    if (colon == absl::string_view::npos) return Malformed(address, "missing :port");
    host = std::string(host_port.substr(0, colon));
    port = std::string(host_port.substr(colon + 1));
    if (host.find(':') != std::string::npos) {
      return Malformed(address, "an IPv6 host needs brackets, [::1]:port");
    }
    for (char c : host) {
      if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_') {
        return Malformed(address, absl::StrCat("'", std::string(1, c), "' in host name"));
      }
    }
  }
  if (host.empty()) return Malformed(address, "empty host");
  int port_number = 0;
  if (port.empty() || !absl::SimpleAtoi(port, &port_number) ||
      port.find_first_not_of("0123456789") != std::string::npos || port_number < 1 ||
      port_number > 65535) {
    return Malformed(address, absl::StrCat("port '", port, "' is not in 1..65535"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateServerAddress(absl::string_view address) {
  if (address.empty()) return Malformed(address, "empty");
  for (char c : address) {
    if (absl::ascii_isspace(c) || absl::ascii_iscntrl(c)) {
      return Malformed(address, "contains white space");
    }
  }
  for (absl::string_view scheme : {"unix:", "unix-abstract:"}) {
    if (absl::StartsWith(address, scheme)) {
      absl::string_view rest = address.substr(scheme.size());
      if (absl::StartsWith(rest, "//")) rest.remove_prefix(2);
      if (rest.empty()) return Malformed(address, "empty socket path");
      return absl::OkStatus();
    }
  }
  absl::string_view host_port = address;
  if (absl::StartsWith(host_port, "dns:")) {
    host_port.remove_prefix(4);
    if (absl::StartsWith(host_port, "//")) {  // dns://authority/host:port
      const size_t slash = host_port.find('/', 2);
      if (slash == absl::string_view::npos) return Malformed(address, "missing '/' after authority");
      host_port.remove_prefix(slash + 1);
    }
  } else if (absl::StartsWith(host_port, "ipv4:") || absl::StartsWith(host_port, "ipv6:")) {
    host_port.remove_prefix(5);
  } else if (host_port.find("://") != absl::string_view::npos) {
    return Malformed(address, "unknown scheme");
  }
  return ValidateHostPort(address, host_port);
}

absl::StatusOr<StateCacheClient*> CtlContext::client() {
  if (client_ == nullptr) {
    RETURN_IF_ERROR(ValidateServerAddress(server_));
    ASSIGN_OR_RETURN(client_, StateCacheClient::Connect(server_, client_options_));
    absl::Status ready = client_->WaitForReady(connect_timeout_);
    if (!ready.ok()) {
      client_.reset();
      return absl::UnavailableError(absl::StrCat("cannot reach statecached at ", server_,
                                                 " (", ready.message(), ")"));
    }
  }
  return client_.get();
}

const std::vector<std::string>& GlobalFlagNames() {
  static const auto* names = new std::vector<std::string>{
      "server", "connect_timeout_ms", "token_file", "tls_ca_file", "tls_cert_file",
      "tls_key_file"};
  return *names;
}

absl::StatusOr<CliFlags> ParseCommandFlags(const std::vector<std::string>& args,
                                           CliFlags::Spec spec) {
  spec.bool_flags.insert("help");
  absl::StatusOr<CliFlags> f = CliFlags::Parse(args, spec);
  if (!f.ok()) {
    for (const std::string& global : GlobalFlagNames()) {
      for (const std::string& arg : args) {
        if (absl::StartsWith(arg, absl::StrCat("--", global)) &&
            (arg.size() == global.size() + 2 || arg[global.size() + 2] == '=')) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", global,
                           " is a global flag: give it before the command name "
                           "(statecachectl --",
                           global, "=... COMMAND)"));
        }
      }
    }
    return f.status();
  }
  for (const std::string& w : f->warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  return f;
}

int ExitCode(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kInvalidArgument:
      return 2;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return 3;
    default:
      return 1;
  }
}

absl::StatusOr<SlotHandle> ParseSlotHandle(absl::string_view text, absl::string_view field) {
  std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(text, absl::MaxSplits('/', 1));
  SlotHandle h;
  uint32_t generation = 0;
  if (p.first.empty() || p.first.size() > 16 || !absl::SimpleHexAtoi(p.first, &h.id) ||
      !absl::SimpleAtoi(p.second, &generation)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", text, "' is not a slot handle ID/GENERATION (e.g. 0123456789abcdef/1)"));
  }
  h.generation = generation;
  return h;
}

absl::StatusOr<PrefixKey> ParsePrefixKey(absl::string_view text, absl::string_view field) {
  std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(text, absl::MaxSplits('@', 1));
  PrefixKey k;
  if (p.first.empty() || p.first.size() > 16 || !absl::SimpleHexAtoi(p.first, &k.hash) ||
      !absl::SimpleAtoi(p.second, &k.num_tokens) || k.num_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", text, "' is not a prefix key HASH@TOKENS (e.g. 0123456789abcdef@12)"));
  }
  return k;
}

absl::StatusOr<PrefixKeyKind> KeyKindFromFlags(const CliFlags& f) {
  const std::string kind = f.Get("key_kind", "fnv64");
  if (kind == "fnv64") return PrefixKeyKind::kFnv64;
  if (kind == "sha256") return PrefixKeyKind::kSha256;
  return absl::InvalidArgumentError(
      absl::StrCat("--key_kind: '", kind, "' is not fnv64 or sha256"));
}

absl::StatusOr<std::vector<int32_t>> ParseTokenList(absl::string_view text,
                                                    absl::string_view field) {
  std::vector<int32_t> tokens;
  for (absl::string_view t : absl::StrSplit(text, absl::ByAnyChar(", \t\r\n"), absl::SkipEmpty())) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(t, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", t, "' is not a token id (32-bit integer)"));
    }
    tokens.push_back(v);
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": no token ids"));
  return tokens;
}

absl::StatusOr<std::vector<int32_t>> TokensFromFlags(const CliFlags& flags) {
  if (flags.Has("tokens") == flags.Has("tokens_file")) {
    return absl::InvalidArgumentError("give exactly one of --tokens or --tokens_file");
  }
  if (flags.Has("tokens")) return ParseTokenList(flags.Get("tokens", ""), "--tokens");
  ASSIGN_OR_RETURN(std::string text, ReadFileBytes(flags.Get("tokens_file", ""), "--tokens_file"));
  return ParseTokenList(text, "--tokens_file");
}

absl::StatusOr<std::string> ReadFileBytes(const std::string& path, absl::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(field, ": cannot read ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::Status WriteFileBytes(const std::string& path, absl::string_view bytes,
                            absl::string_view field) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InvalidArgumentError(absl::StrCat(field, ": cannot write ", path));
  return absl::OkStatus();
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", bytes) : absl::StrFormat("%.1f %s", bytes, units[u]);
}

}  // namespace statecache
