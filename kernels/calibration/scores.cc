#include "kernels/calibration/scores.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

namespace statecache {

const char* SelectorName(Selector s) {
  switch (s) {
    case Selector::kRandom: return "random";
    case Selector::kEnergy: return "energy";
    case Selector::kError: return "e";
    case Selector::kPersistence: return "p";
    case Selector::kErrorPersistence: return "ep";
    case Selector::kHorizon: return "horizon";
    case Selector::kReadout: return "epq";
  }
  return "?";
}

absl::StatusOr<Selector> ParseSelector(absl::string_view name) {
  for (Selector s : AllSelectors()) {
    if (name == SelectorName(s)) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "selector: unknown '", name, "' (expected random, energy, e, p, ep, horizon or epq)"));
}

std::vector<Selector> AllSelectors() {
  return {Selector::kRandom,           Selector::kEnergy,  Selector::kError,
          Selector::kPersistence,      Selector::kErrorPersistence,
          Selector::kHorizon,          Selector::kReadout};
}

double Persistence(double a_eff, double tau) { return 1.0 / std::max(1.0 - a_eff * a_eff, tau); }

std::vector<double> ChannelScores(Selector selector, const ChannelStatsView& st,
                                  const ScoreOptions& options) {
  std::vector<double> c(st.d_k, 0.0);
  if (selector == Selector::kRandom) {
    std::mt19937_64 rng(options.random_seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (double& x : c) x = u(rng);
    return c;
  }
  for (int i = 0; i < st.d_k; ++i) {
    const double p = Persistence(std::exp(st.log_a[i]), options.tau);
    switch (selector) {
      case Selector::kEnergy: c[i] = st.energy[i]; break;
      case Selector::kError: c[i] = st.error[i]; break;
      case Selector::kPersistence: c[i] = p; break;
      case Selector::kErrorPersistence: c[i] = st.error[i] * p; break;
      case Selector::kHorizon: c[i] = st.horizon[i]; break;
      case Selector::kReadout: c[i] = st.error[i] * p * st.q2[i]; break;
      case Selector::kRandom: break;
    }
  }
  return c;
}

std::vector<int32_t> TopK(const std::vector<double>& scores, int k) {
  const int n = static_cast<int>(scores.size());
  k = std::clamp(k, 0, n);
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  idx.resize(k);
  return idx;
}

std::vector<int32_t> StablePartitionPermutation(int n, const std::vector<int32_t>& selected) {
  std::vector<char> hi(n, 0);
  for (int32_t s : selected) {
    assert(s >= 0 && s < n && !hi[s]);
    hi[s] = 1;
  }
  std::vector<int32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_partition(perm.begin(), perm.end(), [&](int32_t u) { return hi[u] != 0; });
  return perm;
}

namespace {

std::vector<double> AverageRanks(const std::vector<double>& x) {
  const int n = static_cast<int>(x.size());
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return x[a] < x[b]; });
  std::vector<double> rank(n);
  for (int i = 0; i < n;) {
    int j = i;
    while (j + 1 < n && x[idx[j + 1]] == x[idx[i]]) ++j;
    const double r = 0.5 * (i + j);
    for (int m = i; m <= j; ++m) rank[idx[m]] = r;
    i = j + 1;
  }
  return rank;
}

}  // namespace

double SpearmanCorrelation(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = std::min(a.size(), b.size());
  if (n < 2) return 0.0;
  const std::vector<double> ra = AverageRanks(a), rb = AverageRanks(b);
  const double mean = 0.5 * (n - 1);
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < n; ++i) {
    sab += (ra[i] - mean) * (rb[i] - mean);
    saa += (ra[i] - mean) * (ra[i] - mean);
    sbb += (rb[i] - mean) * (rb[i] - mean);
  }
  if (saa <= 0 || sbb <= 0) return 0.0;
  return sab / std::sqrt(saa * sbb);
}

int Intersection(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  int n = 0;
  for (int32_t x : a) n += std::count(b.begin(), b.end(), x) > 0;
  return n;
}

}  // namespace statecache
