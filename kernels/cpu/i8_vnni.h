// int8 weights against int8 activations on CPUs with AVX512-VNNI: Linear over kTiled16 int8
// weights at every row count. Each row of x is quantized to int8 with its own scale (dynamic:
// scale = max |x_row| / 127, or / 255 for a row without negative values) and VPDPBUSD multiplies
// 64 u8 x s8 pairs per instruction into 16 int32 lanes, twice the products of VDPBF16PS. The
// quantization of x is lossy by design, so this path computes a different function from the
// bf16-x path (ref::LinearI8QuantizedX defines it). Decode steps take it too: each row is
// quantized on its own, so a token's result does not depend on the rows beside it in its step
// (other sequences' tokens, or the rest of its prompt's chunk). A switch by row count would make
// a decode token's logits depend on whether its step also held a prefill chunk.
#pragma once

#include <cstdint>

#include "kernels/cpu/simd.h"

namespace deja::kernels::cpu {

// The CPU supports AVX512-VNNI (and AVX512-BF16, which tiles int8 weights in the first place) and
// the environment does not set DEJA_CPU_VNNI=0.
bool VnniAvailable();
// Whether Linear over tiled int8 weights takes this path (initially VnniAvailable()); tests
// switch it. Not thread-safe against running ops.
bool VnniEnabled();
void SetVnniEnabled(bool on);
// Linear over tiled int8 weights quantizes x (also needs Bf16DotEnabled()).
inline bool QuantizesX() { return VnniEnabled(); }

// The quantization of one row of x [k] (the definition the kernels and the reference share):
// amax = max |x|; levels = 255 if no x < 0, else 127; inv = levels / amax in f32; q = (x * inv in
// f32, rounded to nearest even) + zero, zero = 0 if no x < 0, else 128; returns the scale
// amax / levels (0 for an all-zero row, whose q are the zero point), so x ~ scale * (q - zero).
// x must be finite.
float QuantizeRowU8(const float* x, int64_t k, uint8_t* q, int32_t* zero);

// Bytes of x quantized and packed for LinearI8Vnni (M rows, K columns).
int64_t VnniPackedBytes(int64_t m_rows, int64_t k_dim);
// Rows [m_begin, m_end) of x [M, K] quantized (scales[m], zeros[m]) and packed into `packed`
// (VnniPackedBytes(M, K)): blocks of kVnniRowBlock rows. Threads may split the rows anywhere.
constexpr int64_t kVnniRowBlock = 6;
void QuantizePackX(const float* x, int64_t m_rows, int64_t k_dim, int64_t m_begin, int64_t m_end,
                   uint8_t* packed, float* scales, int32_t* zeros);

// Output columns of tiles [t_begin, t_end) of kTiled16 int8 weights w (N = n_dim, e.scale
// required) for x packed by QuantizePackX (all M rows); callers split the tiles in multiples of
// kVnniTileGroup. Only when VnniAvailable().
constexpr int64_t kVnniTileGroup = 4;
// Up to this many rows of x the tiles are read directly, each pair line permuted into its quad in
// registers (decode steps); from there on each group of tiles is repacked once per call into an
// L2 scratch that every block of rows reads.
constexpr int64_t kVnniDirectMaxM = 8;
// The int8 and int4 decode kernels, for one or two rows of x, ask for each tile's line this far
// ahead: the hardware prefetcher alone left batch-1 decode ~10% short. Measured on the OPT-1.3B
// shape at batch 1, int4 (2-core Xeon): 512 / 1,024 / 2,048 / 4,096 / 8,192 bytes gave 31.4 /
// 29.7 / 29.0 / 30.9 / 32.1 ms per token against 32.0 without.
constexpr int64_t kDecodePrefetchBytes = 2048;
void LinearI8Vnni(const uint8_t* packed, const float* x_scales, const int32_t* x_zeros,
                  int64_t m_rows, int64_t k_dim, const int8_t* w, int64_t n_dim, int64_t t_begin,
                  int64_t t_end, const LinearEpilogue& epilogue, float* out, int64_t ldo);

// The repack of the large-M path: `count` (<= kVnniTileGroup) tiles tile_stride bytes apart, of
// `pairs` K pairs, as K quads into dst ([quads][count][64 bytes], 64-byte aligned), and
// sums[16 b + r] = the sum of row r of tile b (the AMX kernel reads the same layout).
void RepackI8Group(const int8_t* tiles, int64_t tile_stride, int count, int64_t pairs,
                   int8_t* dst, int32_t* sums);

// The peak-throughput probe's loop: 16 independent VPDPBUSD chains for `iters` rounds; returns
// the int8 operations done (2 per multiply-add). Only when VnniAvailable().
double VnniDotLoop(int64_t iters, float seed);

}  // namespace deja::kernels::cpu
