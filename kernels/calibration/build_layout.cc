#include "kernels/calibration/build_layout.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

uint64_t MixSeed(uint64_t seed, int64_t head_index) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(head_index) + 1;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  return x ^ (x >> 29);
}

// J(c) of the header for candidate c given its protected set.
double SrObjective(const HeadStats& h, int d_k, int c, const std::vector<int32_t>& hi) {
  std::vector<char> in_hi(d_k, 0);
  for (int32_t u : hi) in_hi[u] = 1;
  double j = 0.0;
  for (int u = 0; u < d_k; ++u) {
    const int64_t i = int64_t{c} * d_k + u;
    j += in_hi[u] ? h.h16_sr[i] : h.h_sr[i];
  }
  return j;
}

// The damp-sr candidate of one head for a request.
int ChooseSrCandidate(const CalibrationStats& stats, const LayoutRequest& request,
                      int64_t head_index) {
  const HeadStats& h = stats.heads[static_cast<int>(Split::kAll)][head_index];
  int best = 0;
  double best_j = 0.0;
  for (int c = 0; c < stats.num_sr_candidates(); ++c) {
    const std::vector<int32_t> hi =
        TopK(HeadScores(stats, request, head_index, c), request.format.k_hi);
    const double j = SrObjective(h, stats.geometry.d_k, c, hi);
    if (c == 0 || j < best_j) {
      best = c;
      best_j = j;
    }
  }
  return best;
}

}  // namespace

Selector DefaultSelector(StateFormat format) {
  return format == StateFormat::kDampSr ? Selector::kHorizon : Selector::kErrorPersistence;
}

std::vector<double> HeadScores(const CalibrationStats& stats, const LayoutRequest& request,
                               int64_t head_index, int sr_candidate) {
  ScoreOptions so;
  so.tau = request.tau;
  so.random_seed = MixSeed(request.random_seed, head_index);
  return ChannelScores(request.selector, stats.View(request.split, head_index, sr_candidate), so);
}

absl::StatusOr<BuiltLayout> BuildLayout(const CalibrationStats& stats,
                                        const LayoutRequest& request) {
  const ModelGeometry& geo = stats.geometry;
  RETURN_IF_ERROR(ValidateFormatSpec(request.format, geo.d_k));
  const StateFormat f = request.format.format;
  if (!IsMixedFormat(f)) {
    ASSIGN_OR_RETURN(StateLayout l, StateLayout::Identity(geo, request.format));
    return BuiltLayout{std::move(l), {}, {}, {}};
  }
  const bool sr = f == StateFormat::kDampSr;
  if (sr && stats.num_sr_candidates() == 0) {
    return absl::FailedPreconditionError(
        "damp-sr: the calibration ran without damp-sr statistics (CalibrationOptions.damp_sr)");
  }
  const int64_t heads = geo.HeadsPerSlot();
  std::vector<int32_t> key_perm(heads * geo.d_k), value_order, sr_choice, sr_choice_count;
  std::vector<float> value_scale, all_scores(heads * geo.d_k);
  if (sr) {
    value_order.resize(heads * geo.d_v);
    value_scale.resize(heads * geo.d_v);
    sr_choice.resize(heads);
    sr_choice_count.assign(stats.num_sr_candidates(), 0);
  }
  for (int64_t h = 0; h < heads; ++h) {
    int c = -1;
    if (sr) {
      c = ChooseSrCandidate(stats, request, h);
      sr_choice[h] = c;
      ++sr_choice_count[c];
      const SrCandidate& cand = stats.sr_candidates[h][c];
      std::copy(cand.order.begin(), cand.order.end(), value_order.begin() + h * geo.d_v);
      std::copy(cand.scale.begin(), cand.scale.end(), value_scale.begin() + h * geo.d_v);
    }
    const std::vector<double> scores = HeadScores(stats, request, h, c);
    for (int u = 0; u < geo.d_k; ++u) all_scores[h * geo.d_k + u] = static_cast<float>(scores[u]);
    const std::vector<int32_t> perm =
        StablePartitionPermutation(geo.d_k, TopK(scores, request.format.k_hi));
    std::copy(perm.begin(), perm.end(), key_perm.begin() + h * geo.d_k);
  }
  ASSIGN_OR_RETURN(StateLayout layout,
                   StateLayout::Create(geo, request.format, std::move(key_perm),
                                       std::move(value_order), std::move(value_scale)));
  return BuiltLayout{std::move(layout), std::move(all_scores), std::move(sr_choice),
                     std::move(sr_choice_count)};
}

absl::StatusOr<StabilityReport> ComputeStability(const CalibrationStats& stats,
                                                 const LayoutRequest& request, int top) {
  if (!stats.has_second_half) {
    return absl::FailedPreconditionError(
        "stability: needs two trajectories in at least one domain (two disjoint halves)");
  }
  const ModelGeometry& geo = stats.geometry;
  top = std::clamp(top, 1, geo.d_k);
  const bool sr = request.format.format == StateFormat::kDampSr;
  if (sr && stats.num_sr_candidates() == 0) {
    return absl::FailedPreconditionError("stability: no damp-sr statistics");
  }
  StabilityReport r;
  r.top = top;
  r.random_common = static_cast<double>(top) * top / geo.d_k;
  LayoutRequest a = request, b = request;
  a.split = Split::kFirstHalf;
  b.split = Split::kSecondHalf;
  LayoutRequest all = request;
  all.split = Split::kAll;
  for (int l = 0; l < geo.layers; ++l) {
    StabilityRow row;
    row.layer = l;
    for (int h = 0; h < geo.h_v; ++h) {
      const int64_t hi = stats.HeadIndex(l, h);
      const int c = sr ? ChooseSrCandidate(stats, all, hi) : -1;
      const std::vector<double> sa = HeadScores(stats, a, hi, c), sb = HeadScores(stats, b, hi, c);
      const int common = Intersection(TopK(sa, top), TopK(sb, top));
      row.common += common;
      row.spearman += SpearmanCorrelation(sa, sb);
    }
    row.common /= geo.h_v;
    row.spearman /= geo.h_v;
    row.overlap = row.common / top;
    r.overall.common += row.common / geo.layers;
    r.overall.spearman += row.spearman / geo.layers;
    r.layers.push_back(row);
  }
  r.overall.overlap = r.overall.common / top;
  return r;
}

}  // namespace statecache
