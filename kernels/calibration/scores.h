// Key-channel scoring and selection math of DAMP calibration (DESIGN.md
// section 4; seed 000 eq. 8-10 and appendix A.4; seed 001 eq. 15).
//
// Everything here is pure and per (layer, head): given the domain-balanced
// channel statistics of one head it ranks key channels, picks the top K_hi
// and builds the stable-partition permutation that puts them first.
//
//   std::vector<double> c = ChannelScores(Selector::kErrorPersistence, in, opts);
//   std::vector<int32_t> hi = TopK(c, 16);
//   std::vector<int32_t> perm = StablePartitionPermutation(128, hi);
#ifndef STATECACHE_KERNELS_CALIBRATION_SCORES_H_
#define STATECACHE_KERNELS_CALIBRATION_SCORES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace statecache {

// Which statistic ranks key channels.
enum class Selector : uint8_t {
  kRandom = 0,            // uniform (seeded per layer/head): the floor
  kEnergy = 1,            // state energy E[||S_u||^2]
  kError = 2,             // E_u only
  kPersistence = 3,       // P_u only (degenerate within a GDN head)
  kErrorPersistence = 4,  // C_u = E_u * P_u (seed 000, DAMP's default)
  kHorizon = 5,           // C_u = E[e_u (1 + sum_j prod_r a^2)], H steps (seed 001)
  // Not in the seeds: E_u * P_u * E[q_u^2], the readout-weighted risk. The
  // output error of channel u is q_u * dS_u, so its expected energy is
  // E[q_u^2] E||dS_u||^2 under independence; E*P ignores how much the
  // readout looks at the channel.
  kReadout = 6,
};
inline constexpr int kNumSelectors = 7;

// "random", "energy", "e", "p", "ep", "horizon", "epq".
const char* SelectorName(Selector s);
// Parses the names above; kInvalidArgument naming the text otherwise.
absl::StatusOr<Selector> ParseSelector(absl::string_view name);
std::vector<Selector> AllSelectors();

// Seed 000 eq. 9: P = 1 / max(1 - a_eff^2, tau).
double Persistence(double a_eff, double tau);

// Domain-balanced means for one head, each [d_k].
struct ChannelStatsView {
  const double* energy = nullptr;   // E[||S_u||^2]
  const double* error = nullptr;    // E_u = E[e_u] of the deployed Q_lo
  const double* horizon = nullptr;  // E[e_u W_u], W_u = 1 + sum_{j<=H} prod_{r<=j} a_{t+r,u}^2
  const double* log_a = nullptr;    // E[log a_u]; a_eff = exp(log_a)
  const double* q2 = nullptr;       // E[q_u^2] of the (unscaled) query; kReadout only
  int d_k = 0;
};

struct ScoreOptions {
  double tau = 1e-4;
  // Seed of the random selector (combined with layer and head by the caller).
  uint64_t random_seed = 0;
};

// Scores of every key channel; larger = more worth protecting.
std::vector<double> ChannelScores(Selector selector, const ChannelStatsView& stats,
                                  const ScoreOptions& options);

// Indices of the k largest scores, largest first; ties go to the lower
// index. k is clamped to [0, n].
std::vector<int32_t> TopK(const std::vector<double>& scores, int k);

// The permutation (stored row r holds key channel perm[r]) that places
// `selected` first and the rest after it, each part in increasing channel
// order (a stable partition of 0..n-1). `selected` must be distinct indices
// in [0, n) (unchecked beyond a debug assert).
std::vector<int32_t> StablePartitionPermutation(int n, const std::vector<int32_t>& selected);

// Spearman rank correlation with average ranks for ties; 0 when either side
// is constant or n < 2.
double SpearmanCorrelation(const std::vector<double>& a, const std::vector<double>& b);

// |A ∩ B| of two index sets.
int Intersection(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CALIBRATION_SCORES_H_
