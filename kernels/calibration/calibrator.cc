#include "kernels/calibration/calibrator.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <cmath>
#include <future>
#include <map>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/calibration/quant_error.h"
#include "kernels/common/status_macros.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/formats/hadamard.h"
#include "kernels/formats/head_layout.h"
#include "kernels/trajectory/trajectory_file.h"

namespace statecache {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Offsets of each statistic inside one head's block of sums.
struct Offsets {
  int d_k = 0, d_v = 0, candidates = 0;
  int64_t energy = 0, e_had = 0, h_had = 0, log_a = 0, q2 = 0, e_sr = 0, h_sr = 0, h16_sr = 0, colsq = 0;
  int64_t stride = 0;

  Offsets(int dk, int dv, int c) : d_k(dk), d_v(dv), candidates(c) {
    int64_t o = 0;
    for (int64_t* f : {&energy, &e_had, &h_had, &log_a, &q2}) {
      *f = o;
      o += d_k;
    }
    for (int64_t* f : {&e_sr, &h_sr, &h16_sr}) {
      *f = o;
      o += int64_t{c} * d_k;
    }
    colsq = o;
    o += d_v;
    stride = o;
  }
};

// Sums of one (domain, half) group over its trajectories.
struct GroupAcc {
  int domain = 0;
  int half = 0;
  int64_t samples = 0;     // per head, pass 2
  int64_t samples_p1 = 0;  // per head, pass 1 (column statistics)
  int64_t tokens = 0;
  std::vector<double> sums;  // [heads][stride]
};

// One FP32 token of the recurrence without readout; same arithmetic as
// kernels/cpu/head_step.cc. `a` is exp(g) per key channel (GDN: a[0]).
void StepState(bool kda, int d_k, int d_v, const float* k, const float* a, float beta,
               const float* v, float* w, float* kv) {
  for (int j = 0; j < d_v; ++j) kv[j] = 0.0f;
  for (int r = 0; r < d_k; ++r) {
    float* __restrict row = w + int64_t{r} * d_v;
    const float ar = kda ? a[r] : a[0];
    const float kr = k[r];
    for (int j = 0; j < d_v; ++j) {
      row[j] *= ar;
      kv[j] += kr * row[j];
    }
  }
  for (int j = 0; j < d_v; ++j) kv[j] = beta * (v[j] - kv[j]);
  for (int r = 0; r < d_k; ++r) {
    float* __restrict row = w + int64_t{r} * d_v;
    const float kr = k[r];
    for (int j = 0; j < d_v; ++j) row[j] += kr * kv[j];
  }
}

// A damp-sr candidate in stored order, ready for the hot loop.
struct StoredCandidate {
  std::vector<int32_t> order;
  std::vector<float> scale;  // scale[order[j']]
};

// Replays one (layer, head) of `traj` and adds its statistics to `acc`
// (this head's block of the trajectory's group).
void ProcessHead(const Trajectory& traj, int layer, int head, const Offsets& off, int pass,
                 const CalibrationOptions& opt, const std::vector<SrCandidate>* candidates,
                 double* acc) {
  const ModelGeometry& geo = traj.geometry;
  const LayerInputs& in = traj.layers[layer];
  const bool kda = geo.arch == Arch::kKda;
  const int d_k = geo.d_k, d_v = geo.d_v, T = traj.tokens;
  const int gw = geo.GateWidth();
  const int kh = geo.KeyHeadOf(head);
  const int every = opt.sample_every, H = opt.horizon;

  // Decays a_t = exp(g_t) and a_t^2 for every token of this head.
  std::vector<float> a(int64_t{T} * gw), a2(a.size());
  std::vector<double> g_sum(gw, 0.0);
  for (int t = 0; t < T; ++t) {
    const float* g = in.g.data() + (int64_t{t} * geo.h_v + head) * gw;
    for (int i = 0; i < gw; ++i) {
      a[int64_t{t} * gw + i] = std::exp(g[i]);
      a2[int64_t{t} * gw + i] = a[int64_t{t} * gw + i] * a[int64_t{t} * gw + i];
      g_sum[i] += g[i];
    }
  }
  if (pass == 2) {
    for (int u = 0; u < d_k; ++u) acc[off.log_a + u] += g_sum[kda ? u : 0];
    for (int t = 0; t < T; ++t) {
      const float* q = in.q.data() + (int64_t{t} * geo.h_qk + kh) * d_k;
      for (int u = 0; u < d_k; ++u) acc[off.q2 + u] += double{q[u]} * q[u];
    }
  }
  // Tail ratio of the horizon beyond the end: this trajectory's a_eff^2.
  std::vector<double> tail(gw);
  for (int i = 0; i < gw; ++i) tail[i] = std::exp(2.0 * g_sum[i] / T);

  std::vector<StoredCandidate> cand;
  if (pass == 2 && candidates != nullptr) {
    for (const SrCandidate& c : *candidates) {
      StoredCandidate s;
      s.order = c.order;
      s.scale.resize(d_v);
      for (int j = 0; j < d_v; ++j) s.scale[j] = c.scale[c.order[j]];
      cand.push_back(std::move(s));
    }
  }
  const int C = static_cast<int>(cand.size());

  std::vector<float> w(int64_t{d_k} * d_v, 0.0f), kv(d_v), buf(d_v);
  std::vector<double> W(gw), p(gw);
  std::vector<float> wt(C > 0 ? w.size() : 0), sr_buf(32 * d_k + d_v), e8(d_k), e16(d_k);
  for (int t = 0; t < T; ++t) {
    StepState(kda, d_k, d_v, in.k.data() + (int64_t{t} * geo.h_qk + kh) * d_k,
              a.data() + int64_t{t} * gw, in.beta[int64_t{t} * geo.h_v + head],
              in.v.data() + (int64_t{t} * geo.h_v + head) * d_v, w.data(), kv.data());
    if ((t + 1) % every != 0) continue;
    if (pass == 1) {
      double* colsq = acc + off.colsq;
      for (int u = 0; u < d_k; ++u) {
        const float* row = w.data() + int64_t{u} * d_v;
        for (int j = 0; j < d_v; ++j) colsq[j] += double{row[j]} * row[j];
      }
      continue;
    }
    // Horizon weights W = 1 + sum_{j=1..H} prod_{r=1..j} a_{t+r}^2.
    const int m = std::min(H, T - 1 - t);
    std::fill(W.begin(), W.end(), 1.0);
    std::fill(p.begin(), p.end(), 1.0);
    for (int j = 1; j <= m; ++j) {
      const float* aj = a2.data() + int64_t{t + j} * gw;
      for (int i = 0; i < gw; ++i) {
        p[i] *= aj[i];
        W[i] += p[i];
      }
    }
    if (m < H) {
      for (int i = 0; i < gw; ++i) {
        const double r = tail[i];
        const int rest = H - m;
        W[i] += r < 1.0 - 1e-12 ? p[i] * r * (1.0 - std::pow(r, rest)) / (1.0 - r) : p[i] * rest;
      }
    }
    if (C > 0) {
      Transpose(w.data(), d_k, d_v, wt.data());
      for (int c = 0; c < C; ++c) {
        SrErrorsTransposed(wt.data(), d_k, d_v, cand[c].order.data(), cand[c].scale.data(),
                           sr_buf.data(), e8.data(), e16.data());
        for (int u = 0; u < d_k; ++u) {
          const double wu = W[kda ? u : 0];
          acc[off.e_sr + int64_t{c} * d_k + u] += e8[u];
          acc[off.h_sr + int64_t{c} * d_k + u] += e8[u] * wu;
          acc[off.h16_sr + int64_t{c} * d_k + u] += e16[u] * wu;
        }
      }
    }
    for (int u = 0; u < d_k; ++u) {
      const float* row = w.data() + int64_t{u} * d_v;
      const double wu = W[kda ? u : 0];
      acc[off.energy + u] += SquaredNorm(row, d_v);
      std::copy(row, row + d_v, buf.data());
      FastBlockHadamard32(buf.data(), d_v);
      const double e = AffineU8RowError(buf.data(), d_v);
      acc[off.e_had + u] += e;
      acc[off.h_had + u] += e * wu;
    }
  }
}

// Domain-balanced mean of `count` values at `offset` of head `h` over the
// groups of `split`; `by_tokens` divides by tokens instead of samples.
void BalancedMean(const std::vector<GroupAcc>& groups, int num_domains, Split split, int64_t h,
                  int64_t stride, int64_t offset, int64_t count, int pass, bool by_tokens,
                  std::vector<double>* out) {
  out->assign(count, 0.0);
  int used = 0;
  std::vector<double> sum(count);
  for (int d = 0; d < num_domains; ++d) {
    std::fill(sum.begin(), sum.end(), 0.0);
    int64_t n = 0;
    for (const GroupAcc& g : groups) {
      if (g.domain != d) continue;
      if (split == Split::kFirstHalf && g.half != 0) continue;
      if (split == Split::kSecondHalf && g.half != 1) continue;
      n += by_tokens ? g.tokens : (pass == 1 ? g.samples_p1 : g.samples);
      const double* s = g.sums.data() + h * stride + offset;
      for (int64_t i = 0; i < count; ++i) sum[i] += s[i];
    }
    if (n == 0) continue;
    ++used;
    for (int64_t i = 0; i < count; ++i) (*out)[i] += sum[i] / static_cast<double>(n);
  }
  if (used > 0) {
    for (double& x : *out) x /= used;
  }
}

std::vector<SrCandidate> MakeCandidates(const std::vector<double>& colsq_mean, int d_k,
                                        const std::vector<double>& alphas) {
  const int d_v = static_cast<int>(colsq_mean.size());
  std::vector<double> r(d_v);
  double rmax = 0.0;
  for (int j = 0; j < d_v; ++j) {
    r[j] = std::sqrt(std::max(0.0, colsq_mean[j]) / d_k);
    rmax = std::max(rmax, r[j]);
  }
  std::vector<SrCandidate> out;
  SrCandidate identity;
  identity.order.resize(d_v);
  std::iota(identity.order.begin(), identity.order.end(), 0);
  identity.scale.assign(d_v, 1.0f);
  out.push_back(identity);
  for (double alpha : alphas) {
    SrCandidate c;
    std::vector<double> scale(d_v, 1.0), scaled(d_v);
    if (rmax > 0.0) {
      double log_mean = 0.0;
      for (int j = 0; j < d_v; ++j) {
        scale[j] = std::pow(std::max(r[j], 1e-3 * rmax), alpha);
        log_mean += std::log(scale[j]);
      }
      log_mean /= d_v;
      for (int j = 0; j < d_v; ++j) scale[j] /= std::exp(log_mean);
    }
    for (int j = 0; j < d_v; ++j) scaled[j] = r[j] / scale[j];
    c.order.resize(d_v);
    std::iota(c.order.begin(), c.order.end(), 0);
    std::stable_sort(c.order.begin(), c.order.end(),
                     [&](int32_t x, int32_t y) { return scaled[x] > scaled[y]; });
    c.scale.resize(d_v);
    for (int j = 0; j < d_v; ++j) c.scale[j] = static_cast<float>(scale[j]);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

TrajectorySource TrajectoriesFromVector(const std::vector<Trajectory>* trajectories) {
  TrajectorySource s;
  s.count = static_cast<int>(trajectories->size());
  s.load = [trajectories](int i) -> absl::StatusOr<std::shared_ptr<const Trajectory>> {
    // Aliasing constructor: no ownership, no copy.
    return std::shared_ptr<const Trajectory>(std::shared_ptr<const Trajectory>(),
                                             &(*trajectories)[i]);
  };
  return s;
}

TrajectorySource TrajectoriesFromFiles(std::vector<std::string> paths) {
  TrajectorySource s;
  s.count = static_cast<int>(paths.size());
  s.load = [paths = std::move(paths)](int i) -> absl::StatusOr<std::shared_ptr<const Trajectory>> {
    ASSIGN_OR_RETURN(Trajectory t, ReadTrajectoryFile(paths[i]));
    return std::make_shared<const Trajectory>(std::move(t));
  };
  return s;
}

ChannelStatsView CalibrationStats::View(Split split, int64_t head_index, int sr_candidate) const {
  const HeadStats& h = heads[static_cast<int>(split)][head_index];
  ChannelStatsView v;
  v.d_k = geometry.d_k;
  v.energy = h.energy.data();
  v.log_a = h.log_a.data();
  v.q2 = h.q2.data();
  if (sr_candidate < 0) {
    v.error = h.e_had.data();
    v.horizon = h.h_had.data();
  } else {
    v.error = h.e_sr.data() + int64_t{sr_candidate} * geometry.d_k;
    v.horizon = h.h_sr.data() + int64_t{sr_candidate} * geometry.d_k;
  }
  return v;
}

namespace {

absl::Status CheckCalibrateArgs(const TrajectorySource& source,
                                const CalibrationOptions& options) {
  if (source.count < 1 || !source.load) {
    return absl::InvalidArgumentError("trajectories: none given");
  }
  if (options.sample_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample_every: ", options.sample_every, " < 1"));
  }
  if (options.horizon < 0) {
    return absl::InvalidArgumentError(absl::StrCat("horizon: ", options.horizon, " < 0"));
  }
  for (double alpha : options.sr_alphas) {
    if (!(alpha >= 0.0 && alpha <= 2.0)) {
      return absl::InvalidArgumentError(absl::StrCat("sr_alphas: ", alpha, " not in [0, 2]"));
    }
  }
  return absl::OkStatus();
}

// What Calibrate's passes over the trajectories accumulate into `st`.
struct Accumulator {
  Accumulator(const CalibrationOptions& o, ThreadPool& p, CalibrationStats& s)
      : options(o), pool(p), st(s) {}

  const CalibrationOptions& options;
  ThreadPool& pool;
  CalibrationStats& st;
  std::map<std::string, int> domain_index;  // by first appearance, renumbered sorted below
  std::vector<GroupAcc> groups;
  std::map<std::string, int> seen_in_domain;
  std::vector<std::vector<SrCandidate>> candidates;  // [heads][c]
  bool have_geometry = false;
  Offsets off{1, 32, 0};
  double load_seconds = 0.0;
};

// Takes the geometry (and the statistics' offsets) from the first trajectory;
// kInvalidArgument naming trajectory i when a later one differs.
absl::Status TakeGeometry(Accumulator& acc, const Trajectory& traj, int i) {
  CalibrationStats& st = acc.st;
  if (!acc.have_geometry) {
    if (traj.geometry.d_v % kGroupSize != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("d_v: ", traj.geometry.d_v, " is not a multiple of 32"));
    }
    st.geometry = traj.geometry;
    acc.off = Offsets(st.geometry.d_k, st.geometry.d_v,
                      acc.options.damp_sr ? 1 + static_cast<int>(acc.options.sr_alphas.size())
                                          : 0);
    acc.have_geometry = true;
  } else if (traj.geometry != st.geometry) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trajectory ", i, ": geometry ", traj.geometry.DebugString(),
        " differs from the first trajectory's ", st.geometry.DebugString()));
  }
  return absl::OkStatus();
}

