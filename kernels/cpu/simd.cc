// Vector building blocks (conversion, dot, axpy, exp sums, LayerNorm rows), compiled once per
// x86 target by Highway's foreach_target and dispatched at run time.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/kv_row.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd.cc"
// foreach_target must precede highway.h and the -inl headers.
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/simd_load-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace deja::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// dot(a, b) with b's elements widened to f32 (bit-identical to the f32 loop for KT = float).
template <typename KT>
HWY_INLINE float DotTyped(const float* a, const KT* b, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), LoadWidened(df, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + i + lanes), LoadWidened(df, b + i + lanes), acc1);
  }
  for (; i + lanes <= n; i += lanes)
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), LoadWidened(df, b + i), acc0);
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < n; ++i) sum += a[i] * ScalarToFloat(b[i]);
  return sum;
}

float DotImpl(const float* a, const float* b, int64_t n) { return DotTyped(a, b, n); }

// Rows about this many bytes ahead of the one being read are prefetched: a row costs few
// instructions (fewer bytes still for f16 and int8), so the out-of-order window alone keeps too
// few misses in flight to reach the memory's bandwidth (BM_AttentionDecode at 768 slots, head
// size 64: int8 0.54 of the bandwidth floor without, 0.72-0.79 with; f16 0.72 and 0.76-0.86).
constexpr int64_t kPrefetchBytes = 6144;

HWY_INLINE int64_t RowsAhead(int64_t row_bytes) {
  return std::clamp<int64_t>(kPrefetchBytes / std::max<int64_t>(1, row_bytes), 8, 128);
}

template <typename T>
HWY_INLINE void PrefetchRow(const T* base, int64_t stride, const int32_t* rows, int64_t j,
                            int64_t count, int64_t row_bytes, int64_t ahead) {
  if (j + ahead >= count) return;
  // Each cache line the row touches, once.
  const uintptr_t first = reinterpret_cast<uintptr_t>(
      base + static_cast<int64_t>(rows[j + ahead]) * stride);
  for (uintptr_t line = first & ~uintptr_t{63}; line < first + row_bytes; line += 64) {
    hwy::Prefetch(reinterpret_cast<const char*>(line));
  }
}

// DotImpl's arithmetic per row, so each score is bit-identical to Dot's (f32 rows). Rows are
// `stride` elements apart; int8 rows (common/kv_row.h) carry their scale after the values.
template <typename KT>
void DotRowsTyped(const float* q, const KT* k, int64_t stride, const int32_t* rows, int64_t count,
                  int64_t d, float scale, float* scores) {
  const int64_t row_bytes = stride * static_cast<int64_t>(sizeof(KT));
  const int64_t ahead = RowsAhead(row_bytes);
  for (int64_t j = 0; j < count; ++j) {
    PrefetchRow(k, stride, rows, j, count, row_bytes, ahead);
    const KT* row = k + static_cast<int64_t>(rows[j]) * stride;
    float s = scale;
    if constexpr (std::is_same_v<KT, int8_t>) s *= KvRowScale(row, d);
    scores[j] = s * DotTyped(q, row, d);
  }
}

void DotRowsImpl(const float* q, const void* k, DType k_dtype, const int32_t* rows, int64_t count,
                 int64_t d, float scale, float* scores) {
  const int64_t stride = KvRowElems(k_dtype, d);
  if (k_dtype == DType::kF16) {
    return DotRowsTyped(q, static_cast<const hwy::float16_t*>(k), stride, rows, count, d, scale,
                        scores);
  }
  if (k_dtype == DType::kI8) {
    return DotRowsTyped(q, static_cast<const int8_t*>(k), stride, rows, count, d, scale, scores);
  }
  DotRowsTyped(q, static_cast<const float*>(k), stride, rows, count, d, scale, scores);
}

// Accumulates sum_j p[j] * v_row(j) in registers, kChunk vectors of out at a time, adding the
// rows in order with the same fused multiply-add as AxpyImpl: bit-identical to zeroing out and
// calling Axpy per row (f32 rows), without a load and store of out per row.
template <typename VT>
void WeightedSumRowsTyped(const float* p, const VT* v, int64_t stride, const int32_t* rows,
                          int64_t count, int64_t d, float* out) {
  // An int8 row's weight is its probability times its scale.
  auto weight = [&](int64_t j) {
    if constexpr (std::is_same_v<VT, int8_t>) {
      return p[j] * KvRowScale(v + static_cast<int64_t>(rows[j]) * stride, d);
    } else {
      return p[j];
    }
  };
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kChunk = 8;
  const int64_t full = d / lanes * lanes;
  const int64_t row_bytes = stride * static_cast<int64_t>(sizeof(VT));
  const int64_t ahead = RowsAhead(row_bytes);
  for (int64_t c0 = 0; c0 < full; c0 += kChunk * lanes) {
    const int64_t nv = std::min<int64_t>(kChunk, (full - c0) / lanes);
    hn::Vec<DF> acc[kChunk];
    for (int64_t i = 0; i < kChunk; ++i) acc[i] = hn::Zero(df);
    for (int64_t j = 0; j < count; ++j) {
      if (c0 == 0) PrefetchRow(v, stride, rows, j, count, row_bytes, ahead);
      const auto pj = hn::Set(df, weight(j));
      const VT* row = v + static_cast<int64_t>(rows[j]) * stride + c0;
      for (int64_t i = 0; i < nv; ++i)
        acc[i] = hn::MulAdd(pj, LoadWidened(df, row + i * lanes), acc[i]);
    }
    for (int64_t i = 0; i < nv; ++i) hn::StoreU(acc[i], df, out + c0 + i * lanes);
  }
  for (int64_t e = full; e < d; ++e) out[e] = 0.f;
  for (int64_t j = 0; j < count && full < d; ++j) {
    const VT* row = v + static_cast<int64_t>(rows[j]) * stride;
    const float w = weight(j);
    for (int64_t e = full; e < d; ++e) out[e] += w * ScalarToFloat(row[e]);
  }
}

