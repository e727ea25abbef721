#include "common/kv_row.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/vec_math.h"

namespace deja {
namespace {

// std::nearbyint in the default rounding mode for |x| < 2^22 (here |x| <= 127), in arithmetic the
// compiler vectorizes instead of a library call per value: adding 1.5 * 2^23 leaves no fraction
// bits, so the sum is rounded half to even, and the subtraction is exact.
inline float RoundHalfEven(float x) {
  constexpr float kShift = 12582912.f;
  return (x + kShift) - kShift;
}

}  // namespace

void KvRowFromF32(const float* x, int64_t head_dim, DType d, void* row) {
  if (d != DType::kI8) return ConvertFromF32(x, head_dim, d, row);
  float amax = 0.f;
  bool finite = true;
  for (int64_t i = 0; i < head_dim; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  int8_t* q = static_cast<int8_t*>(row);
  float scale = 0.f;
  if (!finite || amax == 0.f) {
    // All zeros; or a non-finite row, whose NaN scale keeps it visible downstream.
    if (!finite) scale = std::nanf("");
    std::memset(q, 0, static_cast<size_t>(head_dim));
  } else {
    scale = amax / 127.f;
    const float inv = 127.f / amax;
    for (int64_t i = 0; i < head_dim; ++i) {
      q[i] = static_cast<int8_t>(std::clamp(RoundHalfEven(x[i] * inv), -127.f, 127.f));
    }
  }
  std::memcpy(q + head_dim, &scale, sizeof(scale));
}

float KvQueryToI16(const float* q, int64_t head_dim, int16_t* out) {
  float amax = 0.f;
  bool finite = true;
  for (int64_t i = 0; i < head_dim; ++i) {
    finite = finite && std::isfinite(q[i]);
    amax = std::max(amax, std::fabs(q[i]));
  }
  std::fill(out, out + head_dim, int16_t{0});
  if (!finite) return std::numeric_limits<float>::quiet_NaN();
  if (amax == 0.f) return 0.f;
  const float qmax = KvQueryI16Max(head_dim);
  const float inv = qmax / amax;
  for (int64_t i = 0; i < head_dim; ++i) {
    out[i] = static_cast<int16_t>(std::clamp(std::nearbyint(q[i] * inv), -qmax, qmax));
  }
  return amax / qmax;
}

void KvRowToF32(const void* row, DType d, int64_t head_dim, float* out) {
  if (d != DType::kI8) return ConvertToF32(row, d, head_dim, out, false);
  const int8_t* q = static_cast<const int8_t*>(row);
  const float scale = KvRowScale(row, head_dim);
  for (int64_t i = 0; i < head_dim; ++i) out[i] = static_cast<float>(q[i]) * scale;
}

}  // namespace deja
