// The scores of an int8 KV cache's K rows (common/kv_row.h), compiled once per x86 target by
// Highway's foreach_target and dispatched at run time.
//
// The query is rounded to int16 with one scale per query and head (QuantizeQueryI16), so each
// score is an exact int32 dot product times one f32 epilogue, (scale * q_scale * row_scale) *
// dot. Integer sums do not depend on their order, so a score is the same bit for bit whichever
// rows and queries share a call and whichever target computes it; on AVX-512 a row takes two
// widening loads and two VPMADDWD per 64 values, and 16 rows share one horizontal sum, where
// f32 arithmetic took four widenings, four conversions, four FMAs and a sum of its own. The
// query's rounding moves each of its values by at most max|q| / 65534, against the cached K's
// own 1/254 of its row's largest.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/kv_row.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention_i8.cc"
// foreach_target must precede highway.h and the -inl headers.
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/simd_rows-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace deja::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DI = hn::ScalableTag<int32_t>;

// The rounded query is padded with zeros to a multiple of this many values.
constexpr int64_t kQueryLanes = 32;

HWY_INLINE int64_t PaddedDim(int64_t d) {
  return (d + kQueryLanes - 1) / kQueryLanes * kQueryLanes;
}

// q[0, d) rounded to int16 into out[0, PaddedDim(d)) (zeros past d); returns the scale. The
// largest value maps to KvQueryI16Max(d) (common/kv_row.h), as in KvQueryToI16. A zero query
// has scale 0; one with an infinity or NaN has scale NaN, so its scores are NaN as f32
// arithmetic would make them.
HWY_INLINE float QuantizeQueryI16(const float* q, int64_t d, int16_t* out) {
  const DF df;
  const hn::Rebind<int16_t, DF> d16;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto vmax = hn::Zero(df), vbad = hn::Zero(df);
  int64_t e = 0;
  for (; e + lanes <= d; e += lanes) {
    const auto v = hn::LoadU(df, q + e);
    vmax = hn::Max(vmax, hn::Abs(v));
    vbad = hn::MulAdd(v, hn::Zero(df), vbad);  // NaN once a value is infinite or NaN
  }
  float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
  float bad = hn::GetLane(hn::SumOfLanes(df, vbad));
  for (; e < d; ++e) {
    amax = std::max(amax, std::fabs(q[e]));
    bad += q[e] * 0.f;
  }
  std::fill(out, out + PaddedDim(d), int16_t{0});
  if (std::isnan(bad)) return std::numeric_limits<float>::quiet_NaN();
  if (amax == 0.f) return 0.f;
  const float qmax = KvQueryI16Max(d);
  const float inv = qmax / amax;
  const auto vinv = hn::Set(df, inv);
  for (e = 0; e + lanes <= d; e += lanes) {
    const auto r = hn::NearestInt(hn::Mul(hn::LoadU(df, q + e), vinv));
    hn::StoreU(hn::DemoteTo(d16, r), d16, out + e);
  }
  for (; e < d; ++e) {
    out[e] = static_cast<int16_t>(std::clamp(std::nearbyint(q[e] * inv), -qmax, qmax));
  }
  return amax / qmax;
}

// The exact dot product of a rounded query with an int8 row's d values.
HWY_INLINE int32_t DotI8(const int16_t* q, const int8_t* row, int64_t d) {
  const DI di;
  const hn::Rebind<int16_t, DI> d16;
  const hn::Rebind<int8_t, DI> d8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(di));
  auto acc = hn::Zero(di);
  int64_t e = 0;
  for (; e + lanes <= d; e += lanes) {
    acc = hn::Add(acc, hn::Mul(hn::PromoteTo(di, hn::LoadU(d16, q + e)),
                               hn::PromoteTo(di, hn::LoadU(d8, row + e))));
  }
  int32_t sum = hn::GetLane(hn::SumOfLanes(di, acc));
  for (; e < d; ++e) sum += int32_t{q[e]} * int32_t{row[e]};
  return sum;
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Head sizes up to this many 32-value chunks (WithCount8's) keep the rounded query in registers.
constexpr int64_t kMaxChunks = 8;

// 32 values of an int8 row from e (fewer at the row's end: the rest read as zeros, never
// touched), widened to int16.
HWY_INLINE __m512i LoadRowChunk(const int8_t* row, int64_t e, int64_t d) {
  const __m256i b =
      e + 32 <= d
          ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + e))
          : _mm256_maskz_loadu_epi8(static_cast<__mmask32>((uint64_t{1} << (d - e)) - 1), row + e);
  return _mm512_cvtepi8_epi16(b);
}

