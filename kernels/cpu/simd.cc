// Vector building blocks (conversion, dot, axpy, exp sums, LayerNorm rows), compiled once per
// x86 target by Highway's foreach_target and dispatched at run time.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

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
#include "kernels/cpu/simd_rows-inl.h"
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

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// AVX-512 pieces of DotRowsMulti for head sizes that are a multiple of 16 (a single query's rows
// gain nothing from them: decode attention waits on memory). DotTyped's vector part
// for one row: its two accumulator chains and their sum, before the horizontal reduction.
template <typename KT>
HWY_INLINE __m512 RowDot16(const float* q, const KT* row, int64_t d) {
  const DF df;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t e = 0;
  for (; e + 32 <= d; e += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + e), LoadWidened(df, row + e).raw, acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + e + 16), LoadWidened(df, row + e + 16).raw, acc1);
  }
  for (; e + 16 <= d; e += 16)
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + e), LoadWidened(df, row + e).raw, acc0);
  return _mm512_add_ps(acc0, acc1);
}

// RowDot16 with the head size known at compile time and q in registers (qv: D / 16 vectors).
template <int D>
HWY_INLINE __m512 RowDotQ(const __m512* qv, const float* row) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int e = 0;
  for (; e + 32 <= D; e += 32) {
    acc0 = _mm512_fmadd_ps(qv[e / 16], _mm512_loadu_ps(row + e), acc0);
    acc1 = _mm512_fmadd_ps(qv[e / 16 + 1], _mm512_loadu_ps(row + e + 16), acc1);
  }
  for (; e + 16 <= D; e += 16) acc0 = _mm512_fmadd_ps(qv[e / 16], _mm512_loadu_ps(row + e), acc0);
  return _mm512_add_ps(acc0, acc1);
}
#endif

// DotImpl's arithmetic per row, so each score is bit-identical to Dot's (f32 rows). Rows are
// `stride` elements apart. int8 rows take DotRowsI8 (attention_i8.cc).
template <typename KT>
void DotRowsTyped(const float* q, const KT* k, int64_t stride, const int32_t* rows, int64_t count,
                  int64_t d, float scale, float* scores) {
  const int64_t row_bytes = stride * static_cast<int64_t>(sizeof(KT));
  const int64_t ahead = RowsAhead(row_bytes);
  for (int64_t j = 0; j < count; ++j) {
    PrefetchRow(k, stride, rows, j, count, row_bytes, ahead);
    const KT* row = k + static_cast<int64_t>(rows[j]) * stride;
    scores[j] = scale * DotTyped(q, row, d);
  }
}

