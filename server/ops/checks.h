// Request checks shared by every adapter of the operations layer (the gRPC
// service's inline bytes and the data plane's registered buffers): per-call
// bounds, the numeric value contract of q / k / v, opt-in sanitizing, and
// the wall-clock helper the kernel timings use.
//
// Each check returns kInvalidArgument with a message naming the request
// field, or OK. They read host memory only.
//
//   RETURN_IF_ERROR(CheckLayer(req.layer(), g.layers, "layer"));
//   RETURN_IF_ERROR(CheckBatch(b, limits.max_batch, "slots"));
#ifndef STATECACHE_SERVER_OPS_CHECKS_H_
#define STATECACHE_SERVER_OPS_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/core/proto_convert.h"

namespace statecache {

// `layer` in [0, layers): "<field>: 7 is outside 0..5" otherwise.
absl::Status CheckLayer(int layer, int layers, absl::string_view field);

// 1 <= batch <= max_batch: "<field>: no slot handles given" or
// "<field>: N slots exceed the limit of M per call" otherwise.
absl::Status CheckBatch(int batch, int max_batch, absl::string_view field);

// Per-request work bound on head updates (B x h_v for an Update, B x T x h_v
// for a Prefill of tokens, B x layers x h_v for a Prefill of states).
absl::Status CheckWork(int64_t heads, int64_t max_heads, absl::string_view field);

// The numeric contract that keeps the FP32 recurrence finite (fuzzing found
// that finite but huge keys overflow it into NaN): q and k rows are
// L2-normalized (norm <= 1 + 1e-2, rounding of bf16/fp16 included; zero rows
// allowed), so the delta-rule transition never expands the state, and
// |v| <= max_abs_value. The message names prefix + field and the row.
absl::Status CheckMagnitudes(absl::string_view prefix, const TensorBytes& q, const TensorBytes& k,
                             const TensorBytes& v, int d_k, float max_abs_value);

// A quick sufficient test for FP32 q, k, v: true when every q / k row of d_k
// values has a sum of squares <= 1.02 (computed in FP32, 8 lanes: within
// 1e-4 of the double sum for d_k <= 1024, so below CheckMagnitudes' bound
// 1.0201) and every v is finite with |v| <= max_abs_value. Then
// ValidateFinite of q, k, v and CheckMagnitudes pass. false (any other
// dtype, or a value near or past a bound) proves nothing: run those checks
// for the verdict and the error. One pass over the bytes, vectorized.
bool ValuesPassQuickly(const TensorBytes& q, const TensorBytes& k, const TensorBytes& v, int d_k,
                       float max_abs_value);

// Opt-in sanitizing (sanitize_non_finite): when `t` holds NaN / Inf, copies
// it into `storage` with those values replaced by +0 and points `t` at the
// copy. Returns the number replaced.
int64_t SanitizeTensor(TensorBytes* t, std::string* storage);
// Replaces NaN / Inf by 0; returns how many.
int64_t SanitizeFloats(std::vector<float>* v);

// FP32 values of a message copied into an aligned vector (message bytes need
// not be 4-byte aligned).
std::vector<float> Floats(const TensorBytes& t);

// Wall seconds from `since` to now.
double SecondsSince(absl::Time since);

}  // namespace statecache

#endif  // STATECACHE_SERVER_OPS_CHECKS_H_
