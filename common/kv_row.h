// How a KV cache stores one slot of one head: a row of head_dim keys (or values). f32 and f16
// rows are head_dim elements; an int8 row is head_dim int8 values followed by the row's f32 scale
// (per token and head: max |x| / 127, the values round(x / scale)), head_dim + 4 bytes. Every
// place that addresses, copies, writes or reads a KV row goes through these, so the caches, the
// block pool, the prefix cache's host and disk copies and the kernels agree on the layout.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"

namespace deja {

inline constexpr int64_t kKvI8ScaleBytes = 4;

// The dtypes a KV cache can hold.
inline bool IsKvDType(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kI8; }

// Bytes of one row of head_dim.
inline size_t KvRowBytes(DType d, int64_t head_dim) {
  if (d == DType::kI8) return static_cast<size_t>(head_dim + kKvI8ScaleBytes);
  return static_cast<size_t>(head_dim) * DTypeSize(d);
}
// The row in elements of d (a cache tensor's last dimension): head_dim, or head_dim + 4 for int8.
inline int64_t KvRowElems(DType d, int64_t head_dim) {
  return static_cast<int64_t>(KvRowBytes(d, head_dim) / DTypeSize(d));
}
// An int8 row's scale.
inline float KvRowScale(const void* row, int64_t head_dim) {
  float s;
  std::memcpy(&s, static_cast<const char*>(row) + head_dim, sizeof(s));
  return s;
}

// How attention over int8 K rows rounds its query (the CPU kernels, kernels/cpu/attention_i8.cc,
// in vectors; the reference backend): q[0, head_dim) to int16 in out, the largest |q| mapped to
// qmax = min(32767, (2^31 - 1) / (128 head_dim)), so that a row's integer dot product stays
// within int32; returns the scale, max |q| / qmax (0 for a zero query; NaN, with out zeroed, when
// a value is not finite). A score is then scale * row scale * sum_i out[i] * k[i].
float KvQueryToI16(const float* q, int64_t head_dim, int16_t* out);
// The qmax above: the largest |q| an int16 query takes at this head size (every kernel that rounds
// a query for int8 rows uses it, so their scores are the same bits).
inline float KvQueryI16Max(int64_t head_dim) {
  return static_cast<float>(std::min<int64_t>(32767, INT32_MAX / (128 * head_dim)));
}
// x[0, head_dim) rounded into a row of d (int8: its scale computed and stored).
void KvRowFromF32(const float* x, int64_t head_dim, DType d, void* row);
// The row's values as f32 (int8: times its scale).
void KvRowToF32(const void* row, DType d, int64_t head_dim, float* out);

}  // namespace deja