void DotRowsImpl(const float* q, const void* k, DType k_dtype, const int32_t* rows, int64_t count,
                 int64_t d, float scale, float* scores) {
  const int64_t stride = KvRowElems(k_dtype, d);
  if (k_dtype == DType::kF16) {
    return DotRowsTyped(q, static_cast<const hwy::float16_t*>(k), stride, rows, count, d, scale,
                        scores);
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

// DotRowsTyped for nq queries. On AVX-512 with d a multiple of 16, 16 rows at a time are widened
// into an L1 buffer once, then every query runs RowDot16 over each and SumOfLanes16 over the 16:
// each score DotTyped's bit for bit. Elsewhere the queries take DotRowsTyped one by one.
template <typename KT>
void DotRowsMultiTyped(const float* q, int64_t q_stride, int64_t nq, const KT* k, int64_t stride,
                       const int32_t* rows, int64_t count, int64_t d, float scale, float* scores,
                       int64_t ld) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (d % 16 == 0 && nq > 1) {
    const DF df;
    thread_local std::vector<float> buffer;
    buffer.resize(static_cast<size_t>(16 * d));
    float* kbuf = buffer.data();
    for (int64_t j0 = 0; j0 < count; j0 += 16) {
      const int64_t nr = std::min<int64_t>(16, count - j0);
      HWY_ALIGN float row_scale[16] = {};
      for (int64_t r = 0; r < 16; ++r) {
        float* dst = kbuf + r * d;
        if (r >= nr) {
          std::memset(dst, 0, static_cast<size_t>(d) * sizeof(float));
          continue;
        }
        const KT* row = k + static_cast<int64_t>(rows[j0 + r]) * stride;
        for (int64_t e = 0; e < d; e += 16) hn::StoreU(LoadWidened(df, row + e), df, dst + e);
        row_scale[r] = scale;
      }
      const __m512 vscale = _mm512_load_ps(row_scale);
      const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
      for (int64_t i = 0; i < nq; ++i) {
        const float* qi = q + i * q_stride;
        __m512 sums;
        auto fixed = [&](auto d_const) {
          constexpr int D = decltype(d_const)::value;
          __m512 qv[D / 16];
          for (int e = 0; e < D / 16; ++e) qv[e] = _mm512_loadu_ps(qi + 16 * e);
          sums = SumOfLanes16([&](int r) { return RowDotQ<D>(qv, kbuf + r * D); });
        };
        if (d == 64) {
          fixed(std::integral_constant<int, 64>());
        } else if (d == 128) {
          fixed(std::integral_constant<int, 128>());
        } else if (d == 80) {
          fixed(std::integral_constant<int, 80>());
        } else {
          sums = SumOfLanes16([&](int r) { return RowDot16(qi, kbuf + r * d, d); });
        }
        const __m512 s = _mm512_mul_ps(vscale, sums);
        _mm512_mask_storeu_ps(scores + i * ld + j0, mask, s);
      }
    }
    return;
  }
#endif
  for (int64_t i = 0; i < nq; ++i) {
    DotRowsTyped(q + i * q_stride, k, stride, rows, count, d, scale, scores + i * ld);
  }
}

void DotRowsMultiImpl(const float* q, int64_t q_stride, int64_t nq, const void* k, DType k_dtype,
                      const int32_t* rows, int64_t count, int64_t d, float scale, float* scores,
                      int64_t ld) {
  const int64_t stride = KvRowElems(k_dtype, d);
  if (k_dtype == DType::kF16) {
    return DotRowsMultiTyped(q, q_stride, nq, static_cast<const hwy::float16_t*>(k), stride, rows,
                             count, d, scale, scores, ld);
  }
  DotRowsMultiTyped(q, q_stride, nq, static_cast<const float*>(k), stride, rows, count, d, scale,
                    scores, ld);
}

// One chunk [c0, c0 + NV lanes) of WeightedSumRowsTyped for G queries: each visible row's NV
// vectors are widened once and fused into every query's accumulators that sees it, in list
// order, so each query's chunk is WeightedSumRowsTyped's bit for bit. G and NV are compile-time
// and the loops unrolled, so the accumulators stay in registers.
template <int NV, int G, typename VT>
void WeightedSumChunk(const float* p, int64_t ld, const int32_t* q_pos, const VT* v, int64_t stride,
                      const int32_t* rows, const int32_t* row_pos, int64_t count, int64_t d,
                      int64_t c0, float* out, int64_t out_stride) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int32_t lo = q_pos[0], hi = q_pos[0];
  for (int g = 1; g < G; ++g) {
    lo = std::min(lo, q_pos[g]);
    hi = std::max(hi, q_pos[g]);
  }
  hn::Vec<DF> acc[G][NV];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) acc[g][i] = hn::Zero(df);
  for (int64_t j = 0; j < count; ++j) {
    const int32_t pos = row_pos[j];
    if (pos > hi) continue;
    const VT* base = v + static_cast<int64_t>(rows[j]) * stride;
    // An int8 row's weight is its probability times its scale, as in WeightedSumRowsTyped.
    float row_scale = 1.f;
    if constexpr (std::is_same_v<VT, int8_t>) row_scale = KvRowScale(base, d);
    hn::Vec<DF> x[NV];
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) x[i] = LoadWidened(df, base + c0 + i * lanes);
    const bool all = pos <= lo;
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      if (!all && pos > q_pos[g]) continue;
      float w = p[g * ld + j];
      if constexpr (std::is_same_v<VT, int8_t>) w *= row_scale;
      const auto pj = hn::Set(df, w);
#pragma GCC unroll 8
      for (int i = 0; i < NV; ++i) acc[g][i] = hn::MulAdd(pj, x[i], acc[g][i]);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) hn::StoreU(acc[g][i], df, out + g * out_stride + c0 + i * lanes);
}

// The last ng < G queries of a call, with a group of exactly ng.
template <int NV, int G, typename VT, typename... Args>
void WeightedSumRest(int64_t ng, Args... args) {
  if constexpr (G > 1) {
    if (ng == G - 1) return WeightedSumChunk<NV, G - 1, VT>(args...);
    WeightedSumRest<NV, G - 1, VT>(ng, args...);
  }
}

template <int NV, typename VT>
void WeightedSumChunks(const float* p, int64_t ld, int64_t nq, const int32_t* q_pos, const VT* v,
                       int64_t stride, const int32_t* rows, const int32_t* row_pos, int64_t count,
                       int64_t d, int64_t c0, float* out, int64_t out_stride) {
  // Accumulators for as many queries as the registers hold beside the row's NV vectors.
  constexpr int kRegs = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 ? 24 : 10;
  constexpr int G = std::clamp(kRegs / NV, 1, 8);
  int64_t g0 = 0;
  for (; g0 + G <= nq; g0 += G) {
    WeightedSumChunk<NV, G, VT>(p + g0 * ld, ld, q_pos + g0, v, stride, rows, row_pos, count, d, c0,
                                out + g0 * out_stride, out_stride);
  }
  if (g0 < nq) {
    WeightedSumRest<NV, G, VT>(nq - g0, p + g0 * ld, ld, q_pos + g0, v, stride, rows, row_pos,
                               count, d, c0, out + g0 * out_stride, out_stride);
  }
}

