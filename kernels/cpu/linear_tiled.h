// Internal to the tiled Linear kernels (kernels/cpu/linear_bf16.cc for bf16 weights,
// kernels/cpu/linear_i8.cc for int8): the pieces both use, compiled for AVX512-BF16 under a
// function-level target attribute (Highway 1.0.3 has no such target), so only code that runs
// after Bf16DotAvailable() may call them.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/tensor.h"
#include "kernels/cpu/bf16_dot.h"

#define DEJA_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

namespace deja::kernels::cpu {

// Tiles per group for MB rows of x: up to 24 accumulators, at most 8 tiles; a full block of 16
// rows runs one tile at a time (16 accumulators), so each weight line is read once for all 16.
constexpr int NbFor(int mb) {
  return mb == 16 ? 1 : mb >= 8 ? 24 / mb : (24 / mb > 8 ? 8 : 24 / mb);
}

// The tiled kernels' epilogue: NB tiles x MB rows of accumulators (acc[b][m] holds output
// columns n0 + 16 b .. + 16 of row m), times the int8 scale when there is one, plus bias, ReLU,
// accumulation, stored with a mask on the last partial tile.
template <int NB, int MB>
DEJA_BF16_TARGET inline void StoreTiles(__m512 (&acc)[NB][MB], int64_t n0, int64_t n_dim,
                                        const LinearEpilogue& e, float* out, int64_t ldo) {
  for (int b = 0; b < NB; ++b) {
    const int64_t n = n0 + b * kTileRows;
    const int64_t valid = std::min<int64_t>(kTileRows, n_dim - n);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const __m512 bias =
        e.bias != nullptr ? _mm512_maskz_loadu_ps(mask, e.bias + n) : _mm512_setzero_ps();
    const __m512 scale =
        e.scale != nullptr ? _mm512_maskz_loadu_ps(mask, e.scale + n) : _mm512_setzero_ps();
    for (int m = 0; m < MB; ++m) {
      __m512 v = e.scale != nullptr ? _mm512_fmadd_ps(acc[b][m], scale, bias)
                                    : _mm512_add_ps(acc[b][m], bias);
      if (e.relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
      float* o = out + m * ldo + n;
      if (e.accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, o));
      _mm512_mask_storeu_ps(o, mask, v);
    }
  }
}

// `count` tiles in blocks of kNb, then the rest in blocks of 4, 2 and 1: run(block, first tile)
// with the block size as a std::integral_constant.
template <int kNb, typename Run>
inline void ForTileBlocks(int64_t count, Run&& run) {
  int64_t t = 0;
  for (; t + kNb <= count; t += kNb) run(std::integral_constant<int, kNb>{}, t);
  if constexpr (kNb > 4) {
    if (t + 4 <= count) run(std::integral_constant<int, 4>{}, t), t += 4;
  }
  if constexpr (kNb > 2) {
    if (t + 2 <= count) run(std::integral_constant<int, 2>{}, t), t += 2;
  }
  if (t < count) run(std::integral_constant<int, 1>{}, t);
}

// The bf16 micro-kernel over `count` tiles of bf16 weights (tile_stride values apart) against one
// block of mb (1..kTiledXBlock) rows of x packed by PackBf16Pairs, for output columns from n0:
// groups of TiledGroup(mb) tiles, then blocks of 4, 2 and 1. prefetch: elements ahead in each tile
// to prefetch (0: none).
void RunTiledBf16(int64_t mb, const uint16_t* tiles, int64_t tile_stride, int64_t count,
                  const uint32_t* x, int64_t pairs, int64_t n0, int64_t n_dim,
                  const LinearEpilogue& e, float* out, int64_t ldo, int64_t prefetch);

}  // namespace deja::kernels::cpu
