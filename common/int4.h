// int4 weights (DType::kI4): a Linear matrix [N, K] quantized in groups of `group` consecutive K
// of each row (group a multiple of 8 that divides K), one f32 scale per group, values -8..7
// stored as nibbles q + 8, q = clamp(round(w / scale), -8, 7). A group's scale is m / -8 times
// a factor f of kInt4ScaleSearch, for m its element of largest magnitude (signed, so at f = 1
// that element is exactly -8 steps and all 16 levels are used), f the one with the least squared
// error over the group (a smaller scale clips the extremes but resolves the rest finer). An
// all-zero group has scale 0. Elementwise |q * scale - w| <= max(|scale| / 2, |m| - 7 |scale|).
//
// The layout is tiled for the CPU kernel (kernels/cpu/linear_i4.cc): rows in tiles of 16 (padded
// with zero scales), and within a tile K in quads, 16 rows x 4 values of a quad being the 64 bytes
// one VPDPBUSD reads; two quads share one 64-byte line, the even quad in the low nibbles and the
// odd one in the high nibbles. So a tile is K / 8 lines, K / 2 bytes per row. The scales are
// tiled alike, [tiles][groups][16 rows], so a group's 16 scales are one register.
//
// Linear over int4 weights quantizes each row of x to int8 (symmetric, max |x| / 127) on every
// backend and sums the integer products of each group exactly (ref::Linear defines it).
#pragma once

#include <cstdint>

#include "common/tensor.h"

namespace deja {

// The factors of m / -8 the quantizer tries for each group's scale.
inline constexpr float kInt4ScaleSearch[] = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f};

// Bytes of the packed values of a [rows, cols] int4 matrix.
inline int64_t Int4Bytes(int64_t rows, int64_t cols) { return TiledRows(rows) * cols / 2; }
// Floats of its scales.
inline int64_t Int4Scales(int64_t rows, int64_t cols, int64_t group) {
  return TiledRows(rows) * (cols / group);
}
// The byte that holds element (n, k) of a matrix of `cols` columns, and the nibble's shift.
inline int64_t Int4Byte(int64_t n, int64_t k, int64_t cols) {
  return (n / kTileRows) * (kTileRows * cols / 2) + (k / 8) * 64 + (n % kTileRows) * 4 + (k % 4);
}
inline int Int4Shift(int64_t k) { return static_cast<int>((k / 4) % 2) * 4; }
// Element (n, k) as its integer value in [-8, 7] (the group's scale not applied).
inline int Int4Value(const uint8_t* packed, int64_t n, int64_t k, int64_t cols) {
  return ((packed[Int4Byte(n, k, cols)] >> Int4Shift(k)) & 15) - 8;
}
// Index of the scale of group g of row n, for `groups` groups per row.
inline int64_t Int4ScaleIndex(int64_t n, int64_t g, int64_t groups) {
  return (n / kTileRows) * groups * kTileRows + g * kTileRows + n % kTileRows;
}

}  // namespace deja
