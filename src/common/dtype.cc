#include "common/dtype.h"

#include <cstring>
#include <iterator>

#include "common/errors.h"
#include "common/names.h"

namespace hetra {

namespace {

constexpr NamedValue<DType> kDTypeNames[] = {{DType::F32, "float32"}, {DType::F64, "float64"},
                                             {DType::F16, "float16"}, {DType::BF16, "bfloat16"},
                                             {DType::I32, "int32"},   {DType::I64, "int64"},
                                             {DType::U8, "uint8"}};
constexpr NamedValue<DType> kDTypeShortNames[] = {
    {DType::F32, "f32"}, {DType::F64, "f64"}, {DType::F16, "f16"}, {DType::BF16, "bf16"},
    {DType::I32, "i32"}, {DType::I64, "i64"}, {DType::U8, "u8"}};
// Indexed by the enum, as both name tables are.
constexpr size_t kDTypeSizes[] = {4, 8, 2, 2, 4, 8, 1};
static_assert(coversEnum(kDTypeNames, DType::U8) && coversEnum(kDTypeShortNames, DType::U8));
static_assert(std::size(kDTypeSizes) == std::size(kDTypeNames));

}  // namespace

size_t dtypeSize(DType dtype) {
  if (size_t(dtype) < std::size(kDTypeSizes)) return kDTypeSizes[size_t(dtype)];
  throw EnforceError(str("unknown dtype ", int(dtype)));
}

const char* dtypeName(DType dtype) {
  return nameOf(dtype, kDTypeNames, "unknown");
}

DType parseDType(std::string_view name) {
  if (std::optional<DType> dtype = findName(name, kDTypeNames)) return *dtype;
  if (std::optional<DType> dtype = findName(name, kDTypeShortNames)) return *dtype;
  std::string allowed;  // "float32 (f32), float64 (f64), ..."
  for (DType dtype : kAllDTypes)
    allowed += str(allowed.empty() ? "" : ", ", dtypeName(dtype), " (",
                   nameOf(dtype, kDTypeShortNames), ")");
  throw ConfigError(str("dtype '", name, "' is not supported; allowed: ", allowed));
}

bool isFloating(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64 || dtype == DType::F16 || dtype == DType::BF16;
}

double loadElement(DType dtype, const void* buffer, size_t index) {
  switch (dtype) {
    case DType::F32:
      return static_cast<const float*>(buffer)[index];
    case DType::F64:
      return static_cast<const double*>(buffer)[index];
    case DType::F16:
      return halfToFloat(static_cast<const uint16_t*>(buffer)[index]);
    case DType::BF16:
      return bfloat16ToFloat(static_cast<const uint16_t*>(buffer)[index]);
    case DType::I32:
      return static_cast<const int32_t*>(buffer)[index];
    case DType::I64:
      return double(static_cast<const int64_t*>(buffer)[index]);
    case DType::U8:
      return static_cast<const uint8_t*>(buffer)[index];
  }
  throw EnforceError(str("unknown dtype ", int(dtype)));
}

void storeElement(DType dtype, void* buffer, size_t index, double value) {
  switch (dtype) {
    case DType::F32:
      static_cast<float*>(buffer)[index] = float(value);
      return;
    case DType::F64:
      static_cast<double*>(buffer)[index] = value;
      return;
    case DType::F16:
      static_cast<uint16_t*>(buffer)[index] = floatToHalf(float(value));
      return;
    case DType::BF16:
      static_cast<uint16_t*>(buffer)[index] = floatToBFloat16(float(value));
      return;
    case DType::I32:
      static_cast<int32_t*>(buffer)[index] = int32_t(value);
      return;
    case DType::I64:
      static_cast<int64_t*>(buffer)[index] = int64_t(value);
      return;
    case DType::U8:
      static_cast<uint8_t*>(buffer)[index] = uint8_t(int64_t(value) & 0xff);
      return;
  }
  throw EnforceError(str("unknown dtype ", int(dtype)));
}

uint16_t floatToHalf(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // Inf or NaN; keep NaN quiet and non-zero
    return uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0));
  }
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: overflow to Inf
  if (absx < 0x38800000u) {                                  // below the smallest normal half
    // Subnormal half: value = mantissa * 2^-24. Add the implicit bit, shift with round to nearest
    // even.
    if (absx < 0x33000000u) return uint16_t(sign);  // below half of the smallest subnormal
    const uint32_t exponent = absx >> 23;
    const uint32_t mantissa = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // float = mantissa * 2^(exponent-150); half unit 2^-24
    uint32_t result = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (result & 1u))) ++result;
    return uint16_t(sign | result);
  }
  // Normal: rebias exponent (127 -> 15), round mantissa 23 -> 10 bits to nearest even.
  uint32_t result = absx - 0x38000000u;
  const uint32_t rest = result & 0x1fffu;
  result >>= 13;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;
  return uint16_t(sign | result);
}

float halfToFloat(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0x1f) {
    out = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    out = sign;
  } else {  // subnormal half becomes a normal float
    uint32_t e = 113;
    uint32_t m = mantissa;
    while (!(m & 0x400u)) {
      m <<= 1;
      --e;
    }
    out = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &out, sizeof f);
  return f;
}

uint16_t floatToBFloat16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  const uint32_t roundingBias = 0x7fffu + ((x >> 16) & 1u);
  return uint16_t((x + roundingBias) >> 16);
}

}  // namespace hetra
