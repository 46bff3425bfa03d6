// The magnitude bound on states that enter the store, shared by the CPU
// backend, the CUDA validation kernel and the server edge.
//
// Every FP32 state value accepted from outside (PackStates, i.e. Prefill of
// states; the decoded values of an Import) is finite with |x| <= 2^64
// (IsAcceptedStateValue); anything else is kInvalidArgument naming the field.
//
//   if (!IsAcceptedStateValue(x)) return InvalidArgument("states[i]: ...");
//
// Why 2^64 (B below): the recurrence must not overflow FP32 (max ~2^128) on
// an accepted state under the edge's input contract: q, k rows L2-normalized
// (||k||, ||q|| <= 1.01, the edge's rounding tolerance), beta in [0, 2],
// g <= 0 (decay a = exp(g) in (0, 1]), |v| <= 65504, d_k <= 256, and
// ModelGeometry's readout scale <= kMaxReadoutScale = 2^16. For one column
// s (d_k values, each |s_r| <= B, so ||s||_2 <= 16 B) one step computes
//   u = k . (a s)         every partial sum <= ||k|| ||s||          <= 2^4.1 B
//   d = beta (v_j - u)                       <= 2 (65504 + |u|)     <= 2^5.1 B
//   s' = a s + k d        per value          <= B + 1.01 |d|        <= 2^5.2 B
//   o_j = qs . (a s) + (qs . k) d, qs = scale q (the CUDA kernel's order; the
//         CPU's qs . s' is bounded by ||qs|| ||s'|| with ||s'|| <= 1.05 ||s|| +
//         2^17, since |1 - beta ||k||^2| <= 1.05)
//                                            <= 2^16 (2^4.1 + 2^5.1) B <= 2^21.7 B
// so every intermediate of a step stays below 2^86 << 2^128, and the
// quantizers' arithmetic on s' (group ranges, Hadamard sums of 32 values,
// FP32 group / global scales, STEPQuant's least-squares sums over <= 256
// rows with FP16 row scales: <= 2^8 2^16 2^69.2) stays below 2^94.
// B is 2^48 times the largest |v|: realistic states (the delta rule replaces
// a state's k-component by v, so they stay near |v|) are far inside it.
//
// The bound is on values in natural order. damp-sr runs the recurrence on
// stored columns divided by its layout's value_scale c_j (and v / c_j):
// its layouts keep c_j moderate (calibration: a power of the column's
// magnitude, clamped at 1e-3 of the largest), which the layout check does
// not bound.
//
// Updates are not re-checked against B: with exactly unit keys (I - beta k
// k^T) has spectral norm <= 1 for beta in [0, 2], so a column's L2 norm grows
// at most by beta ||k|| |v_j| <= 2^17 per step, and a state that updates
// push past B keeps updating finitely (it is then refused by Import if
// exported, since the bound is the entry contract). Keys at the edge's norm
// tolerance with beta near 2 can expand a column by up to 4% per step
// (|1 - 2 * 1.01^2|), so many such steps in one direction can still
// overflow from any state: a limit of that tolerance, which B does not lift.
#ifndef STATECACHE_KERNELS_FORMATS_STATE_BOUND_H_
#define STATECACHE_KERNELS_FORMATS_STATE_BOUND_H_

#include <cmath>

#include "kernels/common/host_device.h"

namespace statecache {

// B = 2^64 ~ 1.8447e19: the largest |x| of an accepted state value.
inline constexpr float kMaxStateMagnitude = 0x1p64f;

// True when x is finite and |x| <= kMaxStateMagnitude (false for NaN, Inf).
SC_HD bool IsAcceptedStateValue(float x) { return fabsf(x) <= kMaxStateMagnitude; }

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_STATE_BOUND_H_