void WeightedSumRowsImpl(const float* p, const void* v, DType v_dtype, const int32_t* rows,
                         int64_t count, int64_t d, float* out) {
  const int64_t stride = KvRowElems(v_dtype, d);
  if (v_dtype == DType::kF16) {
    return WeightedSumRowsTyped(p, static_cast<const hwy::float16_t*>(v), stride, rows, count, d,
                                out);
  }
  if (v_dtype == DType::kI8) {
    return WeightedSumRowsTyped(p, static_cast<const int8_t*>(v), stride, rows, count, d, out);
  }
  WeightedSumRowsTyped(p, static_cast<const float*>(v), stride, rows, count, d, out);
}

void AxpyImpl(float a, const float* x, float* y, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto va = hn::Set(df, a);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

void AddIntoImpl(const float* x, float* y, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  }
  for (; i < n; ++i) y[i] += x[i];
}

void AddBiasedIntoImpl(const float* x, const float* b, float* y, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto xb = hn::Add(hn::LoadU(df, x + i), hn::LoadU(df, b + i));
    hn::StoreU(hn::Add(hn::LoadU(df, y + i), xb), df, y + i);
  }
  for (; i < n; ++i) y[i] += x[i] + b[i];
}

void SubtractTwiceImpl(const float* x, int64_t n, float a, float b, float* out) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto va = hn::Set(df, a), vb = hn::Set(df, b);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Sub(hn::Sub(hn::LoadU(df, x + i), va), vb), df, out + i);
  }
  for (; i < n; ++i) out[i] = (x[i] - a) - b;
}

void LayerNormRowImpl(const float* x, int64_t n, const float* gamma, const float* beta, float eps,
                      float* out) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  // Two passes (mean, then centred variance) so rows with a large mean keep their precision.
  auto acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) acc = hn::Add(acc, hn::LoadU(df, x + i));
  float sum = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  const auto vmean = hn::Set(df, mean);
  acc = hn::Zero(df);
  for (i = 0; i + lanes <= n; i += lanes) {
    auto d = hn::Sub(hn::LoadU(df, x + i), vmean);
    acc = hn::MulAdd(d, d, acc);
  }
  float sq = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) sq += (x[i] - mean) * (x[i] - mean);
  const float inv = 1.0f / std::sqrt(sq / static_cast<float>(n) + eps);
  const auto vinv = hn::Set(df, inv);
  for (i = 0; i + lanes <= n; i += lanes) {
    auto y = hn::Mul(hn::Sub(hn::LoadU(df, x + i), vmean), vinv);
    hn::StoreU(hn::MulAdd(y, hn::LoadU(df, gamma + i), hn::LoadU(df, beta + i)), df, out + i);
  }
  for (; i < n; ++i) out[i] = (x[i] - mean) * inv * gamma[i] + beta[i];
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace deja::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deja::kernels::cpu {

HWY_EXPORT(DotImpl);
HWY_EXPORT(AxpyImpl);
HWY_EXPORT(DotRowsImpl);
HWY_EXPORT(WeightedSumRowsImpl);
HWY_EXPORT(AddIntoImpl);
HWY_EXPORT(AddBiasedIntoImpl);
HWY_EXPORT(SubtractTwiceImpl);
HWY_EXPORT(LayerNormRowImpl);
HWY_EXPORT(TargetNameImpl);

float Dot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotImpl)(a, b, n);
}
void Axpy(float a, const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyImpl)(a, x, y, n);
}
void DotRows(const float* q, const void* k, DType k_dtype, const int32_t* rows, int64_t count,
             int64_t d, float scale, float* scores) {
  HWY_DYNAMIC_DISPATCH(DotRowsImpl)(q, k, k_dtype, rows, count, d, scale, scores);
}
void WeightedSumRows(const float* p, const void* v, DType v_dtype, const int32_t* rows,
                     int64_t count, int64_t d, float* out) {
  HWY_DYNAMIC_DISPATCH(WeightedSumRowsImpl)(p, v, v_dtype, rows, count, d, out);
}
void AddInto(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(AddIntoImpl)(x, y, n); }
void AddBiasedInto(const float* x, const float* b, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddBiasedIntoImpl)(x, b, y, n);
}
void SubtractTwice(const float* x, int64_t n, float a, float b, float* out) {
  HWY_DYNAMIC_DISPATCH(SubtractTwiceImpl)(x, n, a, b, out);
}
void LayerNormRow(const float* x, int64_t n, const float* gamma, const float* beta, float eps,
                  float* out) {
  HWY_DYNAMIC_DISPATCH(LayerNormRowImpl)(x, n, gamma, beta, eps, out);
}
const char* SimdTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace deja::kernels::cpu
#endif  // HWY_ONCE
