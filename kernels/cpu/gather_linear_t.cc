// The decode-time gather-transposed-GEMV (Deja Vu fc2 / out-projection over the selected rows):
// out[m, n] += sum_j x[m, j] * wt[rows[j], n]. Each selected row of wt is contiguous along N, so
// the kernel walks a column range with several rows j at once (kJ independent read streams),
// keeping a C x NV block of out in f32 registers while the kJ rows are added into it; the block
// is loaded from and stored back to out once per kJ rows. Weights are widened in registers. The
// next kJ rows are prefetched during the current pass (they are scattered, so the hardware
// prefetcher would have to retrain on each).
// Compiled per x86 target by Highway's foreach_target and dispatched at run time.
#include <algorithm>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/gather_linear_t.cc"
// foreach_target must precede highway.h and the -inl headers.
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/simd_load-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace deja::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

constexpr int kJ = 8;  // rows of wt added per pass over out
// out rows (C) x column vectors (NV) held in registers: C * NV accumulators + NV weights + one
// broadcast x. AVX-512 has 32 vector registers, narrower targets 16.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kC = 6;
constexpr int kNV = 4;
#else
constexpr int kC = 3;
constexpr int kNV = 3;
#endif

// out rows [0, C) (row stride n_dim), columns [n0, n1), plus rows w[0 .. jn) weighted by
// x[c * ldx + jj]. prefetch: the next pass's rows (or null).
template <int C, typename WT>
HWY_INLINE void Pass(const float* HWY_RESTRICT x, int64_t ldx, const WT* const* w, int jn,
                     int64_t n0, int64_t n1, int64_t n_dim, float* HWY_RESTRICT out,
                     const WT* const* prefetch, int prefetch_n) {
  const DF df;
  using V = hn::Vec<DF>;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t step = kNV * lanes;
  int64_t n = n0;
  for (; n + step <= n1; n += step) {
    if (prefetch != nullptr) {
      for (int jj = 0; jj < prefetch_n; ++jj) {
        const char* pf = reinterpret_cast<const char*>(prefetch[jj] + n);
        for (int line = 0; line < static_cast<int>(step * sizeof(WT)); line += 64) {
          hwy::Prefetch(pf + line);
        }
      }
    }
    V acc[C][kNV];
    for (int c = 0; c < C; ++c)
      for (int v = 0; v < kNV; ++v) acc[c][v] = hn::LoadU(df, out + c * n_dim + n + v * lanes);
    for (int jj = 0; jj < jn; ++jj) {
      V wv[kNV];
      for (int v = 0; v < kNV; ++v) wv[v] = LoadWidened(df, w[jj] + n + v * lanes);
      for (int c = 0; c < C; ++c) {
        const V xv = hn::Set(df, x[c * ldx + jj]);
        for (int v = 0; v < kNV; ++v) acc[c][v] = hn::MulAdd(wv[v], xv, acc[c][v]);
      }
    }
    for (int c = 0; c < C; ++c)
      for (int v = 0; v < kNV; ++v) hn::StoreU(acc[c][v], df, out + c * n_dim + n + v * lanes);
  }
  for (; n + lanes <= n1; n += lanes) {
    V acc[C];
    for (int c = 0; c < C; ++c) acc[c] = hn::LoadU(df, out + c * n_dim + n);
    for (int jj = 0; jj < jn; ++jj) {
      const V wv = LoadWidened(df, w[jj] + n);
      for (int c = 0; c < C; ++c) acc[c] = hn::MulAdd(wv, hn::Set(df, x[c * ldx + jj]), acc[c]);
    }
    for (int c = 0; c < C; ++c) hn::StoreU(acc[c], df, out + c * n_dim + n);
  }
  for (; n < n1; ++n) {
    for (int c = 0; c < C; ++c) {
      float acc = out[c * n_dim + n];
      for (int jj = 0; jj < jn; ++jj) acc += x[c * ldx + jj] * ScalarToFloat(w[jj][n]);
      out[c * n_dim + n] = acc;
    }
  }
}

