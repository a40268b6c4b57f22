// Element conversions of the codecs for the GPU kernels (codec_kernels.cu), one element at a time.
// They are the definitions of comm/codec/codec.h ("Formats, exactly") written as plain functions
// that compile both as CUDA device code and as ordinary C++: the CPU tests compile this header with
// the host compiler and compare it against the CPU codecs on every 16-bit pattern and millions of
// float32 patterns, so the arithmetic of the kernels is checked on machines without a GPU.
//
// Bit identity with the CPU codecs rests on three rules:
// - every floating-point operation is an IEEE operation rounded to nearest even, never fused:
//   on the device the _rn intrinsics (nvcc would otherwise contract a multiply and an add into an
//   FMA; codec_kernels.cu is also compiled with -fmad=false), on the host plain operators (the
//   project builds with -std=c++20, hence -ffp-contract=off, and without FMA code generation);
// - subnormals are kept (no -ftz, no --use_fast_math);
// - the result never depends on a NaN produced by arithmetic (GPUs return one canonical NaN, x86
//   propagates the operand's payload): NaN and Inf results are selected from integer bit patterns,
//   as in comm/codec/elements.h. The one exception is decodeAdd (out + decoded): a NaN sum is NaN
//   on both sides but its payload follows the hardware, so NaN results match as NaN, not bitwise.
#pragma once

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>

// The device pass of nvcc (__CUDA_ARCH__) or of HIP's clang (__HIP_DEVICE_COMPILE__); the host pass
// and the host compiler use the plain C++ definitions. No GPU header here: the CPU tests include
// this.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define HETRA_GPU_DEVICE_PASS 1
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define HETRA_HD __host__ __device__ __forceinline__
#else
#define HETRA_HD inline
#endif

