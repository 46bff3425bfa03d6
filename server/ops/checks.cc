#include "server/ops/checks.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/formats/numeric.h"

namespace statecache {
namespace {

float ElementAt(const TensorBytes& t, int64_t i) {
  if (t.dtype == DType::kFp32) {
    float x;
    std::memcpy(&x, static_cast<const char*>(t.data) + 4 * i, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(t.data) + 2 * i, 2);
  return t.dtype == DType::kBf16 ? Bf16BitsToFloat(h) : HalfBitsToFloat(h);
}

}  // namespace

absl::Status CheckLayer(int layer, int layers, absl::string_view field) {
  if (layer < 0 || layer >= layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", layer, " is outside 0..", layers - 1));
  }
  return absl::OkStatus();
}

absl::Status CheckBatch(int batch, int max_batch, absl::string_view field) {
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat(field, ": no slot handles given"));
  if (batch > max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", batch, " slots exceed the limit of ", max_batch, " per call"));
  }
  return absl::OkStatus();
}

absl::Status CheckWork(int64_t heads, int64_t max_heads, absl::string_view field) {
  if (heads > max_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", heads,
        " head updates (batch x tokens x heads) exceed the per-request limit of ", max_heads,
        " (--max_work_heads)"));
  }
  return absl::OkStatus();
}

absl::Status CheckMagnitudes(absl::string_view prefix, const TensorBytes& q, const TensorBytes& k,
                             const TensorBytes& v, int d_k, float max_abs_value) {
  for (const auto& [name, t] : {std::pair<const char*, const TensorBytes*>{"q", &q}, {"k", &k}}) {
    const int64_t rows = t->count / d_k;
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (int j = 0; j < d_k; ++j) {
        const double x = ElementAt(*t, r * d_k + j);
        sum += x * x;
      }
      if (sum > 1.0201) {  // (1 + 1e-2)^2
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, name, ": row ", r, " has L2 norm ", std::sqrt(sum),
            " > 1 (q and k must be L2-normalized per head)"));
      }
    }
  }
  for (int64_t i = 0; i < v.count; ++i) {
    const float x = ElementAt(v, i);
    if (std::fabs(x) > max_abs_value) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "v: element ", i, " = ", x,
                                                     " exceeds |v| <= ", max_abs_value));
    }
  }
  return absl::OkStatus();
}

namespace {

// Eight lanes as one value (GCC / Clang vector extensions: AVX registers
// where the target has them, scalar code elsewhere). Loads go through
// memcpy: message bytes have any alignment.
typedef float Floats8 __attribute__((vector_size(32)));
typedef uint32_t Words8 __attribute__((vector_size(32)));

// Rows of d_k FP32 values whose sums of squares are all <= bound; NaN / Inf
// make a sum fail.
bool RowsWithin(const TensorBytes& t, int d_k, float bound) {
  const char* p = static_cast<const char*>(t.data);
  const int64_t rows = t.count / d_k;
  bool ok = true;
  for (int64_t r = 0; r < rows; ++r) {
    const char* row = p + 4 * r * d_k;
    Floats8 a0 = {}, a1 = {};
    int j = 0;
    for (; j + 16 <= d_k; j += 16) {
      Floats8 x, y;
      std::memcpy(&x, row + 4 * j, sizeof(x));
      std::memcpy(&y, row + 4 * j + 32, sizeof(y));
      a0 += x * x;
      a1 += y * y;
    }
    const Floats8 a = a0 + a1;
    float sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (; j < d_k; ++j) {
      float x;
      std::memcpy(&x, row + 4 * j, 4);
      sum += x * x;
    }
    ok &= sum <= bound;  // false for NaN
  }
  return ok;
}

// Every FP32 value finite with |x| <= bound (bound finite, >= 0). On the
// bits: |x| as an integer orders like the float, and Inf / NaN lie above
// every finite bound.
bool AllWithin(const TensorBytes& t, float bound) {
  const char* p = static_cast<const char*>(t.data);
  uint32_t limit;
  std::memcpy(&limit, &bound, 4);
  const uint32_t abs_mask = 0x7fffffffu;
  Words8 top0 = {}, top1 = {};  // largest |x| bits per lane
  auto max8 = [](Words8 a, Words8 b) {
    const Words8 b_larger = reinterpret_cast<Words8>(b > a);  // all ones where b > a
    return (a & ~b_larger) | (b & b_larger);
  };
  int64_t i = 0;
  for (; i + 16 <= t.count; i += 16) {
    Words8 x, y;
    std::memcpy(&x, p + 4 * i, sizeof(x));
    std::memcpy(&y, p + 4 * i + 32, sizeof(y));
    top0 = max8(top0, x & abs_mask);
    top1 = max8(top1, y & abs_mask);
  }
  const Words8 top = max8(top0, top1);
  uint32_t m = 0;
  for (int l = 0; l < 8; ++l) m = std::max(m, static_cast<uint32_t>(top[l]));
  for (; i < t.count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + 4 * i, 4);
    m = std::max(m, bits & abs_mask);
  }
  return m <= limit;
}

}  // namespace

bool ValuesPassQuickly(const TensorBytes& q, const TensorBytes& k, const TensorBytes& v, int d_k,
                       float max_abs_value) {
  if (q.dtype != DType::kFp32 || k.dtype != DType::kFp32 || v.dtype != DType::kFp32 || d_k < 1 ||
      d_k > 1024 || !(max_abs_value >= 0)) {
    return false;
  }
  constexpr float kRowBound = 1.02f;  // CheckMagnitudes: 1.0201 in double
  return RowsWithin(q, d_k, kRowBound) && RowsWithin(k, d_k, kRowBound) &&
         AllWithin(v, std::min(max_abs_value, std::numeric_limits<float>::max()));
}

int64_t SanitizeTensor(TensorBytes* t, std::string* storage) {
  auto bad = [&](int64_t i) {
    if (t->dtype == DType::kFp32) {
      float x;
      std::memcpy(&x, static_cast<const char*>(t->data) + 4 * i, 4);
      return !std::isfinite(x);
    }
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(t->data) + 2 * i, 2);
    const uint16_t exp = t->dtype == DType::kBf16 ? 0x7f80 : 0x7c00;
    return (h & exp) == exp;
  };
  int64_t n = 0;
  for (int64_t i = 0; i < t->count; ++i) n += bad(i);
  if (n == 0) return 0;
  storage->assign(static_cast<const char*>(t->data), t->bytes);
  const int64_t width = t->dtype == DType::kFp32 ? 4 : 2;
  for (int64_t i = 0; i < t->count; ++i) {
    if (bad(i)) std::memset(storage->data() + width * i, 0, width);
  }
  t->data = storage->data();
  return n;
}

int64_t SanitizeFloats(std::vector<float>* v) {
  int64_t n = 0;
  for (float& x : *v) {
    if (!std::isfinite(x)) {
      x = 0.f;
      ++n;
    }
  }
  return n;
}

std::vector<float> Floats(const TensorBytes& t) {
  std::vector<float> out(t.count);
  if (t.bytes > 0) std::memcpy(out.data(), t.data, t.bytes);
  return out;
}

double SecondsSince(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

}  // namespace statecache