// One row's 16 int32 partial sums against the query's NC chunks.
template <int NC>
HWY_INLINE __m512 RowDotI8(const __m512i* qv, const int8_t* row, int64_t d) {
  __m512i acc = _mm512_madd_epi16(LoadRowChunk(row, 0, d), qv[0]);
  for (int c = 1; c < NC; ++c) {
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(LoadRowChunk(row, 32 * c, d), qv[c]));
  }
  return _mm512_castsi512_ps(acc);
}

// The same against a row widened already (PaddedDim(d) int16, zeros past d).
template <int NC>
HWY_INLINE __m512 RowDotI16(const __m512i* qv, const int16_t* row) {
  __m512i acc = _mm512_madd_epi16(_mm512_loadu_si512(row), qv[0]);
  for (int c = 1; c < NC; ++c) {
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_loadu_si512(row + 32 * c), qv[c]));
  }
  return _mm512_castsi512_ps(acc);
}

#endif

// The row `ahead` rows on: the line of its last byte (rows in slot order are contiguous, so its
// first line is the row before's last; PrefetchRow would ask for both).
HWY_INLINE void PrefetchRowI8(const int8_t* k, int64_t stride, const int32_t* rows, int64_t j,
                              int64_t count, int64_t ahead) {
  if (j + ahead < count)
    hwy::Prefetch(k + static_cast<int64_t>(rows[j + ahead]) * stride + stride - 1);
}

void DotRowsI8Impl(const float* q, const int8_t* k, const int32_t* rows, int64_t count, int64_t d,
                   float scale, float* scores) {
  const int64_t stride = KvRowElems(DType::kI8, d);
  const int64_t ahead = RowsAhead(stride);
  thread_local std::vector<int16_t> qbuf;
  qbuf.resize(static_cast<size_t>(PaddedDim(d)));
  const float sq = scale * QuantizeQueryI16(q, d, qbuf.data());
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  const int64_t nc = PaddedDim(d) / kQueryLanes;
  if (nc <= kMaxChunks) {
    WithCount8(nc, [&](auto nc_const) {
      constexpr int NC = decltype(nc_const)::value;
      __m512i qv[NC];
      for (int c = 0; c < NC; ++c) qv[c] = _mm512_loadu_si512(qbuf.data() + 32 * c);
      int64_t j0 = 0;
      for (; j0 + 16 <= count; j0 += 16) {
        HWY_ALIGN float row_scale[16];
        const __m512 sums = SumOfLanes16(
            [&](int r) {
              PrefetchRowI8(k, stride, rows, j0 + r, count, ahead);
              const int8_t* row = k + static_cast<int64_t>(rows[j0 + r]) * stride;
              row_scale[r] = sq * KvRowScale(row, d);
              return RowDotI8<NC>(qv, row, d);
            },
            AddI32{});
        _mm512_storeu_ps(scores + j0, _mm512_mul_ps(_mm512_load_ps(row_scale),
                                                    _mm512_cvtepi32_ps(_mm512_castps_si512(sums))));
      }
      // The last rows one by one (integer sums: the same in any order).
      for (; j0 < count; ++j0) {
        const int8_t* row = k + static_cast<int64_t>(rows[j0]) * stride;
        const int32_t dot = _mm512_reduce_add_epi32(_mm512_castps_si512(RowDotI8<NC>(qv, row, d)));
        scores[j0] = (sq * KvRowScale(row, d)) * static_cast<float>(dot);
      }
    });
    return;
  }
#endif
  for (int64_t j = 0; j < count; ++j) {
    PrefetchRowI8(k, stride, rows, j, count, ahead);
    const int8_t* row = k + static_cast<int64_t>(rows[j]) * stride;
    scores[j] = (sq * KvRowScale(row, d)) * static_cast<float>(DotI8(qbuf.data(), row, d));
  }
}