template <typename VT>
void WeightedSumRowsMultiTyped(const float* p, int64_t ld, int64_t nq, const int32_t* q_pos,
                               const VT* v, int64_t stride, const int32_t* rows,
                               const int32_t* row_pos, int64_t count, int64_t d, float* out,
                               int64_t out_stride) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kChunk = 8;  // WeightedSumRowsTyped's
  const int64_t full = d / lanes * lanes;
  for (int64_t c0 = 0; c0 < full; c0 += kChunk * lanes) {
    const int64_t nv = std::min<int64_t>(kChunk, (full - c0) / lanes);
    auto run = [&](auto tag) {
      WeightedSumChunks<decltype(tag)::value>(p, ld, nq, q_pos, v, stride, rows, row_pos, count, d,
                                              c0, out, out_stride);
    };
    WithCount8(nv, run);
  }
  if (full == d) return;
  // The tail elements, per query as WeightedSumRowsTyped adds them.
  for (int64_t i = 0; i < nq; ++i) {
    float* o = out + i * out_stride;
    for (int64_t e = full; e < d; ++e) o[e] = 0.f;
    for (int64_t j = 0; j < count; ++j) {
      if (row_pos[j] > q_pos[i]) continue;
      const VT* row = v + static_cast<int64_t>(rows[j]) * stride;
      float w = p[i * ld + j];
      if constexpr (std::is_same_v<VT, int8_t>) w *= KvRowScale(row, d);
      for (int64_t e = full; e < d; ++e) o[e] += w * ScalarToFloat(row[e]);
    }
  }
}

void WeightedSumRowsMultiImpl(const float* p, int64_t ld, int64_t nq, const int32_t* q_pos,
                              const void* v, DType v_dtype, const int32_t* rows,
                              const int32_t* row_pos, int64_t count, int64_t d, float* out,
                              int64_t out_stride) {
  const int64_t stride = KvRowElems(v_dtype, d);
  if (v_dtype == DType::kF16) {
    return WeightedSumRowsMultiTyped(p, ld, nq, q_pos, static_cast<const hwy::float16_t*>(v),
                                     stride, rows, row_pos, count, d, out, out_stride);
  }
  if (v_dtype == DType::kI8) {
    return WeightedSumRowsMultiTyped(p, ld, nq, q_pos, static_cast<const int8_t*>(v), stride, rows,
                                     row_pos, count, d, out, out_stride);
  }
  WeightedSumRowsMultiTyped(p, ld, nq, q_pos, static_cast<const float*>(v), stride, rows, row_pos,
                            count, d, out, out_stride);
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
HWY_EXPORT(DotRowsMultiImpl);
HWY_EXPORT(WeightedSumRowsMultiImpl);
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
  if (k_dtype == DType::kI8) {
    return DotRowsI8(q, static_cast<const int8_t*>(k), rows, count, d, scale, scores);
  }
  HWY_DYNAMIC_DISPATCH(DotRowsImpl)(q, k, k_dtype, rows, count, d, scale, scores);
}
void WeightedSumRows(const float* p, const void* v, DType v_dtype, const int32_t* rows,
                     int64_t count, int64_t d, float* out) {
  HWY_DYNAMIC_DISPATCH(WeightedSumRowsImpl)(p, v, v_dtype, rows, count, d, out);
}
void DotRowsMulti(const float* q, int64_t q_stride, int64_t nq, const void* k, DType k_dtype,
                  const int32_t* rows, int64_t count, int64_t d, float scale, float* scores,
                  int64_t ld) {
  if (k_dtype == DType::kI8) {
    return DotRowsMultiI8(q, q_stride, nq, static_cast<const int8_t*>(k), rows, count, d, scale,
                          scores, ld);
  }
  HWY_DYNAMIC_DISPATCH(DotRowsMultiImpl)
  (q, q_stride, nq, k, k_dtype, rows, count, d, scale, scores, ld);
}
void WeightedSumRowsMulti(const float* p, int64_t ld, int64_t nq, const int32_t* q_pos,
                          const void* v, DType v_dtype, const int32_t* rows, const int32_t* row_pos,
                          int64_t count, int64_t d, float* out, int64_t out_stride) {
  HWY_DYNAMIC_DISPATCH(WeightedSumRowsMultiImpl)
  (p, ld, nq, q_pos, v, v_dtype, rows, row_pos, count, d, out, out_stride);
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
