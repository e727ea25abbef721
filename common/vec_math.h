// Vector helpers over host memory that both the CPU kernels and the engine's host-side code use:
// dtype conversion of a row, the max and exp-sums of a row (softmax, log-sum-exp for sampling),
// and the H2O decode eviction's victim search. Each dispatches at run time (Google Highway) to
// the best instruction set of the running CPU; none touches a thread pool.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace deja {

// dst[i] = src[i] (+ dst[i] when accumulate), src in dtype (f32, f16, bf16, or int8: the integer
// values, without a scale) widened to f32.
void ConvertToF32(const void* src, DType dtype, int64_t n, float* dst, bool accumulate);
// dst[i] = src[i] stored as dtype: f32 (a copy), f16 (nearest even on every x86 target with
// F16C; plain SSE4 targets truncate) or bf16 (nearest even, FloatToBF16).
void ConvertFromF32(const float* src, int64_t n, DType dtype, void* dst);
// The largest of x[0..n) (-inf when n is 0); NaN when any entry is NaN.
float MaxOf(const float* x, int64_t n);
// x[i] = exp(x[i] - shift); returns the sum of the results.
float ExpShiftInPlace(float* x, int64_t n, float shift);
// Returns sum_i exp(x[i] - shift) without writing anything.
float SumExpShift(const float* x, int64_t n, float shift);
// The H2O decode eviction's choice: the index s in [0, n) with 0 <= pos[s] < pos_limit whose
// (score[s], pos[s]) is lowest (the lowest score, ties to the lower position), or -1 when no
// slot qualifies. Positions are distinct; scores finite.
int32_t LowestScoreSlot(const int32_t* pos, const float* score, int64_t n, int32_t pos_limit);

}  // namespace deja
