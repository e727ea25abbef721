// Element types and the scalar conversions between them. Weights stay in their checkpoint dtype
// (f16/bf16/f32) in memory, or are quantized to int8 with one f32 scale per output row
// (TensorView::scale, common/quantize.h) or to int4 in groups (common/int4.h); kernels widen to f32 in registers and accumulate in f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace deja {

// kI4: int4 Linear weights, two per byte in a tiled layout with group scales (common/int4.h).
// kU8: bytes without a numeric meaning of their own (a checkpoint's packed int4 nibbles).
enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI8, kI4, kU8 };

inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kI32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI8:
    case DType::kU8:
      return 1;
    case DType::kI4:  // packed, half a byte each: TensorView::bytes() counts a matrix's bytes
      return 0;
  }
  return 0;
}

const char* DTypeName(DType t);

// IEEE binary16 <-> binary32, round to nearest even; handles subnormals, inf and NaN.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

inline float BF16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t FloatToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// Reads element i of a buffer of dtype t as f32 (slow path: references, tests, tools); an int8
// element reads as its integer value (the row's scale is not applied); int4 (packed and tiled)
// reads as 0 here: common/int4.h reads it.
float LoadAsFloat(const void* data, DType t, size_t i);
void StoreFromFloat(void* data, DType t, size_t i, float v);

}  // namespace deja
