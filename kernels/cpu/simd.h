// Single-threaded SIMD building blocks of the CPU backend. Each entry point dispatches at run
// time (Google Highway) to the best instruction set of the running CPU. Callers split work
// across threads; these functions never touch the thread pool.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/vec_math.h"  // the row helpers shared with the engine (namespace deja)

namespace deja::kernels::cpu {

float Dot(const float* a, const float* b, int64_t n);
// y += a * x
void Axpy(float a, const float* x, float* y, int64_t n);
// The attention inner loops in one dispatched call each (rows index the KV rows of k / v,
// common/kv_row.h: f32, f16 or int8 with its scale, widened in registers): scores[j] = scale *
// Dot(q, k + rows[j] * d, d) (int8 rows: DotRowsI8 below), and out[0, d) = sum_j p[j] *
// v[rows[j] * d ..]; for f32 rows each bit-identical to the per-row Dot / Axpy loop it replaces.
void DotRows(const float* q, const void* k, DType k_dtype, const int32_t* rows, int64_t count,
             int64_t d, float scale, float* scores);
void WeightedSumRows(const float* p, const void* v, DType v_dtype, const int32_t* rows,
                     int64_t count, int64_t d, float* out);
// The same two loops for nq queries of one head over one row list (prefill), each query's result
// bit-identical to the single-query call above, so a token's attention does not depend on the
// queries beside it. DotRowsMulti: scores[i * ld + j] = DotRows(q + i * q_stride, ..)[j]; each
// K row is widened once per call and (AVX-512) 16 rows' sums are reduced together in the same
// addition tree as one row's. WeightedSumRowsMulti: out + i * out_stride = WeightedSumRows over
// the rows j with row_pos[j] <= q_pos[i], in list order, with weights p[i * ld + j]; each V row
// is widened once per group of queries, which accumulate in registers.
void DotRowsMulti(const float* q, int64_t q_stride, int64_t nq, const void* k, DType k_dtype,
                  const int32_t* rows, int64_t count, int64_t d, float scale, float* scores,
                  int64_t ld);
void WeightedSumRowsMulti(const float* p, int64_t ld, int64_t nq, const int32_t* q_pos,
                          const void* v, DType v_dtype, const int32_t* rows,
                          const int32_t* row_pos, int64_t count, int64_t d, float* out,
                          int64_t out_stride);
// DotRows and DotRowsMulti for int8 rows (attention_i8.cc; DotRows* route kI8 there): the query
// rounded to int16 per query, each score an exact integer dot product times (scale * query
// scale * row scale), so equal bit for bit however rows and queries are grouped, on every target.
void DotRowsI8(const float* q, const int8_t* k, const int32_t* rows, int64_t count, int64_t d,
               float scale, float* scores);
void DotRowsMultiI8(const float* q, int64_t q_stride, int64_t nq, const int8_t* k,
                    const int32_t* rows, int64_t count, int64_t d, float scale, float* scores,
                    int64_t ld);
// y += x
void AddInto(const float* x, float* y, int64_t n);
// y += x + b
void AddBiasedInto(const float* x, const float* b, float* y, int64_t n);
// out[i] = (x[i] - a) - b (out may be x). Two subtractions, not x - (a + b): with a the row
// max and b a log-sum, the first is exact near the max, keeping the top log-probs precise.
void SubtractTwice(const float* x, int64_t n, float a, float b, float* out);
// One LayerNorm row with f32 gamma/beta; out may be x.
void LayerNormRow(const float* x, int64_t n, const float* gamma, const float* beta, float eps,
                  float* out);

// What a Linear kernel does with each raw dot product before storing it.
struct LinearEpilogue {
  const float* bias = nullptr;  // f32 [N] or null
  bool relu = false;
  bool accumulate = false;
  // f32 [N] or null: int8 weights' per-output-column scales, multiplied into the dot product
  // before the bias.
  const float* scale = nullptr;
};

// out[m, n] for m in [0, M), n in [n_begin, n_end) of out = epilogue(x[m, :] · w[n, :]). Streams
// each weight row once from memory and reuses it, widened in registers, for every row of x:
// the decode-time kernel (M up to a few dozen). x is [M, K] with row stride K, out has row
// stride ldo.
void LinearSmallM(const float* x, int64_t m_rows, int64_t k_dim, const void* w, DType w_dtype,
                  int64_t n_begin, int64_t n_end, const LinearEpilogue& epilogue, float* out,
                  int64_t ldo);

// LinearSmallM over an index list: output column n in [n_begin, n_end) reads weight row
// rows[n] of w [*, K] (the decode-time gather-GEMV). Epilogue bias is indexed by n (compact).
void GatherLinearSmallM(const float* x, int64_t m_rows, int64_t k_dim, const void* w, DType w_dtype,
                        const int32_t* rows, int64_t n_begin, int64_t n_end,
                        const LinearEpilogue& epilogue, float* out, int64_t ldo);

// out[m, n] (+)= sum_j x[m, j] * wt[rows[j], n] for m in [0, M), n in [n_begin, n_end): the
// decode-time gather-transposed-GEMV. x is [M, n_rows] with row stride n_rows, wt [*, N] in
// w_dtype, out [M, N] with row stride N. Without accumulate the columns are overwritten.
void GatherLinearTSmallM(const float* x, int64_t m_rows, const void* wt, DType w_dtype,
                         int64_t n_dim, const int32_t* rows, int64_t n_rows, int64_t n_begin,
                         int64_t n_end, bool accumulate, float* out);

// Name of the instruction set the dispatcher picked (for benchmarks and logs).
const char* SimdTargetName();

}  // namespace deja::kernels::cpu