// The group of `traj`: (domain, alternating half within the domain), created
// with zero sums on first use.
GroupAcc& GroupOf(Accumulator& acc, const Trajectory& traj, int64_t heads) {
  auto [it, inserted] =
      acc.domain_index.emplace(traj.domain, static_cast<int>(acc.domain_index.size()));
  const int half = acc.seen_in_domain[traj.domain]++ % 2;
  int gi = -1;
  for (size_t g = 0; g < acc.groups.size(); ++g) {
    if (acc.groups[g].domain == it->second && acc.groups[g].half == half) {
      gi = static_cast<int>(g);
    }
  }
  if (gi < 0) {
    GroupAcc g;
    g.domain = it->second;
    g.half = half;
    g.sums.assign(heads * acc.off.stride, 0.0);
    acc.groups.push_back(std::move(g));
    gi = static_cast<int>(acc.groups.size()) - 1;
  }
  return acc.groups[gi];
}

// Adds trajectory i's statistics of `pass` (1: column statistics, 2: the
// rest) to its group.
absl::Status AddTrajectory(Accumulator& acc, const Trajectory& traj, int i, int pass) {
  absl::Status valid = traj.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("trajectory ", i, ": ", valid.message()));
  }
  RETURN_IF_ERROR(TakeGeometry(acc, traj, i));
  CalibrationStats& st = acc.st;
  const ModelGeometry& geo = st.geometry;
  const int64_t heads = geo.HeadsPerSlot();
  GroupAcc& group = GroupOf(acc, traj, heads);
  const Offsets& off = acc.off;
  acc.pool.ParallelFor(heads, [&](int64_t h) {
    const int layer = static_cast<int>(h / geo.h_v), head = static_cast<int>(h % geo.h_v);
    ProcessHead(traj, layer, head, off, pass, acc.options,
                acc.candidates.empty() ? nullptr : &acc.candidates[h],
                group.sums.data() + h * off.stride);
  });
  const int64_t samples = traj.tokens / acc.options.sample_every;
  if (pass == 1) {
    group.samples_p1 += samples;
  } else {
    group.samples += samples;
    group.tokens += traj.tokens;
    st.samples += samples;
    st.tokens += traj.tokens;
    ++st.trajectories;
  }
  return absl::OkStatus();
}

