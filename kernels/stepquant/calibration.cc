#include "kernels/stepquant/calibration.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/common/status_macros.h"
#include "kernels/cpu/head_step.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/formats/stepquant_codec.h"

namespace statecache {
namespace {

// Statistics of one (layer, value head), natural channel order.
struct HeadAccum {
  std::vector<double> omega;     // [d_k] sum of g_i^2
  std::vector<double> log_ret;   // [d_k] (KDA) or [1] (GDN): sum of g
  std::vector<double> row_err;   // [candidates][d_k] sum of squared errors
  double out_energy = 0;         // sum over tokens of ||o||^2 (FP32 readout)
  int64_t tokens = 0;
  int64_t samples = 0;
};

void AccumulateHead(const Trajectory& traj, int layer, int h, const std::vector<int>& candidates,
                    int sample_every, HeadAccum& acc) {
  const ModelGeometry& geo = traj.geometry;
  const int d_k = geo.d_k, d_v = geo.d_v;
  const int kh = geo.KeyHeadOf(h);
  const LayerInputs& in = traj.layers[layer];
  std::vector<float> w(static_cast<size_t>(d_k) * d_v, 0.0f), back(w.size());
  std::vector<float> q(d_k), k(d_k), g(d_k), o(d_v), scratch(d_v);
  std::vector<StepHeadLayout> layouts;
  for (int b : candidates) layouts.push_back(MakeUniformStepHeadLayout(d_k, d_v, b));
  std::vector<uint8_t> head(layouts.empty() ? 0 : layouts.back().head_bytes);
  const float scale = geo.EffectiveScale();
  for (int t = 0; t < traj.tokens; ++t) {
    const float* qt = in.q.data() + (int64_t{t} * geo.h_qk + kh) * d_k;
    const float* kt = in.k.data() + (int64_t{t} * geo.h_qk + kh) * d_k;
    const float* gt = in.g.data() + (int64_t{t} * geo.h_v + h) * geo.GateWidth();
    const float beta = in.beta[int64_t{t} * geo.h_v + h];
    double kq = 0;
    for (int i = 0; i < d_k; ++i) kq += double{kt[i]} * qt[i];
    for (int i = 0; i < d_k; ++i) {
      const double gi = geo.arch == Arch::kKda ? gt[i] : gt[0];
      const double row = std::exp(gi) * (qt[i] - beta * kt[i] * kq);
      acc.omega[i] += row * row;
      if (geo.arch == Arch::kKda) acc.log_ret[i] += gi;
      q[i] = scale * qt[i];
      k[i] = kt[i];
      g[i] = gt[geo.arch == Arch::kKda ? i : 0];
    }
    if (geo.arch == Arch::kGdn) acc.log_ret[0] += gt[0];
    ++acc.tokens;
    const HeadStepInputs step{q.data(), k.data(), g.data(), beta,
                              in.v.data() + (int64_t{t} * geo.h_v + h) * d_v};
    HeadStep(geo.arch, d_k, d_v, step, w.data(), o.data(), scratch.data());
    for (int j = 0; j < d_v; ++j) acc.out_energy += double{o[j]} * o[j];
    if ((t + 1) % sample_every != 0) continue;
    ++acc.samples;
    for (size_t c = 0; c < layouts.size(); ++c) {
      StepEncodeHead(layouts[c], nullptr, w.data(), head.data());
      StepDecodeHead(layouts[c], head.data(), back.data());
      for (int i = 0; i < d_k; ++i) {
        double e = 0;
        for (int j = 0; j < d_v; ++j) {
          const double d = double{back[i * d_v + j]} - w[i * d_v + j];
          e += d * d;
        }
        acc.row_err[c * d_k + i] += e;
      }
    }
  }
}

double LifetimeWeight(double mean_log_retention, int horizon) {
  const double l = std::min(mean_log_retention, 0.0);
  const double r = std::exp(2.0 * l);
  if (1.0 - r < 1e-12) return horizon;
  return (1.0 - std::pow(r, horizon)) / (1.0 - r);
}

}  // namespace

absl::StatusOr<StepQuantOptions::RiskWeight> ParseRiskWeight(const std::string& name) {
  using W = StepQuantOptions::RiskWeight;
  if (name == "lifetime") return W::kLifetime;
  if (name == "head-relative") return W::kHeadRelative;
  if (name == "readout") return W::kReadout;
  return absl::InvalidArgumentError(
      absl::StrCat("risk_weight: '", name, "' is not lifetime, head-relative or readout"));
}

double DefaultPivotFraction(Arch arch) {
  return arch == Arch::kGdn ? 32.0 / 2304.0 : 512.0 / 81920.0;
}

absl::StatusOr<std::vector<int>> AllocateBits(const AllocationProblem& p) {
  const size_t units = p.unit_values.size();
  const size_t nc = p.candidates.size();
  if (nc == 0) return absl::InvalidArgumentError("candidates: empty");
  for (size_t c = 0; c < nc; ++c) {
    if (!IsValidStepBits(p.candidates[c]) || p.candidates[c] == kStepPivotBits ||
        (c > 0 && p.candidates[c] <= p.candidates[c - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "candidates: ", absl::StrJoin(p.candidates, ","), " must be ascending widths in 2..8"));
    }
  }
  if (p.weighted.size() != units || p.risk.size() != units) {
    return absl::InvalidArgumentError(absl::StrCat("weighted/risk: sizes ", p.weighted.size(), "/",
                                                   p.risk.size(), " != units ", units));
  }
  for (size_t u = 0; u < units; ++u) {
    if (p.weighted[u].size() != nc) {
      return absl::InvalidArgumentError(absl::StrCat("weighted: unit ", u, " has ",
                                                     p.weighted[u].size(), " entries, want ", nc));
    }
  }
  if (p.num_pivots < 0 || static_cast<size_t>(p.num_pivots) > units) {
    return absl::InvalidArgumentError(absl::StrCat("num_pivots: ", p.num_pivots, " not in 0..", units));
  }
  std::vector<int> bits(units, p.candidates[0]);
  std::vector<size_t> order(units);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return p.risk[a] > p.risk[b]; });
  double total_values = 0, pivot_values = 0;
  for (size_t u = 0; u < units; ++u) total_values += static_cast<double>(p.unit_values[u]);
  for (int i = 0; i < p.num_pivots; ++i) {
    bits[order[i]] = kStepPivotBits;
    pivot_values += static_cast<double>(p.unit_values[order[i]]);
  }
  const double budget = p.nominal_bits * total_values - 8.0 * pivot_values;
  double cost = 0;
  for (size_t u = 0; u < units; ++u) {
    if (bits[u] != kStepPivotBits) cost += static_cast<double>(p.unit_values[u]) * p.candidates[0];
  }
  if (cost > budget) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget: ", p.nominal_bits, " bits/value with ", p.num_pivots,
        " pivots does not fit every unit at ", p.candidates[0], " bits"));
  }
  // Greedy over each unit's lower convex hull: the next hull point from
  // candidate index c is the j > c of largest distortion drop per bit.
  std::vector<size_t> at(units, 0);
  auto next_step = [&](size_t u, size_t c, size_t* next) -> double {
    double best = 0;
    *next = c;
    for (size_t j = c + 1; j < nc; ++j) {
      const double gain = (p.weighted[u][c] - p.weighted[u][j]) /
                          (static_cast<double>(p.unit_values[u]) * (p.candidates[j] - p.candidates[c]));
      if (gain > best) {
        best = gain;
        *next = j;
      }
    }
    return best;
  };
  // (gain, -unit, next candidate): largest gain first, then lowest unit.
  std::priority_queue<std::tuple<double, int64_t, size_t>> heap;
  for (size_t u = 0; u < units; ++u) {
    if (bits[u] == kStepPivotBits) continue;
    size_t next;
    const double gain = next_step(u, 0, &next);
    if (gain > 0) heap.emplace(gain, -static_cast<int64_t>(u), next);
  }
  while (!heap.empty()) {
    const auto [gain, neg_u, next] = heap.top();
    heap.pop();
    const size_t u = static_cast<size_t>(-neg_u);
    const double extra =
        static_cast<double>(p.unit_values[u]) * (p.candidates[next] - p.candidates[at[u]]);
    if (cost + extra > budget) continue;
    cost += extra;
    at[u] = next;
    bits[u] = p.candidates[next];
    size_t after;
    const double g = next_step(u, next, &after);
    if (g > 0) heap.emplace(g, neg_u, after);
  }
  return bits;
}

