// Highway translation unit of common/vec_math.h: compiled once per x86 target by foreach_target
// and dispatched at run time.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/vec_math.cc"
// foreach_target must precede highway.h and the -inl headers.
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "common/vec_math.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace deja {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

HWY_INLINE hn::Vec<DF> Widen(DF df, const float* HWY_RESTRICT p) { return hn::LoadU(df, p); }
HWY_INLINE hn::Vec<DF> Widen(DF df, const int8_t* HWY_RESTRICT p) {
  const hn::Rebind<int32_t, DF> di;
  return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(hn::Rebind<int8_t, DF>(), p)));
}
template <typename T>
HWY_INLINE hn::Vec<DF> Widen(DF df, const T* HWY_RESTRICT p) {
  return hn::PromoteTo(df, hn::LoadU(hn::Rebind<T, DF>(), p));
}
// One element of a vector tail, widened as common/dtype.h does.
template <typename T>
HWY_INLINE float ScalarToFloat(T v) {
  if constexpr (sizeof(T) == 4) {
    return v;
  } else if constexpr (sizeof(T) == 1) {
    return static_cast<float>(v);
  } else {
    uint16_t bits;
    std::memcpy(&bits, &v, 2);
    return std::is_same_v<T, hwy::float16_t> ? HalfToFloat(bits) : BF16ToFloat(bits);
  }
}

template <typename WT>
void ConvertTyped(const WT* src, int64_t n, float* dst, bool accumulate) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  if (accumulate) {
    for (; i + lanes <= n; i += lanes) {
      hn::StoreU(hn::Add(Widen(df, src + i), hn::LoadU(df, dst + i)), df, dst + i);
    }
    for (; i < n; ++i) dst[i] += ScalarToFloat(src[i]);
  } else {
    for (; i + lanes <= n; i += lanes) hn::StoreU(Widen(df, src + i), df, dst + i);
    for (; i < n; ++i) dst[i] = ScalarToFloat(src[i]);
  }
}

void ConvertToF32Impl(const void* src, DType dtype, int64_t n, float* dst, bool accumulate) {
  switch (dtype) {
    case DType::kF16:
      return ConvertTyped(static_cast<const hwy::float16_t*>(src), n, dst, accumulate);
    case DType::kBF16:
      return ConvertTyped(static_cast<const hwy::bfloat16_t*>(src), n, dst, accumulate);
    case DType::kI8:
      return ConvertTyped(static_cast<const int8_t*>(src), n, dst, accumulate);
    default:
      return ConvertTyped(static_cast<const float*>(src), n, dst, accumulate);
  }
}

// f32 -> f16 with the target's conversion (F16C / AVX-512: round to nearest even).
void ConvertFromF32Impl(const float* src, int64_t n, DType dtype, void* dst) {
  if (dtype == DType::kBF16) {
    auto* out = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToBF16(src[i]);
    return;
  }
  if (dtype != DType::kF16) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto* out = static_cast<hwy::float16_t*>(dst);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, out + i);
  for (; i < n; ++i) {
    const uint16_t h = FloatToHalf(src[i]);
    std::memcpy(out + i, &h, 2);
  }
}

float MaxOfImpl(const float* x, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  float m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  bool nan = false;
  if (n >= lanes) {
    auto vm = hn::LoadU(df, x);
    // Max drops NaNs (maxps keeps its second operand), so they are looked for on the side.
    auto vnan = hn::IsNaN(vm);
    for (i = lanes; i + lanes <= n; i += lanes) {
      const auto v = hn::LoadU(df, x + i);
      vm = hn::Max(vm, v);
      vnan = hn::Or(vnan, hn::IsNaN(v));
    }
    m = hn::GetLane(hn::MaxOfLanes(df, vm));
    nan = !hn::AllFalse(df, vnan);
  }
  for (; i < n; ++i) {
    nan |= std::isnan(x[i]);
    m = x[i] > m ? x[i] : m;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

int32_t LowestScoreSlotImpl(const int32_t* pos, const float* score, int64_t n, int32_t pos_limit) {
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

}  // namespace HWY_NAMESPACE
}  // namespace deja
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deja {

HWY_EXPORT(ConvertToF32Impl);
HWY_EXPORT(ConvertFromF32Impl);
HWY_EXPORT(MaxOfImpl);
HWY_EXPORT(ExpShiftInPlaceImpl);
HWY_EXPORT(SumExpShiftImpl);
HWY_EXPORT(LowestScoreSlotImpl);

void ConvertToF32(const void* src, DType dtype, int64_t n, float* dst, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(ConvertToF32Impl)(src, dtype, n, dst, accumulate);
}
void ConvertFromF32(const float* src, int64_t n, DType dtype, void* dst) {
  HWY_DYNAMIC_DISPATCH(ConvertFromF32Impl)(src, n, dtype, dst);
}
float MaxOf(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(MaxOfImpl)(x, n); }
float ExpShiftInPlace(float* x, int64_t n, float shift) {
  return HWY_DYNAMIC_DISPATCH(ExpShiftInPlaceImpl)(x, n, shift);
}
float SumExpShift(const float* x, int64_t n, float shift) {
  return HWY_DYNAMIC_DISPATCH(SumExpShiftImpl)(x, n, shift);
}
int32_t LowestScoreSlot(const int32_t* pos, const float* score, int64_t n, int32_t pos_limit) {
  return HWY_DYNAMIC_DISPATCH(LowestScoreSlotImpl)(pos, score, n, pos_limit);
}

}  // namespace deja
#endif  // HWY_ONCE
