// Vector building blocks (conversion, dot, axpy, exp sums, LayerNorm rows), compiled once per
// x86 target by Highway's foreach_target and dispatched at run time.
#include <algorithm>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd.cc"
// foreach_target must precede highway.h and the -inl headers.
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
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

template <typename WT>
void ConvertTyped(const WT* src, int64_t n, float* dst, bool accumulate) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  if (accumulate) {
    for (; i + lanes <= n; i += lanes) {
      hn::StoreU(hn::Add(LoadWidened(df, src + i), hn::LoadU(df, dst + i)), df, dst + i);
    }
    for (; i < n; ++i) dst[i] += ScalarToFloat(src[i]);
  } else {
    for (; i + lanes <= n; i += lanes) hn::StoreU(LoadWidened(df, src + i), df, dst + i);
    for (; i < n; ++i) dst[i] = ScalarToFloat(src[i]);
  }
}

void ConvertToF32Impl(const void* src, DType dtype, int64_t n, float* dst, bool accumulate) {
  switch (dtype) {
    case DType::kF16:
      return ConvertTyped(static_cast<const hwy::float16_t*>(src), n, dst, accumulate);
    case DType::kBF16:
      return ConvertTyped(static_cast<const hwy::bfloat16_t*>(src), n, dst, accumulate);
    default:
      return ConvertTyped(static_cast<const float*>(src), n, dst, accumulate);
  }
}

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

// DotImpl's arithmetic per row, so each score is bit-identical to Dot's (f32 rows).
template <typename KT>
void DotRowsTyped(const float* q, const KT* k, const int32_t* rows, int64_t count, int64_t d,
                  float scale, float* scores) {
  for (int64_t j = 0; j < count; ++j) {
    scores[j] = scale * DotTyped(q, k + static_cast<int64_t>(rows[j]) * d, d);
  }
}

void DotRowsImpl(const float* q, const void* k, DType k_dtype, const int32_t* rows, int64_t count,
                 int64_t d, float scale, float* scores) {
  if (k_dtype == DType::kF16) {
    return DotRowsTyped(q, static_cast<const hwy::float16_t*>(k), rows, count, d, scale, scores);
  }
  DotRowsTyped(q, static_cast<const float*>(k), rows, count, d, scale, scores);
}

// Accumulates sum_j p[j] * v_row(j) in registers, kChunk vectors of out at a time, adding the
// rows in order with the same fused multiply-add as AxpyImpl: bit-identical to zeroing out and
// calling Axpy per row (f32 rows), without a load and store of out per row.
template <typename VT>
void WeightedSumRowsTyped(const float* p, const VT* v, const int32_t* rows, int64_t count,
                          int64_t d, float* out) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kChunk = 8;
  const int64_t full = d / lanes * lanes;
  for (int64_t c0 = 0; c0 < full; c0 += kChunk * lanes) {
    const int64_t nv = std::min<int64_t>(kChunk, (full - c0) / lanes);
    hn::Vec<DF> acc[kChunk];
    for (int64_t i = 0; i < kChunk; ++i) acc[i] = hn::Zero(df);
    for (int64_t j = 0; j < count; ++j) {
      const auto pj = hn::Set(df, p[j]);
      const VT* row = v + static_cast<int64_t>(rows[j]) * d + c0;
      for (int64_t i = 0; i < nv; ++i)
        acc[i] = hn::MulAdd(pj, LoadWidened(df, row + i * lanes), acc[i]);
    }
    for (int64_t i = 0; i < nv; ++i) hn::StoreU(acc[i], df, out + c0 + i * lanes);
  }
  for (int64_t e = full; e < d; ++e) out[e] = 0.f;
  for (int64_t j = 0; j < count && full < d; ++j) {
    const VT* row = v + static_cast<int64_t>(rows[j]) * d;
    for (int64_t e = full; e < d; ++e) out[e] += p[j] * ScalarToFloat(row[e]);
  }
}

void WeightedSumRowsImpl(const float* p, const void* v, DType v_dtype, const int32_t* rows,
                         int64_t count, int64_t d, float* out) {
  if (v_dtype == DType::kF16) {
    return WeightedSumRowsTyped(p, static_cast<const hwy::float16_t*>(v), rows, count, d, out);
  }
  WeightedSumRowsTyped(p, static_cast<const float*>(v), rows, count, d, out);
}

// f32 -> f16 with the target's conversion (F16C / AVX-512: round to nearest even).
void ConvertFromF32Impl(const float* src, int64_t n, DType dtype, void* dst) {
  if (dtype != DType::kF16) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto* out = static_cast<hwy::float16_t*>(dst);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, out + i);
  for (; i < n; ++i) {
    const uint16_t h = FloatToHalf(src[i]);
    std::memcpy(out + i, &h, 2);
  }
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

