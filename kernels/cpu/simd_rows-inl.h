// Per-target pieces of the attention row loops shared by the Highway translation units of the
// CPU backend (simd.cc: f32 and f16 rows; attention_i8.cc: int8 rows): the row prefetch and, on
// AVX-512, the 16-row horizontal sum. Re-included once per target by foreach_target, hence the
// toggle guard instead of #pragma once.
#if defined(DEJA_KERNELS_CPU_SIMD_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DEJA_KERNELS_CPU_SIMD_ROWS_INL_H_
#undef DEJA_KERNELS_CPU_SIMD_ROWS_INL_H_
#else
#define DEJA_KERNELS_CPU_SIMD_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace deja::kernels::cpu {
namespace HWY_NAMESPACE {

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
  const uintptr_t first =
      reinterpret_cast<uintptr_t>(base + static_cast<int64_t>(rows[j + ahead]) * stride);
  for (uintptr_t line = first & ~uintptr_t{63}; line < first + row_bytes; line += 64) {
    hwy::Prefetch(reinterpret_cast<const char*>(line));
  }
}

// Calls f(std::integral_constant<int, N>()) for n in [1, 8] (8 past it): a run-time count of
// vectors made a compile-time one, so a kernel's accumulators stay in registers.
template <class F>
HWY_INLINE void WithCount8(int64_t n, F&& f) {
  // clang-format off
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>());
    case 2: return f(std::integral_constant<int, 2>());
    case 3: return f(std::integral_constant<int, 3>());
    case 4: return f(std::integral_constant<int, 4>());
    case 5: return f(std::integral_constant<int, 5>());
    case 6: return f(std::integral_constant<int, 6>());
    case 7: return f(std::integral_constant<int, 7>());
    default: return f(std::integral_constant<int, 8>());
  }
  // clang-format on
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// The horizontal sums of 16 rows' vectors v[0..15], lane r holding row r's: the tree of
// _mm512_reduce_add_ps (Highway's SumOfLanes here: halves, quarters, pairs, the last pair),
// transposed, 15 vector adds for 16 rows. IEEE addition is commutative, so each lane is that
// row's SumOfLanes bit for bit. Add is the lane-wise addition: f32 by default, int32 for the
// int8 cache's exact sums (the shuffles move bits alike).
struct AddF32 {
  HWY_INLINE __m512 operator()(__m512 a, __m512 b) const { return _mm512_add_ps(a, b); }
};
template <class GetRow, class Add = AddF32>
HWY_INLINE __m512 SumOfLanes16(GetRow&& v, Add add = {}) {
  // Rows are taken in pairs and folded as they come, so few vectors are live at once.
  __m512 pair[2];
  for (int m2 = 0; m2 < 2; ++m2) {
    __m512 quarter[2];
    for (int m = 0; m < 2; ++m) {
      // Halves: lanes [r: 0-7 | r+1: 0-7] of v(r)[l] + v(r)[l + 8], for two row pairs.
      __m512 half[2];
      for (int h = 0; h < 2; ++h) {
        const int r = 8 * m2 + 4 * m + 2 * h;
        const __m512 a = v(r), b = v(r + 1);
        half[h] = add(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
      }
      // Quarters: one 128-bit chunk of t[l] + t[l + 4] per row, four rows.
      quarter[m] = add(_mm512_shuffle_f32x4(half[0], half[1], 0x88),
                       _mm512_shuffle_f32x4(half[0], half[1], 0xDD));
    }
    // Pairs: per chunk c, [u[0] + u[2], u[1] + u[3]] of rows c and c + 4 (of these eight).
    pair[m2] = add(_mm512_shuffle_ps(quarter[0], quarter[1], 0x44),
                   _mm512_shuffle_ps(quarter[0], quarter[1], 0xEE));
  }
  // The last pair: lane 4c + m holds row c + 4m; put row r in lane r.
  const __m512 sums =
      add(_mm512_shuffle_ps(pair[0], pair[1], 0x88), _mm512_shuffle_ps(pair[0], pair[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, sums);
}

struct AddI32 {
  HWY_INLINE __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
};
#endif

}  // namespace HWY_NAMESPACE
}  // namespace deja::kernels::cpu
HWY_AFTER_NAMESPACE();

#endif  // DEJA_KERNELS_CPU_SIMD_ROWS_INL_H_
