#include "client/ctl/serve_bench_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

// A connected TCP socket to host:port (IPv4 literal or "localhost"), or -1.
int Connect(const std::string& host, int port, int timeout_ms) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &a.sin_addr) != 1) {
    return -1;
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  return ok ? ntohs(a.sin_port) : -1;
}

// Fixed pseudo-random unit vectors, `n` of length `d`, into `out`.
void UnitRows(std::mt19937& rng, int n, int d, std::vector<float>* out) {
  std::normal_distribution<float> normal(0.f, 1.f);
  out->resize(static_cast<size_t>(n) * d);
  for (int r = 0; r < n; ++r) {
    double ss = 0;
    for (int j = 0; j < d; ++j) {
      const float x = normal(rng);
      (*out)[static_cast<size_t>(r) * d + j] = x;
      ss += double{x} * x;
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(ss));
    for (int j = 0; j < d; ++j) (*out)[static_cast<size_t>(r) * d + j] *= inv;
  }
}

}  // namespace

absl::Status ParseHostPort(const std::string& address, const std::string& field,
                           std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 1 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", address, "' (want host:port with port in 1..65535)"));
  }
  *host = address.substr(0, colon);
  return absl::OkStatus();
}

absl::StatusOr<std::string> RedisCommand(const std::string& host, int port,
                                         const std::vector<std::string>& args, int timeout_ms) {
  const int fd = Connect(host, port, timeout_ms);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("redis at ", host, ":", port, ": cannot connect"));
  }
  std::string req = absl::StrCat("*", args.size(), "\r\n");
  for (const std::string& a : args) absl::StrAppend(&req, "$", a.size(), "\r\n", a, "\r\n");
  size_t sent = 0;
  while (sent < req.size()) {
    const ssize_t n = send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("redis at ", host, ":", port, ": send failed"));
    }
    sent += static_cast<size_t>(n);
  }
  std::string line;
  char c = 0;
  while (line.size() < 4096) {
    const ssize_t n = recv(fd, &c, 1, 0);
    if (n <= 0) break;
    if (c == '\n') break;
    if (c != '\r') line += c;
  }
  close(fd);
  if (line.empty()) {
    return absl::UnavailableError(absl::StrCat("redis at ", host, ":", port, ": no reply"));
  }
  if (line[0] == '-') {
    return absl::InternalError(absl::StrCat("redis ", args.empty() ? "" : args[0], ": ", line));
  }
  return line;
}

absl::StatusOr<std::unique_ptr<RedisProcess>> RedisProcess::Start(const std::string& binary) {
  std::unique_ptr<RedisProcess> r(new RedisProcess());
  std::string tmpl = "/tmp/sc-redis-XXXXXX";
  if (::mkdtemp(&tmpl[0]) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  r->dir_ = tmpl;
  r->port_ = FreeLoopbackPort();
  if (r->port_ <= 0) return absl::InternalError("redis: no free loopback port");
  const std::string port = std::to_string(r->port_);
  const std::string log = r->dir_ + "/redis.log";
  r->pid_ = fork();
  if (r->pid_ < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (r->pid_ == 0) {
    execlp(binary.c_str(), binary.c_str(), "--port", port.c_str(), "--bind", "127.0.0.1",
           "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", tmpl.c_str(),
           "--logfile", log.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 500; ++i) {
    absl::StatusOr<std::string> pong = RedisCommand("127.0.0.1", r->port_, {"PING"}, 200);
    if (pong.ok() && *pong == "+PONG") return r;
    int status = 0;
    if (waitpid(r->pid_, &status, WNOHANG) == r->pid_) {
      r->pid_ = -1;
      return absl::UnavailableError(absl::StrCat("--redis_server: '", binary,
                                                 "' exited at start (status ", status, ")"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::UnavailableError(
      absl::StrCat("--redis_server: '", binary, "' did not answer PING on port ", port));
}

RedisProcess::~RedisProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string RedisProcess::address() const { return absl::StrCat("127.0.0.1:", port_); }

absl::StatusOr<std::unique_ptr<SubjectCache>> SubjectCache::Create(
    const std::vector<StateCacheClient*>& clients, const std::string& model_id,
    const ConversationRouter* router) {
  if (clients.empty()) return absl::InvalidArgumentError("clients: none");
  if (router->options().instances > static_cast<int>(clients.size())) {
    return absl::InvalidArgumentError(absl::StrCat("router: ", router->options().instances,
                                                   " instances, ", clients.size(), " clients"));
  }
  std::unique_ptr<SubjectCache> s(new SubjectCache());
  s->router_ = router;
  s->counts_.turns_by_instance.assign(clients.size(), 0);
  RemoteStateStore::Options so;
  so.record_latency = false;
  for (StateCacheClient* c : clients) {
    ASSIGN_OR_RETURN(std::unique_ptr<RemoteStateStore> store,
                     RemoteStateStore::Create(c, model_id, so));
    s->stores_.push_back(std::move(store));
  }
  const ModelGeometry& g = s->stores_[0]->geometry();
  // One token per layer: unit q / k rows, unit v rows, decay exp(-0.1),
  // beta 0.5, from a fixed seed (the same on every instance).
  std::mt19937 rng(31);
  std::vector<float> q, k, v;
  const std::vector<float> gate(g.arch == Arch::kKda ? g.h_v * g.d_k : g.h_v, -0.1f);
  const std::vector<float> beta(g.h_v, 0.5f);
  for (int l = 0; l < g.layers; ++l) {
    UnitRows(rng, g.h_qk, g.d_k, &q);
    UnitRows(rng, g.h_qk, g.d_k, &k);
    UnitRows(rng, g.h_v, g.d_v, &v);
    RecurrentInputs in;
    in.tokens = 1;
    in.q = q.data();
    in.k = k.data();
    in.v = v.data();
    in.g = gate.data();
    in.beta = beta.data();
    for (auto& store : s->stores_) RETURN_IF_ERROR(store->Prefill(l, in, nullptr));
  }
  const int64_t per_layer = ConvWindowBytesPerLayer(g);
  for (int l = 0; l < g.layers; ++l) {
    std::string a(static_cast<size_t>(per_layer), '\0');
    for (int64_t i = 0; i < per_layer; ++i) a[i] = static_cast<char>((i * 131 + l * 7) & 0xff);
    s->aux_.push_back(std::move(a));
  }
  return s;
}

int64_t SubjectCache::aux_bytes() const {
  int64_t n = 0;
  for (const std::string& a : aux_) n += static_cast<int64_t>(a.size());
  return n;
}

absl::StatusOr<int64_t> SubjectCache::BeforeTurn(int step, int conversation, int turn,
                                                 absl::Span<const int32_t> prompt) {
  const int i = router_->Route(step, conversation);
  ++counts_.turns_by_instance[i];
  ASSIGN_OR_RETURN(std::optional<RemoteStateStore::Restored> r,
                   stores_[i]->RestoreLongestPrefix(prompt));
  if (!r.has_value()) {
    ++counts_.misses;
    return 0;
  }
  ++counts_.hits;
  auto it = origin_.find({conversation, r->key.num_tokens});
  if (it != origin_.end() && it->second != i) ++counts_.cross_instance_hits;
  return r->key.num_tokens;
}

absl::Status SubjectCache::AfterTurn(int step, int conversation, int turn,
                                     absl::Span<const int32_t> context) {
  const int i = router_->Route(step, conversation);
  RETURN_IF_ERROR(stores_[i]->Snapshot(context, aux_).status());
  origin_[{conversation, static_cast<int64_t>(context.size())}] = i;
  return absl::OkStatus();
}

}  // namespace statecache