std::map<std::string, std::string> StepQuantCalibration::Info() const {
  return {{"stepquant.candidates", absl::StrJoin(candidates, ",")},
          {"stepquant.pivots", absl::StrCat(num_pivots)},
          {"stepquant.nominal_code_bits", absl::StrFormat("%.6f", nominal_code_bits)},
          {"stepquant.payload_bits", absl::StrFormat("%.6f", layout.PayloadBitsPerValue())},
          {"stepquant.state_samples", absl::StrCat(state_samples)}};
}

absl::StatusOr<StepQuantCalibration> CalibrateStepQuant(const std::vector<Trajectory>& trajectories,
                                                        const FormatSpec& format,
                                                        const StepQuantOptions& options) {
  if (!IsStepQuantFormat(format.format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("format: ", FormatSpecName(format), " is not stepquant-6 / stepquant-4"));
  }
  if (trajectories.empty()) return absl::InvalidArgumentError("trajectories: none given");
  if (options.horizon < 1 || options.sample_every < 1 || options.pivot_fraction > 1.0 ||
      !(options.min_row_impact > 0.0f) || options.min_row_impact > 1.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options: horizon ", options.horizon, " and sample_every ", options.sample_every,
        " must be >= 1, pivot_fraction <= 1, min_row_impact in (0, 1]"));
  }
  const ModelGeometry geo = trajectories[0].geometry;
  for (const Trajectory& t : trajectories) {
    RETURN_IF_ERROR(t.Validate());
    if (t.geometry != geo) {
      return absl::InvalidArgumentError(absl::StrCat("trajectories: geometry ",
                                                     t.geometry.DebugString(), " differs from ",
                                                     geo.DebugString()));
    }
  }
  if (geo.d_k > kStepMaxDim || geo.d_v > kStepMaxDim) {
    return absl::InvalidArgumentError("geometry: d_k, d_v must be <= 256");
  }
  // StateLayout has no default state: start from the uncalibrated layout.
  ASSIGN_OR_RETURN(StateLayout uncalibrated, StateLayout::Identity(geo, format));
  StepQuantCalibration cal{std::move(uncalibrated)};
  cal.candidates = options.candidates.empty() ? StepQuantCandidateBits(format.format)
                                              : options.candidates;
  const int nc = static_cast<int>(cal.candidates.size());
  const int64_t heads = geo.HeadsPerSlot();
  const int d_k = geo.d_k, d_v = geo.d_v;
  std::vector<HeadAccum> acc(heads);
  for (HeadAccum& a : acc) {
    a.omega.assign(d_k, 0.0);
    a.log_ret.assign(geo.arch == Arch::kKda ? d_k : 1, 0.0);
    a.row_err.assign(static_cast<size_t>(nc) * d_k, 0.0);
  }
  ThreadPool pool(ThreadPool::DefaultThreads());
  for (const Trajectory& t : trajectories) {
    pool.ParallelFor(heads, [&](int64_t item) {
      AccumulateHead(t, static_cast<int>(item / geo.h_v), static_cast<int>(item % geo.h_v),
                     cal.candidates, options.sample_every, acc[item]);
    });
  }
  cal.state_samples = acc[0].samples;
  if (cal.state_samples == 0) {
    return absl::InvalidArgumentError(absl::StrCat("trajectories: no state sample (every ",
                                                   options.sample_every, " tokens)"));
  }
  // Units and their statistics.
  const bool kda = geo.arch == Arch::kKda;
  const int64_t units = kda ? heads * d_k : heads;
  AllocationProblem prob;
  prob.candidates = cal.candidates;
  prob.nominal_bits = StepQuantNominalBits(format.format);
  cal.mean_log_retention.resize(units);
  cal.lifetime_weight.resize(units);
  cal.distortion.assign(units, std::vector<double>(nc, 0.0));
  prob.unit_values.resize(units);
  prob.weighted.resize(units);
  prob.risk.resize(units);
  for (int64_t u = 0; u < units; ++u) {
    const HeadAccum& a = acc[kda ? u / d_k : u];
    const int row = kda ? static_cast<int>(u % d_k) : 0;
    cal.mean_log_retention[u] = a.log_ret[row] / static_cast<double>(a.tokens);
    cal.lifetime_weight[u] = LifetimeWeight(cal.mean_log_retention[u], options.horizon);
    // Readout-relative weighting (RiskWeight): per-row omega factors and the
    // head's mean readout energy (1 for the seed's kLifetime).
    const bool readout = options.risk_weight == StepQuantOptions::RiskWeight::kReadout;
    const double out_energy = a.out_energy / static_cast<double>(a.tokens);
    const double head_scale =
        options.risk_weight == StepQuantOptions::RiskWeight::kLifetime
            ? 1.0
            : 1.0 / std::max(out_energy, 1e-30);
    auto row_factor = [&](int i) {
      return readout ? a.omega[i] / static_cast<double>(a.tokens) : 1.0;
    };
    prob.weighted[u].resize(nc);
    for (int c = 0; c < nc; ++c) {
      double d = 0, wd = 0;
      if (kda) {
        d = a.row_err[c * d_k + row];
        wd = row_factor(row) * d;
      } else {
        for (int i = 0; i < d_k; ++i) {
          d += a.row_err[c * d_k + i];
          wd += row_factor(i) * a.row_err[c * d_k + i];
        }
      }
      cal.distortion[u][c] = d / static_cast<double>(a.samples);
      prob.weighted[u][c] =
          cal.lifetime_weight[u] * head_scale * wd / static_cast<double>(a.samples);
    }
    prob.unit_values[u] = kda ? d_v : int64_t{d_k} * d_v;
    prob.risk[u] = prob.weighted[u][nc - 1];
  }
  const double frac =
      options.pivot_fraction >= 0 ? options.pivot_fraction : DefaultPivotFraction(geo.arch);
  cal.num_pivots = options.allocate ? static_cast<int>(std::lround(frac * units)) : 0;
  prob.num_pivots = cal.num_pivots;
  if (options.allocate) {
    ASSIGN_OR_RETURN(cal.unit_bits, AllocateBits(prob));
  } else {
    cal.unit_bits.assign(units, prob.nominal_bits);
  }
  double code_bits = 0;
  for (int64_t u = 0; u < units; ++u) {
    const int b = cal.unit_bits[u] == kStepPivotBits ? 8 : cal.unit_bits[u];
    code_bits += static_cast<double>(prob.unit_values[u]) * b;
  }
  cal.nominal_code_bits = code_bits / (static_cast<double>(heads) * d_k * d_v);
  // Row impact (natural order) and the layout maps (stored order).
  cal.row_impact_score.resize(heads * d_k);
  std::vector<int32_t> key_perm(heads * d_k);
  std::vector<int8_t> row_bits(heads * d_k);
  std::vector<float> row_impact(heads * d_k);
  for (int64_t hi = 0; hi < heads; ++hi) {
    const HeadAccum& a = acc[hi];
    double mx = 0;
    for (int i = 0; i < d_k; ++i) {
      cal.row_impact_score[hi * d_k + i] = a.omega[i] / static_cast<double>(a.tokens);
      mx = std::max(mx, a.omega[i]);
    }
    std::vector<int> ch_bits(d_k);
    for (int i = 0; i < d_k; ++i) ch_bits[i] = cal.unit_bits[kda ? hi * d_k + i : hi];
    int32_t* perm = key_perm.data() + hi * d_k;
    std::iota(perm, perm + d_k, 0);
    std::stable_sort(perm, perm + d_k, [&](int32_t a2, int32_t b2) { return ch_bits[a2] > ch_bits[b2]; });
    for (int r = 0; r < d_k; ++r) {
      const int c = perm[r];
      row_bits[hi * d_k + r] = static_cast<int8_t>(ch_bits[c]);
      float w = 1.0f;
      if (options.use_row_impact && mx > 0) {
        w = static_cast<float>(std::pow(a.omega[c] / mx, 1.0 / 8.0));
        w = std::min(1.0f, std::max(w, options.min_row_impact));
      }
      row_impact[hi * d_k + r] = w;
    }
  }
  ASSIGN_OR_RETURN(cal.layout, StateLayout::CreateStepQuant(geo, format, std::move(key_perm),
                                                            std::move(row_bits),
                                                            std::move(row_impact)));
  return cal;
}

}  // namespace statecache
