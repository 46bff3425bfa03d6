// STEPQuant calibration (seed 002 sections 3-4, appendix C/D; issue 9):
// lifetime-aware bit allocation, FP16 pivots and row-impact factors, from
// recorded (or synthetic) trajectories, into a StateLayout.
//
// Statistics, from an FP32 replay of every trajectory (natural channel order):
//  - units u: whole heads (GDN) or key rows (KDA), n_u state values each;
//  - d_u(b): mean squared reconstruction error of unit u when the head is
//    coded at a uniform width b by the deployed codec (stepquant_codec.h),
//    over FP32 states sampled every `sample_every` tokens, for each
//    candidate width b;
//  - l_u = E[log r_{t,u}] (r = alpha_t for GDN, d_{t,i} for KDA key row i),
//    i.e. the mean of g over tokens;
//  - lifetime weight L_u = sum_{j=0}^{H-1} exp(2 j l_u) (squared error
//    decaying by exp(2 l_u) per step, over H future steps; H = 16 by
//    default, the seed's 256 with options.horizon);
//  - risk (options.risk_weight, default kReadout): the seed's L_u d_u(b)
//    (kLifetime), or the readout error it causes relative to its head's FP32
//    readout energy, L_u sum_{i in u} omega_i d_i(b) / E||o_h||^2 (kReadout):
//    the model RMS-normalizes every head's readout, so absolute state error
//    compared across heads and layers starves small heads;
//  - row impact omega_i = E[(A_t^T q_t)_i^2] with A_t = (I - beta k k^T) D_t,
//    so g_t = D_t (q_t - beta_t k_t (k_t . q_t)); w_i = (omega_i / max_head
//    omega)^(1/8), floored at min_row_impact (seed 002 appendix B: w ~
//    omega^(1/8), normalized per head).
// Allocation:
//  - pivots: the round(pivot_fraction * units) units of largest risk at
//    b_max (the error that remains at the widest integer code) are
//    stored in FP16 and counted as b_max = 8-bit units in the nominal budget
//    (seed 002 appendix D's convention);
//  - the other units get widths from the format's candidates minimizing
//    sum_u risk_u(b_u) subject to sum_u n_u b_u <= bbar N - 8 N_piv: a
//    greedy over each unit's lower convex hull of (b, risk_u(b)), best
//    distortion decrease per bit first (ties by unit index), which is exact
//    for convex hulls up to the last partial step.
// Layout: KDA key_perm puts each head's pivots first, then rows by decreasing
// width (stable by channel); GDN keeps the identity (one width per head).
//
//   StepQuantOptions opts;
//   ASSIGN_OR_RETURN(StepQuantCalibration cal,
//                    CalibrateStepQuant(trajectories, {StateFormat::kStepQuant6, 0}, opts));
//   RETURN_IF_ERROR(WriteLayoutFile(cal.layout, cal.Info(), {}, path));
#ifndef STATECACHE_KERNELS_STEPQUANT_CALIBRATION_H_
#define STATECACHE_KERNELS_STEPQUANT_CALIBRATION_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"
#include "kernels/trajectory/trajectory.h"

namespace statecache {

struct StepQuantOptions {
  // H of the lifetime weight. Seed 002 uses 256; 16 (with kReadout) measured
  // better on the shipped models (kernels/stepquant/README.md, "KDA at 4
  // bits"): requantizing every step does not add independent errors over a
  // row's whole lifetime.
  int horizon = 16;
  int sample_every = 8;     // state samples for d_u(b)
  // Fraction of units kept as FP16 pivots; < 0 = seed 002's: GDN 32 of 2,304
  // heads, KDA 512 of 81,920 key rows.
  double pivot_fraction = -1.0;
  float min_row_impact = 1.0f / 64;
  // false: w_i = 1 (ablation "temporal only" / no row impact).
  bool use_row_impact = true;
  // false: every unit at the nominal width, no pivots ("spatial only").
  bool allocate = true;
  // Candidate widths (ascending, 2..8); empty = StepQuantCandidateBits (kernels/formats/format.h).
  std::vector<int> candidates;
  // What the allocation and the pivot choice minimize (see RiskWeight).
  enum class RiskWeight {
    // Seed 002: L_u d_u(b), absolute squared state error, compared across
    // the whole model.
    kLifetime,
    // L_u d_u(b) / E||o_h||^2: the same error relative to its head's FP32
    // readout energy (each head's readout is RMS-normalized by the model,
    // so a small head's relative error matters as much as a large one's).
    kHeadRelative,
    // L_u sum_{i in u} omega_i d_i(b) / E||o_h||^2: the readout error
    // (o = S^T q, row i weighted by omega_i = E[(A^T q)_i^2]) relative to
    // the head's readout energy.
    kReadout,
  };
  // Default kReadout (not the seed's kLifetime): see README.md "KDA at 4 bits".
  RiskWeight risk_weight = RiskWeight::kReadout;
};

// "lifetime", "head-relative", "readout" (kInvalidArgument otherwise).
absl::StatusOr<StepQuantOptions::RiskWeight> ParseRiskWeight(const std::string& name);

// The default pivot fraction of seed 002 for an architecture.
double DefaultPivotFraction(Arch arch);

// One allocation problem (exposed for tests): units with n_u values, weighted
// distortion wd[u][c] = L_u d_u(candidates[c]) and risk[u].
struct AllocationProblem {
  std::vector<int> candidates;                 // ascending code widths
  std::vector<int64_t> unit_values;            // n_u
  std::vector<std::vector<double>> weighted;   // [units][candidates]
  std::vector<double> risk;                    // [units]
  int nominal_bits = 6;
  int num_pivots = 0;
};

// Widths per unit (16 = pivot). kInvalidArgument for inconsistent sizes,
// unsorted candidates, or a budget the narrowest candidate does not fit.
absl::StatusOr<std::vector<int>> AllocateBits(const AllocationProblem& problem);

struct StepQuantCalibration {
  StateLayout layout;
  // Per unit (GDN: [layers * h_v]; KDA: [layers * h_v * d_k], natural
  // channel order): the statistics and the chosen width (16 = pivot).
  std::vector<double> mean_log_retention;
  std::vector<double> lifetime_weight;
  std::vector<std::vector<double>> distortion;  // [units][candidates]
  std::vector<int> unit_bits;
  // [layers * h_v * d_k], natural channel order.
  std::vector<double> row_impact_score;  // omega_i
  std::vector<int> candidates;
  int num_pivots = 0;
  int64_t state_samples = 0;
  // Nominal code bits per value: (sum n_u b_u + 8 N_piv) / N (<= bbar).
  double nominal_code_bits = 0;

  // Provenance for the layout file ("stepquant.*" keys).
  std::map<std::string, std::string> Info() const;
};

// kInvalidArgument: no trajectories, mixed geometries, a format that is not
// stepquant-*, or bad options.
absl::StatusOr<StepQuantCalibration> CalibrateStepQuant(const std::vector<Trajectory>& trajectories,
                                                        const FormatSpec& format,
                                                        const StepQuantOptions& options);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_STEPQUANT_CALIBRATION_H_
