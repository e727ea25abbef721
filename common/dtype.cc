#include "common/dtype.h"

#include "common/dtype_table.h"
#include "common/enum_table.h"

namespace deja {
namespace {

constexpr DTypeRow kDTypes[] = {
    {DType::kF32, "f32", "F32", true},    {DType::kF16, "f16", "F16", true},
    {DType::kBF16, "bf16", "BF16", true}, {DType::kI32, "i32", "I32", false},
    {DType::kI8, "int8", "I8", true},     {DType::kI4, "int4", "I4", false},
    {DType::kU8, "u8", "U8", true},
};

}  // namespace

std::span<const DTypeRow> DTypeTable() { return kDTypes; }

const DTypeRow& DTypeOf(DType dtype) {
  const DTypeRow* row = FindRow(kDTypes, &DTypeRow::dtype, dtype);
  CHECK(row != nullptr) << "dtype " << static_cast<int>(dtype) << " has no row";
  return *row;
}

const char* DTypeName(DType t) {
  const DTypeRow* row = FindRow(kDTypes, &DTypeRow::dtype, t);
  return row != nullptr ? row->name : "?";
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 113 - e + 13
    uint32_t half_m = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u;  // rebias and round to even
  return static_cast<uint16_t>(sign | (r >> 13));
}

float LoadAsFloat(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return BF16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kI32: return static_cast<float>(static_cast<const int32_t*>(data)[i]);
    case DType::kI8:
      return static_cast<float>(static_cast<const int8_t*>(data)[i]);
    case DType::kU8:
      return static_cast<float>(static_cast<const uint8_t*>(data)[i]);
    case DType::kI4:
      return 0.f;
  }
  return 0.f;
}

void StoreFromFloat(void* data, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(data)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(data)[i] = FloatToHalf(v); break;
    case DType::kBF16: static_cast<uint16_t*>(data)[i] = FloatToBF16(v); break;
    case DType::kI32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v); break;
    case DType::kI8:
      static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v);
      break;
    case DType::kU8:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v);
      break;
    case DType::kI4:
      break;
  }
}

}  // namespace deja