// One pass over the trajectories of `source` in order; up to
// options.prefetch of them load concurrently ahead of the one in use.
absl::Status RunPass(Accumulator& acc, const TrajectorySource& source, int pass, int passes) {
  const CalibrationOptions& options = acc.options;
  // prefetch == 0: load in the calling thread when needed (deferred), so
  // loading never overlaps (or competes with) the statistics.
  const std::launch policy = options.prefetch > 0 ? std::launch::async : std::launch::deferred;
  auto load_async = [&](int i) {
    return std::async(policy, [&source, i] { return source.load(i); });
  };
  const int prefetch = std::max(1, options.prefetch);
  acc.seen_in_domain.clear();
  // Futures from std::async join on destruction, also on early returns.
  std::deque<std::future<absl::StatusOr<std::shared_ptr<const Trajectory>>>> ahead;
  int next_to_load = 0;
  for (int i = 0; i < source.count; ++i) {
    while (next_to_load < source.count && next_to_load < i + prefetch) {
      ahead.push_back(load_async(next_to_load++));
    }
    const Clock::time_point wait = Clock::now();
    absl::StatusOr<std::shared_ptr<const Trajectory>> loaded = ahead.front().get();
    ahead.pop_front();
    acc.load_seconds += Seconds(wait, Clock::now());
    if (!loaded.ok()) return loaded.status();
    RETURN_IF_ERROR(AddTrajectory(acc, **loaded, i, pass));
    if (options.progress) options.progress({pass - (2 - passes), passes, i + 1, source.count});
  }
  return absl::OkStatus();
}

