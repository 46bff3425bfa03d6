#include "server/dataplane/bench/bench_common.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

extern char** environ;

namespace statecache {
namespace bench {

Inputs MakeInputs(const ModelGeometry& geo, int b, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.05f, 0.95f);
  Inputs in;
  auto unit = [&](std::vector<float>* x, int64_t rows, int d) {
    x->resize(rows * d);
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int i = 0; i < d; ++i) s += std::pow((*x)[r * d + i] = n(rng), 2);
      for (int i = 0; i < d; ++i) (*x)[r * d + i] /= static_cast<float>(std::sqrt(s));
    }
  };
  unit(&in.q, int64_t{b} * geo.h_qk, geo.d_k);
  unit(&in.k, int64_t{b} * geo.h_qk, geo.d_k);
  in.v.resize(int64_t{b} * geo.h_v * geo.d_v);
  for (float& x : in.v) x = n(rng);
  const int64_t gn = int64_t{b} * geo.h_v * (geo.arch == Arch::kKda ? geo.d_k : 1);
  in.g.resize(gn);
  for (float& x : in.g) x = -0.1f * u(rng);
  in.beta.resize(int64_t{b} * geo.h_v);
  for (float& x : in.beta) x = u(rng);
  in.o_count = int64_t{b} * geo.h_v * geo.d_v;
  return in;
}

absl::StatusOr<RefUpdateCall> StageInputs(DataPlaneSession* session, const Inputs& in,
                                          const std::vector<SlotHandle>& slots, int64_t o_bytes,
                                          WorkerBuffer** out_buffer) {
  auto up = [](int64_t x) { return (x + 255) / 256 * 256; };
  const int64_t q = 0, k = up(4 * in.q.size()), v = k + up(4 * in.k.size()),
                g = v + up(4 * in.v.size()), beta = g + up(4 * in.g.size()),
                total = beta + up(4 * in.beta.size());
  ASSIGN_OR_RETURN(WorkerBuffer * buf, session->CreateBuffer(total));
  ASSIGN_OR_RETURN(WorkerBuffer * out,
                   session->CreateBuffer(std::max<int64_t>(o_bytes, 4 * in.o_count)));
  RETURN_IF_ERROR(buf->Write(q, in.q.data(), 4 * in.q.size()));
  RETURN_IF_ERROR(buf->Write(k, in.k.data(), 4 * in.k.size()));
  RETURN_IF_ERROR(buf->Write(v, in.v.data(), 4 * in.v.size()));
  RETURN_IF_ERROR(buf->Write(g, in.g.data(), 4 * in.g.size()));
  RETURN_IF_ERROR(buf->Write(beta, in.beta.data(), 4 * in.beta.size()));
  RefUpdateCall c;
  c.slots = slots;
  c.q = {buf, q};
  c.k = {buf, k};
  c.v = {buf, v};
  c.g = {buf, g};
  c.beta = {buf, beta};
  c.o = {out, 0};
  *out_buffer = out;
  return c;
}

absl::StatusOr<std::unique_ptr<ServerHandle>> ServerHandle::Start(const ServerSpec& spec) {
  auto h = std::unique_ptr<ServerHandle>(new ServerHandle());
  h->target_ = spec.listen;
  if (!spec.spawn) {
    StateCacheServer::Options o;
    o.sockets.listen = spec.listen;
    o.memory.backend = spec.backend;
    o.memory.state_memory_bytes = spec.state_bytes;
    o.memory.checkpoint_memory_bytes = 1 << 20;
    o.metrics.port = -1;
    o.dataplane.shared_pools = true;
    o.slot_idle_timeout = absl::ZeroDuration();
    ASSIGN_OR_RETURN(h->server_, StateCacheServer::Create(std::move(o)));
    return h;
  }
  if (spec.statecached.empty()) {
    return absl::InvalidArgumentError("statecached: give --statecached=PATH");
  }
  std::vector<std::string> args = {spec.statecached,
                                   "--listen=" + spec.listen,
                                   "--backend=" + spec.backend,
                                   "--metrics_port=-1",
                                   "--shared_pools",
                                   absl::StrCat("--state_memory_bytes=", spec.state_bytes),
                                   "--checkpoint_memory_bytes=1048576",
                                   "--slot_idle_timeout_ms=0",
                                   "--report_geometry=gdn:1:1:1:32:32"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (posix_spawn(&h->pid_, spec.statecached.c_str(), nullptr, nullptr, argv.data(), environ) !=
      0) {
    return absl::InternalError(absl::StrCat("cannot spawn ", spec.statecached));
  }
  return h;
}

ServerHandle::~ServerHandle() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int st;
    waitpid(pid_, &st, 0);
  }
}

}  // namespace bench
}  // namespace statecache
