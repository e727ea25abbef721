// bf16 weights on the CPU: activations meet them as bf16. Every CPU op over a bf16 weight (Linear,
// the gathers, at any M) rounds x to bf16 (round to nearest even) and accumulates the exact
// products in f32: the same arithmetic as the CUDA backend's bf16 GEMM, and what lets CPUs with
// AVX512-BF16 multiply two bf16 pairs per f32 lane and instruction (kernels/cpu/linear_bf16.cc).
// CPUs without it widen the rounded x back to f32 and run the f32-activation kernels, so the
// arithmetic is the same everywhere up to summation order.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "kernels/cpu/simd.h"

namespace deja::kernels::cpu {

// The CPU supports AVX512-BF16 and the environment does not set DEJA_CPU_BF16_DOT=0.
bool Bf16DotAvailable();
// Whether Linear on bf16 weights uses LinearBf16Dot (initially Bf16DotAvailable()); tests turn it
// off to run the portable path on the same machine. Not thread-safe against running ops.
bool Bf16DotEnabled();
void SetBf16DotEnabled(bool on);

// out[i] = FloatToBF16(x[i]) for i in [0, n).
void RoundToBF16(const float* x, int64_t n, uint16_t* out);

// LinearSmallM / GatherLinearSmallM for bf16 x (bits, [M, K], row stride K) and bf16 weights w
// [*, K]; output column n reads row rows[n] (rows == nullptr: row n). Only when
// Bf16DotAvailable().
void LinearBf16Dot(const uint16_t* x, int64_t m_rows, int64_t k_dim, const uint16_t* w,
                   const int32_t* rows, int64_t n_begin, int64_t n_end,
                   const LinearEpilogue& epilogue, float* out, int64_t ldo);

// Linear over kTiled16 bf16 weights (common/tensor.h), only when Bf16DotAvailable(). x is bf16
// [M, K] packed by PackBf16Pairs into `out` (M * TiledCols(K) values): blocks of kTiledXBlock
// rows, each [K/2][block rows][2]. LinearBf16Tiled computes the output columns of tiles
// [t_begin, t_end) (tile t = rows [16 t, 16 t + 16) of w, N = n_dim); callers split the tiles in
// multiples of TiledGroup(M).
constexpr int64_t kTiledXBlock = 16;
void PackBf16Pairs(const uint16_t* x, int64_t m_rows, int64_t k_dim, uint16_t* out);
// RoundToBF16 then PackBf16Pairs in one pass over f32 x (the same bits); any CPU.
void RoundPackBf16Pairs(const float* x, int64_t m_rows, int64_t k_dim, uint16_t* out);
int64_t TiledGroup(int64_t m_rows);
void LinearBf16Tiled(const uint16_t* xp, int64_t m_rows, int64_t k_dim, const uint16_t* w,
                     int64_t n_dim, int64_t t_begin, int64_t t_end, const LinearEpilogue& epilogue,
                     float* out, int64_t ldo);

// LinearBf16Tiled over kTiled16 int8 weights (e.scale required): the same packed x, tiles and
// splitting; the int8 values are widened to bf16 in registers.
void LinearI8Tiled(const uint16_t* xp, int64_t m_rows, int64_t k_dim, const int8_t* w,
                   int64_t n_dim, int64_t t_begin, int64_t t_end, const LinearEpilogue& epilogue,
                   float* out, int64_t ldo);

// The peak-throughput probe's loop: 16 independent VDPBF16PS chains for `iters` rounds; returns
// the FLOPs done. Only when Bf16DotAvailable().
double Bf16DotLoop(int64_t iters, float seed);

}  // namespace deja::kernels::cpu
