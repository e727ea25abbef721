// int8 weights against int8 activations on CPUs with AVX512-VNNI: the prefill path of Linear over
// kTiled16 int8 weights. From kVnniMinM rows of x on, each row of x is quantized to int8 with its
// own scale (dynamic: scale = max |x_row| / 127, or / 255 for a row without negative values) and
// VPDPBUSD multiplies 64 u8 x s8 pairs per instruction into 16 int32 lanes, twice the products of
// VDPBF16PS. The quantization of x is lossy by design, so this path computes a different function
// from the bf16-x path (ref::LinearI8QuantizedX defines it); decode-sized M keeps the bf16-x
// kernels.
#pragma once

#include <cstdint>

#include "kernels/cpu/simd.h"

namespace deja::kernels::cpu {

// Rows of x from which Linear over tiled int8 weights quantizes x: past one block of x for the
// bf16 kernels (kTiledXBlock), so decode batches up to 16 keep bf16 x. Measured (8192 x 2048, one
// thread, two runs each, the other core busy): M = 24 3.0 ms against 5.4-9.6 ms with bf16 x,
// M = 32 3.6 against 6.9-7.2, M = 48 5.0-6.6 against 9.2; M = 16 2.35 against 2.8-3.0.
constexpr int64_t kVnniMinM = 17;

// The CPU supports AVX512-VNNI (and AVX512-BF16, which tiles int8 weights in the first place) and
// the environment does not set DEJA_CPU_VNNI=0.
bool VnniAvailable();
// Whether Linear over tiled int8 weights takes this path for m_rows >= kVnniMinM (initially
// VnniAvailable()); tests switch it. Not thread-safe against running ops.
bool VnniEnabled();
void SetVnniEnabled(bool on);
// Linear over tiled int8 weights quantizes these many rows of x (also needs Bf16DotEnabled()).
inline bool QuantizesX(int64_t m_rows) { return m_rows >= kVnniMinM && VnniEnabled(); }

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
void LinearI8Vnni(const uint8_t* packed, const float* x_scales, const int32_t* x_zeros,
                  int64_t m_rows, int64_t k_dim, const int8_t* w, int64_t n_dim, int64_t t_begin,
                  int64_t t_end, const LinearEpilogue& epilogue, float* out, int64_t ldo);

// The peak-throughput probe's loop: 16 independent VPDPBUSD chains for `iters` rounds; returns
// the int8 operations done (2 per multiply-add). Only when VnniAvailable().
double VnniDotLoop(int64_t iters, float seed);

}  // namespace deja::kernels::cpu
