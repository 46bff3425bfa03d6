#include "kernels/trajectory/synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace statecache {

double SyntheticDecayQuantile(double u) {
  // Piecewise-linear in log(1 - a) through (0, 0.05), (0.1, 0.376),
  // (0.5, 0.967), (0.9, 0.9996), (1, 0.99999).
  static const double kU[] = {0.0, 0.1, 0.5, 0.9, 1.0};
  static const double kA[] = {0.05, 0.376, 0.967, 0.9996, 0.99999};
  u = std::clamp(u, 0.0, 1.0);
  int i = 0;
  while (i < 3 && u > kU[i + 1]) ++i;
  const double t = (u - kU[i]) / (kU[i + 1] - kU[i]);
  const double l = (1 - t) * std::log(1 - kA[i]) + t * std::log(1 - kA[i + 1]);
  return 1 - std::exp(l);
}

absl::StatusOr<Trajectory> MakeSyntheticTrajectory(const SyntheticOptions& o) {
  RETURN_IF_ERROR(o.geometry.Validate());
  if (o.tokens < 1) return absl::InvalidArgumentError(absl::StrCat("tokens: ", o.tokens, " < 1"));
  const ModelGeometry& geo = o.geometry;
  Trajectory traj;
  traj.geometry = geo;
  traj.tokens = o.tokens;
  traj.domain = o.domain;
  traj.source = "synthetic";
  std::mt19937_64 model_rng(o.seed_layout);
  std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ULL + 1);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  for (int l = 0; l < geo.layers; ++l) {
    // Per-layer "model" structure.
    std::vector<float> key_gain(int64_t{geo.h_qk} * geo.d_k, 1.0f);
    for (int h = 0; h < geo.h_qk; ++h) {
      for (int i = 0; i < std::min(o.outlier_key_channels, geo.d_k); ++i) {
        key_gain[int64_t{h} * geo.d_k + model_rng() % geo.d_k] = o.outlier_key_gain;
      }
    }
    std::vector<float> value_gain(int64_t{geo.h_v} * geo.d_v, 1.0f);
    for (int h = 0; h < geo.h_v; ++h) {
      for (int i = 0; i < std::min(o.outlier_value_channels, geo.d_v); ++i) {
        value_gain[int64_t{h} * geo.d_v + model_rng() % geo.d_v] = o.outlier_value_gain;
      }
    }
    const int gw = geo.GateWidth();
    std::vector<double> log_decay(int64_t{geo.h_v} * gw);
    for (double& d : log_decay) {
      d = std::log(SyntheticDecayQuantile(std::uniform_real_distribution<double>(0, 1)(model_rng)));
    }

    LayerInputs& in = traj.layers.emplace_back();
    in.q.resize(int64_t{o.tokens} * geo.h_qk * geo.d_k);
    in.k.resize(in.q.size());
    in.v.resize(int64_t{o.tokens} * geo.h_v * geo.d_v);
    in.g.resize(int64_t{o.tokens} * geo.h_v * gw);
    in.beta.resize(int64_t{o.tokens} * geo.h_v);
    for (int t = 0; t < o.tokens; ++t) {
      for (int h = 0; h < geo.h_qk; ++h) {
        for (float* x : {&in.q[(int64_t{t} * geo.h_qk + h) * geo.d_k],
                         &in.k[(int64_t{t} * geo.h_qk + h) * geo.d_k]}) {
          double norm = 0;
          for (int i = 0; i < geo.d_k; ++i) {
            x[i] = n01(rng) * key_gain[int64_t{h} * geo.d_k + i];
            norm += double{x[i]} * x[i];
          }
          const float inv = static_cast<float>(1.0 / std::sqrt(norm + 1e-6));
          for (int i = 0; i < geo.d_k; ++i) x[i] *= inv;
        }
      }
      for (int h = 0; h < geo.h_v; ++h) {
        const int64_t th = int64_t{t} * geo.h_v + h;
        for (int j = 0; j < geo.d_v; ++j) {
          in.v[th * geo.d_v + j] = n01(rng) * value_gain[int64_t{h} * geo.d_v + j];
        }
        for (int i = 0; i < gw; ++i) {
          const double jitter = 1.0 + 0.1 * n01(rng);
          in.g[th * gw + i] = static_cast<float>(std::min(0.0, log_decay[int64_t{h} * gw + i] * jitter));
        }
        in.beta[th] = 1.0f / (1.0f + std::exp(-n01(rng)));
      }
    }
  }
  return traj;
}

}  // namespace statecache