namespace hetra::cuda::elements {

HETRA_HD uint32_t bitsOf(float value) {
#if defined(HETRA_GPU_DEVICE_PASS)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

HETRA_HD float floatOf(uint32_t bits) {
#if defined(HETRA_GPU_DEVICE_PASS)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// IEEE operations rounded to nearest even, never contracted.
HETRA_HD float divRn(float a, float b) {
#if defined(HETRA_GPU_DEVICE_PASS)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

HETRA_HD float mulRn(float a, float b) {
#if defined(HETRA_GPU_DEVICE_PASS)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

HETRA_HD float addRn(float a, float b) {
#if defined(HETRA_GPU_DEVICE_PASS)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Exact for the small integers passed here (at most 2^10).
HETRA_HD float smallIntToFloat(uint32_t value) {
#if defined(HETRA_GPU_DEVICE_PASS)
  return __uint2float_rn(value);
#else
  return float(value);
#endif
}

// |x| as float32 bits for finite x, 0 for Inf and NaN: the terms of a block's absmax. For
// non-negative floats the integer order is the float order, so the absmax is an integer max,
// which is exact and independent of the order of a parallel reduction.
HETRA_HD uint32_t finiteAbsBits(float value) {
  const uint32_t abs = bitsOf(value) & 0x7fffffffu;
  return abs < 0x7f800000u ? abs : 0u;
}

// Round-to-nearest-even of |x| (as bits) below the target's smallest normal to a whole number of
// the target's smallest subnormal steps; shiftBase - exponent field is the right shift of the
// 24-bit significand (151 - bias - mantissa bits). Clamped to [1, 31] like the CPU version.
HETRA_HD uint32_t subnormalSteps(uint32_t abs, int32_t shiftBase) {
  int32_t shift = shiftBase - int32_t(abs >> 23);
  shift = shift < 1 ? 1 : shift;
  shift = shift > 31 ? 31 : shift;
  const uint32_t s = uint32_t(shift);
  const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t lsb = (significand >> s) & 1u;
  return (significand + (1u << (s - 1u)) - 1u + lsb) >> s;
}

// ---- IEEE half: NaN keeps its sign and top payload bits and is made quiet.
HETRA_HD uint16_t f16Encode(float value) {
  const uint32_t bits = bitsOf(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  uint32_t magnitude;
  if (abs > 0x7f800000u)
    magnitude = 0x7e00u | ((abs >> 13) & 0x3ffu);
  else if (abs >= 0x477ff000u)  // rounds to >= 65520: Inf
    magnitude = 0x7c00u;
  else if (abs >= 0x38800000u)  // >= 2^-14: normal half; a rounding carry moves into the exponent
    magnitude = (abs - ((127u - 15u) << 23) + 0xfffu + ((abs >> 13) & 1u)) >> 13;
  else
    magnitude = subnormalSteps(abs, 126);
  return uint16_t(sign | magnitude);
}

HETRA_HD float f16Decode(uint16_t h) {
  const uint32_t sign = (uint32_t(h) & 0x8000u) << 16;
  const uint32_t exponent = (uint32_t(h) >> 10) & 0x1fu;
  const uint32_t mantissa = uint32_t(h) & 0x3ffu;
  uint32_t magnitude;
  if (exponent == 31)
    magnitude = 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0u);
  else if (exponent == 0)
    magnitude = bitsOf(mulRn(smallIntToFloat(mantissa), 0x1p-24f));  // exact
  else
    magnitude = ((uint32_t(h) & 0x7fffu) << 13) + ((127u - 15u) << 23);
  return floatOf(sign | magnitude);
}

// ---- bfloat16: the upper half of a float32, rounded to nearest even; NaN made quiet.
HETRA_HD uint16_t bf16Encode(float value) {
  const uint32_t bits = bitsOf(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

HETRA_HD float bf16Decode(uint16_t bits) {
  return floatOf(uint32_t(bits) << 16);
}

// ---- FP8 with kBias, kMantissa bits; kMaxCode: the code of the largest finite magnitude.
template <int kBias, int kMantissa, uint32_t kMaxCode, bool kHasInf>
struct Fp8Format {
  static constexpr float kMax = float(((1u << kMantissa) | (kMaxCode & ((1u << kMantissa) - 1))) *
                                      double(1ull << ((kMaxCode >> kMantissa) - kBias))) /
                                float(1u << kMantissa);

  // value: already divided by the block's scale.
  static HETRA_HD uint8_t encode(float value) {
    constexpr int kShift = 23 - kMantissa;
    const uint32_t bits = bitsOf(value);
    const uint32_t sign = (bits >> 24) & 0x80u;
    const uint32_t abs = bits & 0x7fffffffu;
    uint32_t magnitude;
    if (abs >= 0x7f800000u) {
      if constexpr (kHasInf)
        magnitude = abs == 0x7f800000u ? 0x7cu : 0x7eu;
      else
        magnitude = 0x7fu;  // no Inf: Inf and NaN become NaN
    } else if (abs >= (uint32_t(128 - kBias) << 23)) {
      magnitude = ((abs + ((1u << (kShift - 1)) - 1u) + ((abs >> kShift) & 1u)) >> kShift) -
                  (uint32_t(127 - kBias) << kMantissa);
      magnitude = magnitude < kMaxCode ? magnitude : kMaxCode;  // finite values saturate
    } else {
      magnitude = subnormalSteps(abs, 151 - kBias - kMantissa);
    }
    return uint8_t(sign | magnitude);
  }

  // x / scale, encoded. A NaN x is encoded directly: dividing it would give the GPU's canonical
  // (positive) NaN and lose x's sign, which the CPU keeps. Inf / scale is Inf of x's sign on both.
  static HETRA_HD uint8_t encodeScaled(float x, float scale) {
    const bool nan = (bitsOf(x) & 0x7fffffffu) > 0x7f800000u;
    return encode(nan ? x : divRn(x, scale));
  }

  static HETRA_HD float decode(uint8_t code, float scale) {
    const uint32_t sign = (uint32_t(code) & 0x80u) << 24;
    const uint32_t magnitude = uint32_t(code) & 0x7fu;
    if (magnitude > kMaxCode) {
      if constexpr (kHasInf) {
        if (magnitude == 0x7cu) return floatOf(sign | 0x7f800000u);
      }
      return floatOf(sign | 0x7fc00000u);  // quiet NaN
    }
    float value;
    if ((magnitude >> kMantissa) == 0)  // subnormal: mantissa steps of 2^(1 - bias - mantissa)
      value =
          mulRn(smallIntToFloat(magnitude), floatOf(uint32_t(127 + 1 - kBias - kMantissa) << 23));
    else
      value = floatOf((magnitude << (23 - kMantissa)) + (uint32_t(127 - kBias) << 23));
    return floatOf(sign | bitsOf(mulRn(value, scale)));
  }

  // max(absmax / kMax, FLT_MIN), one step towards 0 if kMax * scale overflows. absmax is finite
  // and non-negative, so scale is a positive normal float and "one step towards 0" is bits - 1.
  static HETRA_HD float blockScale(float absmax) {
    float scale = divRn(absmax, kMax);
    if (!(scale >= FLT_MIN)) scale = FLT_MIN;
    if ((bitsOf(mulRn(scale, kMax)) & 0x7fffffffu) == 0x7f800000u)
      scale = floatOf(bitsOf(scale) - 1u);
    return scale;
  }
};

using Fp8E4M3 = Fp8Format<7, 3, 0x7e, false>;
using Fp8E5M2 = Fp8Format<15, 2, 0x7b, true>;
static_assert(Fp8E4M3::kMax == 448.0f);
static_assert(Fp8E5M2::kMax == 57344.0f);

// The byte layout of the FP8 codecs: ceil(count / blockSize) float32 scales, unaligned, in host
// byte order (little-endian on every platform we build for, GPUs included), then the codes.
HETRA_HD void storeScale(uint8_t* to, float scale) {
  const uint32_t bits = bitsOf(scale);
  to[0] = uint8_t(bits);
  to[1] = uint8_t(bits >> 8);
  to[2] = uint8_t(bits >> 16);
  to[3] = uint8_t(bits >> 24);
}

HETRA_HD float loadScale(const uint8_t* from) {
  return floatOf(uint32_t(from[0]) | (uint32_t(from[1]) << 8) | (uint32_t(from[2]) << 16) |
                 (uint32_t(from[3]) << 24));
}

}  // namespace hetra::cuda::elements