float MaxOfImpl(const float* x, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  float m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  if (n >= lanes) {
    auto vm = hn::LoadU(df, x);
    for (i = lanes; i + lanes <= n; i += lanes) vm = hn::Max(vm, hn::LoadU(df, x + i));
    m = hn::GetLane(hn::MaxOfLanes(df, vm));
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

int32_t LowestScoreSlotImpl(const int32_t* pos, const float* score, int64_t n,
                            int32_t pos_limit) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const float inf = std::numeric_limits<float>::infinity();
  const int32_t none = std::numeric_limits<int32_t>::max();
  const auto minus_one = hn::Set(di, -1);
  const auto limit = hn::Set(di, pos_limit);
  // Pass 1: the lowest score among candidates (0 <= pos < pos_limit).
  float low = inf;
  int64_t i = 0;
  {
    auto vlow = hn::Set(df, inf);
    for (; i + lanes <= n; i += lanes) {
      const auto p = hn::LoadU(di, pos + i);
      const auto cand = hn::And(hn::Gt(p, minus_one), hn::Lt(p, limit));
      vlow = hn::Min(vlow, hn::IfThenElse(hn::RebindMask(df, cand), hn::LoadU(df, score + i),
                                          hn::Set(df, inf)));
    }
    low = hn::GetLane(hn::MinOfLanes(df, vlow));
  }
  for (; i < n; ++i) {
    if (pos[i] >= 0 && pos[i] < pos_limit && score[i] < low) low = score[i];
  }
  // Pass 2: the lowest position among candidates with that score.
  int32_t best_pos = none;
  i = 0;
  {
    const auto vl = hn::Set(df, low);
    auto vbest = hn::Set(di, none);
    for (; i + lanes <= n; i += lanes) {
      const auto p = hn::LoadU(di, pos + i);
      const auto cand = hn::And(hn::Gt(p, minus_one), hn::Lt(p, limit));
      const auto eq = hn::RebindMask(di, hn::Eq(hn::LoadU(df, score + i), vl));
      vbest = hn::Min(vbest, hn::IfThenElse(hn::And(cand, eq), p, hn::Set(di, none)));
    }
    best_pos = hn::GetLane(hn::MinOfLanes(di, vbest));
  }
  for (; i < n; ++i) {
    if (pos[i] >= 0 && pos[i] < pos_limit && score[i] == low && pos[i] < best_pos) {
      best_pos = pos[i];
    }
  }
  if (best_pos == none) return -1;
  for (int64_t s = 0; s < n; ++s) {
    if (pos[s] == best_pos) return static_cast<int32_t>(s);
  }
  return -1;
}

template <bool kWrite>
float ExpShiftSumTyped(float* out, const float* x, int64_t n, float shift) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto vs = hn::Set(df, shift);
  auto acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, x + i), vs));
    if (kWrite) hn::StoreU(e, df, out + i);
    acc = hn::Add(acc, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, acc));
  if (i < n) {  // the tail goes through the same vector Exp so every element rounds alike
    HWY_ALIGN float buf[hn::MaxLanes(df)];
    for (int64_t j = 0; j < lanes; ++j) buf[j] = i + j < n ? x[i + j] : shift;
    auto e = hn::Exp(df, hn::Sub(hn::Load(df, buf), vs));
    hn::Store(e, df, buf);
    for (int64_t j = 0; i + j < n; ++j) {
      if (kWrite) out[i + j] = buf[j];
      sum += buf[j];
    }
  }
  return sum;
}

float ExpShiftInPlaceImpl(float* x, int64_t n, float shift) {
  return ExpShiftSumTyped<true>(x, x, n, shift);
}

float SumExpShiftImpl(const float* x, int64_t n, float shift) {
  return ExpShiftSumTyped<false>(nullptr, x, n, shift);
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

HWY_EXPORT(ConvertToF32Impl);
HWY_EXPORT(DotImpl);
HWY_EXPORT(AxpyImpl);
HWY_EXPORT(DotRowsImpl);
HWY_EXPORT(ConvertFromF32Impl);
HWY_EXPORT(WeightedSumRowsImpl);
HWY_EXPORT(AddIntoImpl);
HWY_EXPORT(AddBiasedIntoImpl);
HWY_EXPORT(MaxOfImpl);
HWY_EXPORT(LowestScoreSlotImpl);
HWY_EXPORT(ExpShiftInPlaceImpl);
HWY_EXPORT(SumExpShiftImpl);
HWY_EXPORT(SubtractTwiceImpl);
HWY_EXPORT(LayerNormRowImpl);
HWY_EXPORT(TargetNameImpl);

void ConvertToF32(const void* src, DType dtype, int64_t n, float* dst, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(ConvertToF32Impl)(src, dtype, n, dst, accumulate);
}
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
void ConvertFromF32(const float* src, int64_t n, DType dtype, void* dst) {
  HWY_DYNAMIC_DISPATCH(ConvertFromF32Impl)(src, n, dtype, dst);
}
void AddInto(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(AddIntoImpl)(x, y, n); }
void AddBiasedInto(const float* x, const float* b, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddBiasedIntoImpl)(x, b, y, n);
}
float MaxOf(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(MaxOfImpl)(x, n); }
int32_t LowestScoreSlot(const int32_t* pos, const float* score, int64_t n, int32_t pos_limit) {
  return HWY_DYNAMIC_DISPATCH(LowestScoreSlotImpl)(pos, score, n, pos_limit);
}
float ExpShiftInPlace(float* x, int64_t n, float shift) {
  return HWY_DYNAMIC_DISPATCH(ExpShiftInPlaceImpl)(x, n, shift);
}
float SumExpShift(const float* x, int64_t n, float shift) {
  return HWY_DYNAMIC_DISPATCH(SumExpShiftImpl)(x, n, shift);
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