// After pass 1: the damp-sr candidates of every head from its
// domain-balanced column RMS.
void ChooseSrCandidates(Accumulator& acc) {
  const CalibrationStats& st = acc.st;
  const int64_t heads = st.geometry.HeadsPerSlot();
  acc.candidates.resize(heads);
  std::vector<double> colsq;
  for (int64_t h = 0; h < heads; ++h) {
    BalancedMean(acc.groups, static_cast<int>(acc.domain_index.size()), Split::kAll, h,
                 acc.off.stride, acc.off.colsq, st.geometry.d_v, 1, false, &colsq);
    acc.candidates[h] = MakeCandidates(colsq, st.geometry.d_k, acc.options.sr_alphas);
  }
}

// The per-head statistics of every split: domain-balanced means of the
// groups' sums; the domain names and damp-sr candidate names.
void FinishStats(Accumulator& acc) {
  CalibrationStats& st = acc.st;
  const CalibrationOptions& options = acc.options;
  const std::vector<GroupAcc>& groups = acc.groups;
  const Offsets& off = acc.off;
  const ModelGeometry& geo = st.geometry;
  const int64_t heads = geo.HeadsPerSlot();
  const int num_domains = static_cast<int>(acc.domain_index.size());
  for (const auto& [name, idx] : acc.domain_index) st.domains.push_back(name);
  for (const GroupAcc& g : groups) st.has_second_half |= g.half == 1;
  if (options.damp_sr) {
    st.sr_candidate_names.push_back("identity");
    for (double alpha : options.sr_alphas) {
      st.sr_candidate_names.push_back(
          alpha == 0.0 ? std::string("sort") : absl::StrFormat("scale^%g+sort", alpha));
    }
    st.sr_candidates = std::move(acc.candidates);
  }
  const int C = off.candidates;
  for (int s = 0; s < 3; ++s) {
    st.heads[s].resize(heads);
    acc.pool.ParallelFor(heads, [&](int64_t h) {
      HeadStats& hs = st.heads[s][h];
      const Split split = static_cast<Split>(s);
      BalancedMean(groups, num_domains, split, h, off.stride, off.energy, geo.d_k, 2, false, &hs.energy);
      BalancedMean(groups, num_domains, split, h, off.stride, off.e_had, geo.d_k, 2, false, &hs.e_had);
      BalancedMean(groups, num_domains, split, h, off.stride, off.h_had, geo.d_k, 2, false, &hs.h_had);
      BalancedMean(groups, num_domains, split, h, off.stride, off.log_a, geo.d_k, 2, true, &hs.log_a);
      BalancedMean(groups, num_domains, split, h, off.stride, off.q2, geo.d_k, 2, true, &hs.q2);
      if (C > 0) {
        const int64_t n = int64_t{C} * geo.d_k;
        BalancedMean(groups, num_domains, split, h, off.stride, off.e_sr, n, 2, false, &hs.e_sr);
        BalancedMean(groups, num_domains, split, h, off.stride, off.h_sr, n, 2, false, &hs.h_sr);
        BalancedMean(groups, num_domains, split, h, off.stride, off.h16_sr, n, 2, false, &hs.h16_sr);
      }
    });
  }
}

}  // namespace

absl::StatusOr<CalibrationStats> Calibrate(const TrajectorySource& source,
                                           const CalibrationOptions& options) {
  RETURN_IF_ERROR(CheckCalibrateArgs(source, options));
  const Clock::time_point start = Clock::now();
  CalibrationStats st;
  st.options = options;
  st.options.progress = nullptr;
  st.threads = options.threads > 0 ? options.threads : ThreadPool::DefaultThreads();
  ThreadPool pool(st.threads);
  Accumulator acc(options, pool, st);
  const int passes = options.damp_sr ? 2 : 1;
  for (int pass = 3 - passes; pass <= 2; ++pass) {
    RETURN_IF_ERROR(RunPass(acc, source, pass, passes));
    if (pass == 1) ChooseSrCandidates(acc);
  }
  FinishStats(acc);
  const double total = Seconds(start, Clock::now());
  st.load_seconds = acc.load_seconds;
  st.compute_seconds = total - acc.load_seconds;
  return st;
}

}  // namespace statecache