template <typename WT>
void GatherLinearTTyped(const float* x, int64_t m_rows, const WT* wt, int64_t n_dim,
                        const int32_t* rows, int64_t n_rows, int64_t n0, int64_t n1,
                        bool accumulate, float* out) {
  if (!accumulate) {
    for (int64_t m = 0; m < m_rows; ++m) {
      std::memset(out + m * n_dim + n0, 0, static_cast<size_t>(n1 - n0) * sizeof(float));
    }
  }
  const WT* w[kJ];
  const WT* next[kJ];
  for (int64_t j0 = 0; j0 < n_rows; j0 += kJ) {
    const int jn = static_cast<int>(std::min<int64_t>(kJ, n_rows - j0));
    const int next_n = static_cast<int>(std::clamp<int64_t>(n_rows - j0 - kJ, 0, kJ));
    for (int jj = 0; jj < jn; ++jj) w[jj] = wt + static_cast<int64_t>(rows[j0 + jj]) * n_dim;
    for (int jj = 0; jj < next_n; ++jj) {
      next[jj] = wt + static_cast<int64_t>(rows[j0 + kJ + jj]) * n_dim;
    }
    int64_t m = 0;
    for (; m + kC <= m_rows; m += kC) {
      Pass<kC>(x + m * n_rows + j0, n_rows, w, jn, n0, n1, n_dim, out + m * n_dim,
               m == 0 && next_n > 0 ? next : nullptr, next_n);
    }
    const float* xm = x + m * n_rows + j0;
    float* om = out + m * n_dim;
    const WT* const* pf = m == 0 && next_n > 0 ? next : nullptr;
    switch (m_rows - m) {
      case 5:
        Pass<5>(xm, n_rows, w, jn, n0, n1, n_dim, om, pf, next_n);
        break;
      case 4:
        Pass<4>(xm, n_rows, w, jn, n0, n1, n_dim, om, pf, next_n);
        break;
      case 3:
        Pass<3>(xm, n_rows, w, jn, n0, n1, n_dim, om, pf, next_n);
        break;
      case 2:
        Pass<2>(xm, n_rows, w, jn, n0, n1, n_dim, om, pf, next_n);
        break;
      case 1:
        Pass<1>(xm, n_rows, w, jn, n0, n1, n_dim, om, pf, next_n);
        break;
      default:
        break;
    }
  }
}

void GatherLinearTImpl(const float* x, int64_t m_rows, const void* wt, DType w_dtype, int64_t n_dim,
                       const int32_t* rows, int64_t n_rows, int64_t n_begin, int64_t n_end,
                       bool accumulate, float* out) {
  switch (w_dtype) {
    case DType::kF16:
      return GatherLinearTTyped(x, m_rows, static_cast<const hwy::float16_t*>(wt), n_dim, rows,
                                n_rows, n_begin, n_end, accumulate, out);
    case DType::kBF16:
      return GatherLinearTTyped(x, m_rows, static_cast<const hwy::bfloat16_t*>(wt), n_dim, rows,
                                n_rows, n_begin, n_end, accumulate, out);
    case DType::kI8:
      return GatherLinearTTyped(x, m_rows, static_cast<const int8_t*>(wt), n_dim, rows, n_rows,
                                n_begin, n_end, accumulate, out);
    default:
      return GatherLinearTTyped(x, m_rows, static_cast<const float*>(wt), n_dim, rows, n_rows,
                                n_begin, n_end, accumulate, out);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace deja::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deja::kernels::cpu {

HWY_EXPORT(GatherLinearTImpl);

void GatherLinearTSmallM(const float* x, int64_t m_rows, const void* wt, DType w_dtype,
                         int64_t n_dim, const int32_t* rows, int64_t n_rows, int64_t n_begin,
                         int64_t n_end, bool accumulate, float* out) {
  HWY_DYNAMIC_DISPATCH(GatherLinearTImpl)
  (x, m_rows, wt, w_dtype, n_dim, rows, n_rows, n_begin, n_end, accumulate, out);
}

}  // namespace deja::kernels::cpu
#endif  // HWY_ONCE
