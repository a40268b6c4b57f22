// Element conversions of the codecs (internal), written once for any number of lanes: Scalar is
// plain scalar code (the portable path and the reference), Lanes8 and Lanes16 are GCC vector
// extensions that compile to AVX2 and AVX-512 inside functions with those targets. The same source
// gives the same operations per element, hence bit-identical results on every path. There are no
// branches on values: every candidate result is computed with integer operations and selected. The
// only floating-point operations are a division (encode: x / scale) and multiplications (decode),
// never a multiply followed by an add that a compiler could fuse into an FMA on one path only.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#define HETRA_CODEC_INLINE inline __attribute__((always_inline))

namespace hetra::comm::codec {

// N lanes of 32-bit values (U, I, F) and their loads and stores from the buffers' element types
// (U16, U8). The vector types are template arguments because GCC ignores a vector_size that
// depends on a template parameter.
template <int N, class U_, class I_, class F_, class U16_, class U8_>
struct VectorLanes {
  static constexpr int kWidth = N;
  using U = U_;
  using I = I_;
  using F = F_;
  using U16 = U16_;
  using U8 = U8_;

  static HETRA_CODEC_INLINE U splat(uint32_t value) { return U{} + value; }
  static HETRA_CODEC_INLINE I splatI(int32_t value) { return I{} + value; }
  static HETRA_CODEC_INLINE F toFloat(I value) { return __builtin_convertvector(value, F); }
  static HETRA_CODEC_INLINE U bits(F value) { return __builtin_bit_cast(U, value); }
  static HETRA_CODEC_INLINE F floats(U value) { return __builtin_bit_cast(F, value); }
  template <class T>
  static HETRA_CODEC_INLINE T load(const void* from) {
    T value;
    std::memcpy(&value, from, sizeof value);
    return value;
  }
  template <class T>
  static HETRA_CODEC_INLINE void store(void* to, T value) {
    std::memcpy(to, &value, sizeof value);
  }
  static HETRA_CODEC_INLINE F loadF(const float* from) { return load<F>(from); }
  static HETRA_CODEC_INLINE U load16(const uint16_t* from) {
    return __builtin_convertvector(load<U16>(from), U);
  }
  static HETRA_CODEC_INLINE U load8(const uint8_t* from) {
    return __builtin_convertvector(load<U8>(from), U);
  }
  static HETRA_CODEC_INLINE void storeF(float* to, F value) { store(to, value); }
  static HETRA_CODEC_INLINE void store16(uint16_t* to, U value) {
    store(to, __builtin_convertvector(value, U16));  // keeps the low 16 bits
  }
  static HETRA_CODEC_INLINE void store8(uint8_t* to, U value) {
    store(to, __builtin_convertvector(value, U8));
  }
  static HETRA_CODEC_INLINE uint32_t maxLane(U value) {
    uint32_t largest = 0;
    for (int j = 0; j < N; ++j) largest = largest > value[j] ? largest : value[j];
    return largest;
  }
};

typedef uint32_t U32x8 __attribute__((vector_size(32)));
typedef int32_t I32x8 __attribute__((vector_size(32)));
typedef float F32x8 __attribute__((vector_size(32)));
typedef uint16_t U16x8 __attribute__((vector_size(16)));
typedef uint8_t U8x8 __attribute__((vector_size(8)));
typedef uint32_t U32x16 __attribute__((vector_size(64)));
typedef int32_t I32x16 __attribute__((vector_size(64)));
typedef float F32x16 __attribute__((vector_size(64)));
typedef uint16_t U16x16 __attribute__((vector_size(32)));
typedef uint8_t U8x16 __attribute__((vector_size(16)));
using Lanes8 = VectorLanes<8, U32x8, I32x8, F32x8, U16x8, U8x8>;         // AVX2
using Lanes16 = VectorLanes<16, U32x16, I32x16, F32x16, U16x16, U8x16>;  // AVX-512

// One lane: plain scalar code.
struct Scalar {
  static constexpr int kWidth = 1;
  using U = uint32_t;
  using I = int32_t;
  using F = float;
  static HETRA_CODEC_INLINE U splat(uint32_t value) { return value; }
  static HETRA_CODEC_INLINE I splatI(int32_t value) { return value; }
  static HETRA_CODEC_INLINE F toFloat(I value) { return float(value); }
  static HETRA_CODEC_INLINE U bits(F value) { return __builtin_bit_cast(U, value); }
  static HETRA_CODEC_INLINE F floats(U value) { return __builtin_bit_cast(F, value); }
  static HETRA_CODEC_INLINE F loadF(const float* from) { return *from; }
  static HETRA_CODEC_INLINE U load16(const uint16_t* from) { return *from; }
  static HETRA_CODEC_INLINE U load8(const uint8_t* from) { return *from; }
  static HETRA_CODEC_INLINE void storeF(float* to, F value) { *to = value; }
  static HETRA_CODEC_INLINE void store16(uint16_t* to, U value) { *to = uint16_t(value); }
  static HETRA_CODEC_INLINE void store8(uint8_t* to, U value) { *to = uint8_t(value); }
  static HETRA_CODEC_INLINE uint32_t maxLane(U value) { return value; }
};

// Round-to-nearest-even of values below the target's smallest normal to a whole number of the
// target's smallest subnormal steps: `abs` is |x| as float32 bits, `shiftBase` - exponent field is
// how far the 24-bit significand must be shifted right (151 - bias - mantissa bits of the target).
// The shift is clamped to [1, 31]: beyond 25 the result is 0 anyway, and lanes that do not use this
// result (normal inputs) must not shift by 0 or by 32 or more.
template <class L>
HETRA_CODEC_INLINE typename L::U subnormalSteps(typename L::U abs, int32_t shiftBase) {
  using U = typename L::U;
  using I = typename L::I;
  I shift = L::splatI(shiftBase) - (I)(abs >> 23);
  shift = shift < 1 ? L::splatI(1) : shift;
  shift = shift > 31 ? L::splatI(31) : shift;
  const U s = (U)shift;
  const U significand = (abs & 0x7fffffu) | 0x800000u;
  const U lsb = (significand >> s) & 1u;
  return (significand + (L::splat(1) << (s - 1u)) - 1u + lsb) >> s;
}

// ---- IEEE half. NaN keeps its sign and top payload bits and is made quiet, as F16C does.
template <class L>
HETRA_CODEC_INLINE typename L::U f16Encode(typename L::F value) {
  using U = typename L::U;
  const U bits = L::bits(value);
  const U sign = (bits >> 16) & 0x8000u;
  const U abs = bits & 0x7fffffffu;
  const U nan = 0x7e00u | ((abs >> 13) & 0x3ffu);
  // Rebias 127 -> 15 and round 23 -> 10 mantissa bits; a carry moves into the exponent correctly.
  const U normal = (abs - ((127u - 15u) << 23) + 0xfffu + ((abs >> 13) & 1u)) >> 13;
  const U subnormal = subnormalSteps<L>(abs, 126);
  U magnitude = abs >= 0x38800000u ? normal : subnormal;           // >= 2^-14: normal half
  magnitude = abs >= 0x477ff000u ? L::splat(0x7c00u) : magnitude;  // rounds to >= 65520: Inf
  magnitude = abs > 0x7f800000u ? nan : magnitude;
  return sign | magnitude;
}

template <class L>
HETRA_CODEC_INLINE typename L::F f16Decode(typename L::U h) {
  using U = typename L::U;
  using I = typename L::I;
  const U sign = (h & 0x8000u) << 16;
  const U exponent = (h >> 10) & 0x1fu;
  const U mantissa = h & 0x3ffu;
  const U normal = ((h & 0x7fffu) << 13) + ((127u - 15u) << 23);
  const U subnormal = L::bits(L::toFloat((I)mantissa) * 0x1p-24f);  // exact
  const U special =
      0x7f800000u | (mantissa << 13) | (mantissa != 0 ? L::splat(0x400000u) : L::splat(0));
  U magnitude = exponent == 0 ? subnormal : normal;
  magnitude = exponent == 31 ? special : magnitude;
  return L::floats(sign | magnitude);
}

// ---- bfloat16: the upper half of a float32, rounded to nearest even; a carry that reaches the
// exponent field rounds to Inf exactly as IEEE overflow does. NaN is made quiet.
template <class L>
HETRA_CODEC_INLINE typename L::U bf16Encode(typename L::F value) {
  using U = typename L::U;
  const U bits = L::bits(value);
  const U rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const U nan = (bits >> 16) | 0x40u;
  return (bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

template <class L>
HETRA_CODEC_INLINE typename L::F bf16Decode(typename L::U bits) {
  return L::floats(bits << 16);
}

// ---- FP8. kBias, kMantissa: the format; kMaxCode: the code of the largest finite magnitude.
template <int kBias, int kMantissa, uint32_t kMaxCode, bool kHasInf>
struct Fp8Format {
  static constexpr float kMax = float(((1u << kMantissa) | (kMaxCode & ((1u << kMantissa) - 1))) *
                                      double(1ull << ((kMaxCode >> kMantissa) - kBias))) /
                                float(1u << kMantissa);

  // value: already divided by the block's scale.
  template <class L>
  static HETRA_CODEC_INLINE typename L::U encode(typename L::F value) {
    using U = typename L::U;
    constexpr int kShift = 23 - kMantissa;
    const U bits = L::bits(value);
    const U sign = (bits >> 24) & 0x80u;
    const U abs = bits & 0x7fffffffu;
    U normal = ((abs + ((1u << (kShift - 1)) - 1u) + ((abs >> kShift) & 1u)) >> kShift) -
               (uint32_t(127 - kBias) << kMantissa);
    normal = normal < kMaxCode ? normal : L::splat(kMaxCode);  // finite values saturate
    const U subnormal = subnormalSteps<L>(abs, 151 - kBias - kMantissa);
    U magnitude = abs >= (uint32_t(128 - kBias) << 23) ? normal : subnormal;
    if constexpr (kHasInf)
      magnitude =
          abs >= 0x7f800000u ? (abs == 0x7f800000u ? L::splat(0x7cu) : L::splat(0x7eu)) : magnitude;
    else
      magnitude = abs >= 0x7f800000u ? L::splat(0x7fu) : magnitude;
    return sign | magnitude;
  }

  template <class L>
  static HETRA_CODEC_INLINE typename L::F decode(typename L::U code, float scale) {
    using U = typename L::U;
    using I = typename L::I;
    const U sign = (code & 0x80u) << 24;
    const U magnitude = code & 0x7fu;
    const U normal = (magnitude << (23 - kMantissa)) + (uint32_t(127 - kBias) << 23);
    // Exponent field 0: the magnitude is the mantissa, in steps of 2^(1 - bias - mantissa).
    constexpr float kStep = __builtin_bit_cast(float, uint32_t(127 + 1 - kBias - kMantissa) << 23);
    const U subnormal = L::bits(L::toFloat((I)magnitude) * kStep);
    const U value = (magnitude >> kMantissa) == 0 ? subnormal : normal;
    const U scaled = L::bits(L::floats(value) * scale);
    U special = L::splat(0x7fc00000u);  // quiet NaN
    if constexpr (kHasInf) special = magnitude == 0x7cu ? L::splat(0x7f800000u) : special;
    return L::floats(sign | (magnitude > kMaxCode ? special : scaled));
  }

  // max(absmax / kMax, FLT_MIN), one step towards 0 if kMax * scale overflows, so that decoding
  // (|value| <= kMax) never turns a finite code into Inf.
  static float blockScale(float absmax) {
    float scale = absmax / kMax;
    if (!(scale >= FLT_MIN)) scale = FLT_MIN;
    if (std::isinf(scale * kMax)) scale = std::nextafter(scale, 0.0f);
    return scale;
  }
};

using Fp8E4M3 = Fp8Format<7, 3, 0x7e, false>;
using Fp8E5M2 = Fp8Format<15, 2, 0x7b, true>;
static_assert(Fp8E4M3::kMax == 448.0f);
static_assert(Fp8E5M2::kMax == 57344.0f);

// The largest |x| over the finite elements, as float32 bits (for non-negative floats the integer
// order is the float order); 0 when there is none.
template <class L>
HETRA_CODEC_INLINE uint32_t finiteAbsMaxBits(const float* in, size_t count) {
  using U = typename L::U;
  constexpr size_t kWidth = L::kWidth;
  U largest = L::splat(0);
  size_t i = 0;
  for (; i + kWidth <= count; i += kWidth) {
    const U abs = L::bits(L::loadF(in + i)) & 0x7fffffffu;
    const U finite = abs < 0x7f800000u ? abs : L::splat(0);
    largest = largest > finite ? largest : finite;
  }
  uint32_t result = L::maxLane(largest);
  for (; i < count; ++i) {
    const uint32_t abs = Scalar::bits(in[i]) & 0x7fffffffu;
    const uint32_t finite = abs < 0x7f800000u ? abs : 0u;
    result = result > finite ? result : finite;
  }
  return result;
}

}  // namespace hetra::comm::codec
