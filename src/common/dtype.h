// Element types that hetra moves and reduces. The comm layer works on raw buffers with a DType and
// an element count, never on framework tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hetra {

enum class DType : uint8_t { F32, F64, F16, BF16, I32, I64, U8 };

constexpr DType kAllDTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                                DType::I32, DType::I64, DType::U8};

size_t dtypeSize(DType dtype);
const char* dtypeName(DType dtype);  // "float32", "float16", ...
// Accepts the names above and the short forms f32, f64, f16, bf16, i32, i64, u8; throws
// ConfigError.
DType parseDType(std::string_view name);
bool isFloating(DType dtype);

// One element of a typed buffer as a double, and back (float types round to nearest even, integers
// truncate, uint8 wraps). For tools and tests that fill and check buffers, not for hot paths.
double loadElement(DType dtype, const void* buffer, size_t index);
void storeElement(DType dtype, void* buffer, size_t index, double value);

// IEEE half and bfloat16 conversions, round to nearest even; NaN stays NaN, Inf stays Inf.
uint16_t floatToHalf(float value);
float halfToFloat(uint16_t bits);
uint16_t floatToBFloat16(float value);
inline float bfloat16ToFloat(uint16_t bits) {
  uint32_t widened = uint32_t(bits) << 16;
  float out;
  __builtin_memcpy(&out, &widened, sizeof out);
  return out;
}

}  // namespace hetra
