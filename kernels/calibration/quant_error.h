// Squared error of the deployed low-precision row mappings (Q_lo of DESIGN.md
// section 4), computed without packing bytes: the calibration hot loop.
//
// Each error function quantizes one stored-domain row x[0..d_v) exactly as
// EncodeRow + DecodeRow of kernels/formats/head_codec.h do (same parameter
// derivation from group_quant.h, same element arithmetic, no FMA
// contraction) and returns sum_j (col_scale_j * (x_hat_j - x_j))^2, i.e. the
// error measured in the model's own value domain. col_scale is null for
// transforms that preserve the norm (none, H32): then the plain squared error
// is returned. Squares are summed in FP32 within a row (relative error
// ~1e-7); quant_error_test checks agreement with the byte codec.
// With AVX2 (the build's -march=x86-64-v3) the loops are hand-vectorized;
// a scalar path covers other targets. d_v must be a multiple of 32.
#ifndef STATECACHE_KERNELS_CALIBRATION_QUANT_ERROR_H_
#define STATECACHE_KERNELS_CALIBRATION_QUANT_ERROR_H_

#include <cstdint>

namespace statecache {

// Asymmetric uint8, FP16 (s, z) per 32 values (int8, int8-hadamard, damp lo rows).
double AffineU8RowError(const float* x, int d_v);

// Symmetric int8, FP32 s per 32 values (damp-sr lo rows).
double SymI8RowError(const float* x, const float* col_scale, int d_v);

// FP16 rounding with saturation (damp / damp-sr hi rows).
double Fp16RowError(const float* x, const float* col_scale, int d_v);

// In-place block-32 Hadamard of x[0..d_v): bit-identical to BlockHadamard32
// (same butterfly order), vectorized.
void FastBlockHadamard32(float* x, int d_v);

// out[j] = x[order[j]] / scale[j] for j < d_v (scale already in stored order):
// the damp-sr value map applied to one row.
void GatherScaled(const float* x, const int32_t* order, const float* scale, float* out, int d_v);

// damp-sr errors of every key row at once, from the transposed state
// st[d_v][d_k] (st[j][u] = S[u][j]): for each key channel u,
//   e8[u]  = SymI8RowError(row_u mapped by (order, scale)) and
//   e16[u] = Fp16RowError(same row)
// with the mapped row x'_j' = S[u][order[j']] / scale[j'] and col_scale =
// scale (stored order). Same arithmetic per element as the row functions,
// vectorized across key channels (no gathers). `buf` holds 32 * d_k floats.
void SrErrorsTransposed(const float* st, int d_k, int d_v, const int32_t* order,
                        const float* scale, float* buf, float* e8, float* e16);

// Row-major [rows][cols] -> [cols][rows].
void Transpose(const float* in, int rows, int cols, float* out);

// sum_j x_j^2 in FP32 lanes.
double SquaredNorm(const float* x, int d_v);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CALIBRATION_QUANT_ERROR_H_
