// Top-k selection over predictor scores (Deja Vu, docs/architecture.md#deja-vu-lookahead).
#pragma once

#include <cstdint>

namespace deja::worker::dejavu {

// Writes to out[0..k) the k best of scores[0..units) under (score descending, unit ascending), in
// ascending unit order. Requires 0 <= k <= units. -0 and +0 are equal scores; a NaN ranks by its
// bits (sign clear: above +inf; sign set: below -inf).
void SelectTopKUnits(const float* scores, int64_t units, int32_t k, int32_t* out);

}  // namespace deja::worker::dejavu
