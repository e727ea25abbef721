// Per-target helpers shared by the Highway translation units of the CPU backend: load weights of
// any checkpoint dtype and widen them to f32 lanes. Re-included once per target by
// foreach_target, hence the toggle guard instead of #pragma once.
#if defined(DEJA_KERNELS_CPU_SIMD_LOAD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DEJA_KERNELS_CPU_SIMD_LOAD_INL_H_
#undef DEJA_KERNELS_CPU_SIMD_LOAD_INL_H_
#else
#define DEJA_KERNELS_CPU_SIMD_LOAD_INL_H_
#endif

#include <cstring>

#include "common/dtype.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace deja::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class DF>
HWY_INLINE hn::Vec<DF> LoadWidened(DF df, const float* HWY_RESTRICT p) {
  return hn::LoadU(df, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWidened(DF df, const hwy::float16_t* HWY_RESTRICT p) {
  return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), p));
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWidened(DF df, const hwy::bfloat16_t* HWY_RESTRICT p) {
  return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::bfloat16_t, DF>(), p));
}
// int8 weights widen to their integer values; the row's scale comes in the epilogue.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWidened(DF df, const int8_t* HWY_RESTRICT p) {
  const hn::Rebind<int32_t, DF> di;
  return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(hn::Rebind<int8_t, DF>(), p)));
}

HWY_INLINE float ScalarToFloat(float v) { return v; }
HWY_INLINE float ScalarToFloat(hwy::float16_t v) {
  uint16_t bits;
  std::memcpy(&bits, &v, 2);
  return HalfToFloat(bits);
}
HWY_INLINE float ScalarToFloat(hwy::bfloat16_t v) { return hwy::F32FromBF16(v); }
HWY_INLINE float ScalarToFloat(int8_t v) { return static_cast<float>(v); }

}  // namespace HWY_NAMESPACE
}  // namespace deja::kernels::cpu
HWY_AFTER_NAMESPACE();

#endif  // DEJA_KERNELS_CPU_SIMD_LOAD_INL_H_
