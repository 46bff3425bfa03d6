#include "kernels/backend/batch_validation.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/formats/numeric.h"
#include "kernels/formats/state_bound.h"

namespace statecache {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFp32: return "fp32";
    case DType::kBf16: return "bf16";
    case DType::kFp16: return "fp16";
  }
  return "unknown";
}

float LoadAsFloat(DType dtype, const void* data, int64_t i) {
  switch (dtype) {
    case DType::kFp32: return static_cast<const float*>(data)[i];
    case DType::kBf16: return Bf16BitsToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kFp16: return HalfBitsToFloat(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

absl::Status ValidatePoolAndLayer(const StateLayout& layout, const PoolView& pool, int layer) {
  const ModelGeometry& g = layout.geometry();
  if (pool.base == nullptr && pool.num_slots > 0) {
    return absl::InvalidArgumentError("pool: base is null");
  }
  if (pool.layers != g.layers || pool.heads != g.h_v ||
      pool.head_bytes != layout.head_layout().head_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool: shape (layers=", pool.layers, ", heads=", pool.heads, ", head_bytes=",
        pool.head_bytes, ") does not match the model (", g.layers, ", ", g.h_v, ", ",
        layout.head_layout().head_bytes, ")"));
  }
  if (layer < 0 || layer >= g.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer: ", layer, " is outside 0..", g.layers - 1));
  }
  return absl::OkStatus();
}

absl::Status ValidateSlots(const PoolView& pool, const int32_t* slots, int n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("batch: ", n, " is negative"));
  if (n > 0 && slots == nullptr) return absl::InvalidArgumentError("slots: null");
  std::vector<bool> seen(pool.num_slots, false);
  for (int i = 0; i < n; ++i) {
    const int32_t s = slots[i];
    if (s == -1) continue;
    if (s < 0 || s >= pool.num_slots) {
      return absl::InvalidArgumentError(absl::StrCat("slots[", i, "]: ", s,
                                                     " is outside 0..", pool.num_slots - 1));
    }
    if (seen[s]) {
      return absl::InvalidArgumentError(
          absl::StrCat("slots[", i, "]: slot ", s, " appears twice in one batch"));
    }
    seen[s] = true;
  }
  return absl::OkStatus();
}

absl::Status ValidateFinite(absl::string_view field, DType dtype, const void* data,
                            int64_t count) {
  if (count > 0 && data == nullptr) return absl::InvalidArgumentError(absl::StrCat(field, ": null"));
  for (int64_t i = 0; i < count; ++i) {
    const float x = LoadAsFloat(dtype, data, i);
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: ", x, " is not finite"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateStateValues(absl::string_view field, const float* data, int64_t count) {
  if (count > 0 && data == nullptr) return absl::InvalidArgumentError(absl::StrCat(field, ": null"));
  for (int64_t i = 0; i < count; ++i) {
    const float x = data[i];
    if (IsAcceptedStateValue(x)) continue;
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: ", x, " is not finite"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(field, "[", i, "]: ", x, " exceeds the state magnitude bound |x| <= 2^64 (",
                     kMaxStateMagnitude, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateGates(const float* g, int64_t g_count, const float* beta,
                           int64_t beta_count) {
  RETURN_IF_ERROR(ValidateFinite("g", DType::kFp32, g, g_count));
  RETURN_IF_ERROR(ValidateFinite("beta", DType::kFp32, beta, beta_count));
  for (int64_t i = 0; i < g_count; ++i) {
    if (g[i] > 0.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("g[", i, "]: ", g[i], " is positive (g is a log decay, must be <= 0)"));
    }
  }
  for (int64_t i = 0; i < beta_count; ++i) {
    if (beta[i] < 0.0f || beta[i] > 2.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("beta[", i, "]: ", beta[i], " is outside [0, 2]"));
    }
  }
  return absl::OkStatus();
}

namespace {

absl::Status ValidateTokens(const StateLayout& layout, int64_t rows, DType dtype, const void* q,
                            const void* k, const void* v, const float* g, const float* beta) {
  const ModelGeometry& geo = layout.geometry();
  if (dtype != DType::kFp32 && dtype != DType::kBf16 && dtype != DType::kFp16) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype: unknown code ", static_cast<int>(dtype)));
  }
  RETURN_IF_ERROR(ValidateFinite("q", dtype, q, rows * geo.h_qk * geo.d_k));
  RETURN_IF_ERROR(ValidateFinite("k", dtype, k, rows * geo.h_qk * geo.d_k));
  RETURN_IF_ERROR(ValidateFinite("v", dtype, v, rows * geo.h_v * geo.d_v));
  return ValidateGates(g, rows * geo.h_v * geo.GateWidth(), beta, rows * geo.h_v);
}

}  // namespace

absl::Status ValidateDecodeInputs(const StateLayout& layout, const PoolView& pool, int layer,
                                  const DecodeInputs& in) {
  RETURN_IF_ERROR(ValidatePoolAndLayer(layout, pool, layer));
  RETURN_IF_ERROR(ValidateSlots(pool, in.slots, in.batch));
  if (in.batch > 0 && in.o == nullptr) return absl::InvalidArgumentError("o: null");
  return ValidateTokens(layout, in.batch, in.dtype, in.q, in.k, in.v, in.g, in.beta);
}

absl::Status ValidatePrefillInputs(const StateLayout& layout, const PoolView& pool, int layer,
                                   const PrefillInputs& in) {
  RETURN_IF_ERROR(ValidatePoolAndLayer(layout, pool, layer));
  RETURN_IF_ERROR(ValidateSlots(pool, in.slots, in.batch));
  if (in.tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tokens: ", in.tokens, " (must be >= 1)"));
  }
  return ValidateTokens(layout, int64_t{in.batch} * in.tokens, in.dtype, in.q, in.k, in.v, in.g,
                        in.beta);
}

}  // namespace statecache