// nq queries: each is rounded once, and (AVX-512) each block of 16 rows is widened to int16
// once for all of them.
void DotRowsMultiI8Impl(const float* q, int64_t q_stride, int64_t nq, const int8_t* k,
                        const int32_t* rows, int64_t count, int64_t d, float scale, float* scores,
                        int64_t ld) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  const int64_t padded = PaddedDim(d), nc = padded / kQueryLanes;
  if (nq > 1 && nc <= kMaxChunks) {
    const int64_t stride = KvRowElems(DType::kI8, d);
    thread_local std::vector<int16_t> qbuf, kbuf;
    thread_local std::vector<float> sq;
    qbuf.resize(static_cast<size_t>(nq * padded));
    kbuf.resize(static_cast<size_t>(16 * padded));
    sq.resize(static_cast<size_t>(nq));
    for (int64_t i = 0; i < nq; ++i) {
      sq[i] = scale * QuantizeQueryI16(q + i * q_stride, d, qbuf.data() + i * padded);
    }
    WithCount8(nc, [&](auto nc_const) {
      constexpr int NC = decltype(nc_const)::value;
      for (int64_t j0 = 0; j0 < count; j0 += 16) {
        const int64_t nr = std::min<int64_t>(16, count - j0);
        HWY_ALIGN float row_scale[16] = {};
        for (int64_t r = 0; r < 16; ++r) {
          int16_t* dst = kbuf.data() + r * padded;
          if (r >= nr) {
            std::memset(dst, 0, static_cast<size_t>(padded) * sizeof(int16_t));
            continue;
          }
          const int8_t* row = k + static_cast<int64_t>(rows[j0 + r]) * stride;
          for (int c = 0; c < NC; ++c)
            _mm512_storeu_si512(dst + 32 * c, LoadRowChunk(row, 32 * c, d));
          row_scale[r] = KvRowScale(row, d);
        }
        const __m512 vscale = _mm512_load_ps(row_scale);
        const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
        for (int64_t i = 0; i < nq; ++i) {
          __m512i qv[NC];
          for (int c = 0; c < NC; ++c)
            qv[c] = _mm512_loadu_si512(qbuf.data() + i * padded + 32 * c);
          const __m512 sums = SumOfLanes16(
              [&](int r) { return RowDotI16<NC>(qv, kbuf.data() + r * padded); }, AddI32{});
          // (sq * row scale) per lane, as DotRowsI8Impl's scalar products.
          const __m512 s = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(sq[i]), vscale),
                                         _mm512_cvtepi32_ps(_mm512_castps_si512(sums)));
          _mm512_mask_storeu_ps(scores + i * ld + j0, mask, s);
        }
      }
    });
    return;
  }
#endif
  for (int64_t i = 0; i < nq; ++i) {
    DotRowsI8Impl(q + i * q_stride, k, rows, count, d, scale, scores + i * ld);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace deja::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deja::kernels::cpu {

HWY_EXPORT(DotRowsI8Impl);
HWY_EXPORT(DotRowsMultiI8Impl);

void DotRowsI8(const float* q, const int8_t* k, const int32_t* rows, int64_t count, int64_t d,
               float scale, float* scores) {
  HWY_DYNAMIC_DISPATCH(DotRowsI8Impl)(q, k, rows, count, d, scale, scores);
}
void DotRowsMultiI8(const float* q, int64_t q_stride, int64_t nq, const int8_t* k,
                    const int32_t* rows, int64_t count, int64_t d, float scale, float* scores,
                    int64_t ld) {
  HWY_DYNAMIC_DISPATCH(DotRowsMultiI8Impl)(q, q_stride, nq, k, rows, count, d, scale, scores, ld);
}

}  // namespace deja::kernels::cpu
#endif  // HWY_ONCE
