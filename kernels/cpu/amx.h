// int8 and int4 weights against int8 activations on Intel AMX (AMX-TILE, AMX-INT8: Sapphire
// Rapids and later): the same integer products as the AVX512-VNNI kernels (i8_vnni.h,
// LinearI4), summed exactly in int32 by the tile unit 16 rows x 16 columns x 64 K at a time, then
// the same f32 steps in the same order, so each output is bit-identical to the VNNI kernel's.
// That is what lets the backend choose between them by row count without a row's result
// depending on the rows beside it: decode steps of a few rows stay on VNNI (their weights are
// read once either way), prefill chunks and larger decode batches take the tiles (16x the
// products per instruction).
#pragma once

#include <cstdint>

#include "kernels/cpu/simd.h"

namespace deja::kernels::cpu {

// The CPU has AMX-TILE and AMX-INT8, the kernel grants this process the tile state
// (arch_prctl ARCH_REQ_XCOMP_PERM), VnniAvailable(), and the environment does not set
// DEJA_CPU_AMX=0.
bool AmxAvailable();
// Whether the int8 and int4 Linears take the tiles where the row count allows (initially
// AmxAvailable()); tests switch it. Not thread-safe against running ops.
bool AmxEnabled();
void SetAmxEnabled(bool on);

constexpr int64_t kAmxRows = 16;  // rows of x per tile
inline int64_t AmxPaddedRows(int64_t m_rows) { return (m_rows + kAmxRows - 1) / kAmxRows * kAmxRows; }

// int8 weights (kTiled16): from more than kVnniDirectMaxM rows (where the VNNI kernel repacks the
// tiles into K quads, the layout the tile unit reads). x goes in row by row, each row quantized
// by QuantizeRowU8 (the VNNI kernel's quantization) and padded to whole 64-byte K steps.
int64_t AmxXStride(int64_t k_dim);
int64_t AmxPackedBytes(int64_t m_rows, int64_t k_dim);  // AmxPaddedRows(m) rows of AmxXStride(k)
void QuantizeRowsX(const float* x, int64_t k_dim, int64_t m_begin, int64_t m_end,
                   uint8_t* packed, float* scales, int32_t* zeros);
// LinearI8Vnni's contract (tiles [t_begin, t_end), in multiples of kVnniTileGroup), x packed
// by QuantizeRowsX (all rows). Only when AmxEnabled().
void LinearI8Amx(const uint8_t* packed, const float* x_scales, const int32_t* x_zeros,
                 int64_t m_rows, int64_t k_dim, const int8_t* w, int64_t n_dim, int64_t t_begin,
                 int64_t t_end, const LinearEpilogue& epilogue, float* out, int64_t ldo);

// int4 weights (common/int4.h): from kAmxI4MinRows rows, for groups that are whole K steps.
constexpr int64_t kAmxI4MinRows = 4;
inline bool AmxI4Group(int64_t group) { return group % 64 == 0; }
// Tiles [t_begin, t_end) of int4 weights w (tile_bytes apart, scales [tiles][groups][16]) for x
// quantized symmetric to int8 row-major (q [AmxPaddedRows(M)][K], the rows past M any value),
// its row scales sx and group sums of q sums [M][groups]; e.scale unset.
void LinearI4Amx(const int8_t* q, const float* sx, const int32_t* sums, int64_t m_rows,
                 int64_t k_dim, const uint8_t* w, const float* scales, int64_t group,
                 int64_t n_dim, int64_t t_begin, int64_t t_end, const LinearEpilogue& e,
                 float* out, int64_t ldo);

// The peak-throughput probe's loop: 4 independent TDPBUSD chains for `iters` rounds; returns the
// int8 operations done (2 per multiply-add). Only when AmxAvailable().
double AmxDotLoop(int64_t iters);

}  // namespace deja::kernels::cpu
