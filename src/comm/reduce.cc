#include "comm/reduce.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/cpu_features.h"
#include "common/errors.h"
#include "common/names.h"

namespace hetra::comm {
namespace {

// ThreadSanitizer cannot run ifunc resolvers (they run before it initialises), so TSan builds use
// the baseline loops; so do clang builds before clang 16, which refuses target_clones on templates
// (the fuzzing build).
#if defined(__SANITIZE_THREAD__) || (defined(__clang__) && __clang_major__ < 16)
#define HETRA_CLONES
#else
#define HETRA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

// Min and max of one element pair. On floats a NaN in either input gives NaN, as in torch; the
// NaN test is compiled only for floats, so integer loops stay plain compare-and-select.
template <typename T>
inline T minOf(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    if (a != a || b != b) return a != a ? a : b;
  return b < a ? b : a;
}
template <typename T>
inline T maxOf(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    if (a != a || b != b) return a != a ? a : b;
  return a < b ? b : a;
}

template <typename T>
HETRA_CLONES void reduceElements(ReduceOp op, T* dst, const T* a, const T* b, size_t n) {
  // dst may alias a or b, which __restrict__ would forbid; alias-safe because each element is read
  // before it is written at the same index.
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
      break;
    case ReduceOp::Min:
      for (size_t i = 0; i < n; ++i) dst[i] = minOf(a[i], b[i]);
      break;
    case ReduceOp::Max:
      for (size_t i = 0; i < n; ++i) dst[i] = maxOf(a[i], b[i]);
      break;
  }
}

// Half types: convert a block to float32, reduce there, convert back once.
constexpr size_t kBlock = 512;

bool hasF16c() {
  static const bool has = cpuHasF16c() && __builtin_cpu_supports("avx2");
  return has;
}

__attribute__((target("f16c,avx2"))) void halfToFloatF16c(const uint16_t* src, float* dst,
                                                          size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = hetra::halfToFloat(src[i]);
}

__attribute__((target("f16c,avx2"))) void floatToHalfF16c(const float* src, uint16_t* dst,
                                                          size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = hetra::floatToHalf(src[i]);
}

HETRA_CLONES void bf16ToFloatLoop(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = uint32_t(src[i]) << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}

HETRA_CLONES void floatToBf16Loop(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, src + i, 4);
    const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    dst[i] = uint16_t(nan ? ((x >> 16) | 0x40u) : rounded);
  }
}

void toFloat(DType dtype, const void* src, float* dst, size_t n) {
  if (dtype == DType::F16)
    halfToFloat(static_cast<const uint16_t*>(src), dst, n);
  else
    bfloat16ToFloat(static_cast<const uint16_t*>(src), dst, n);
}

void fromFloat(DType dtype, const float* src, void* dst, size_t n) {
  if (dtype == DType::F16)
    floatToHalf(src, static_cast<uint16_t*>(dst), n);
  else
    floatToBFloat16(src, static_cast<uint16_t*>(dst), n);
}

void reduceManyHalf(ReduceOp op, DType dtype, void* dst, const void* const* srcs, int n,
                    size_t count) {
  alignas(64) float acc[kBlock];
  alignas(64) float next[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t len = std::min(kBlock, count - start);
    toFloat(dtype, static_cast<const uint16_t*>(srcs[0]) + start, acc, len);
    for (int k = 1; k < n; ++k) {
      toFloat(dtype, static_cast<const uint16_t*>(srcs[k]) + start, next, len);
      reduceElements<float>(op, acc, acc, next, len);
    }
    fromFloat(dtype, acc, static_cast<uint16_t*>(dst) + start, len);
  }
}

template <typename T>
void reduceManyTyped(ReduceOp op, T* dst, const void* const* srcs, int n, size_t count) {
  // Blocked so the running result stays in L1 while each source streams past it.
  constexpr size_t kElems = 4096 / sizeof(T);
  for (size_t start = 0; start < count; start += kElems) {
    const size_t len = std::min(kElems, count - start);
    const T* first = static_cast<const T*>(srcs[0]) + start;
    if (n == 1) {
      if (dst + start != first) std::memmove(dst + start, first, len * sizeof(T));
      continue;
    }
    const T* second = static_cast<const T*>(srcs[1]) + start;
    reduceElements<T>(op, dst + start, first, second, len);
    for (int k = 2; k < n; ++k) {
      const T* src = static_cast<const T*>(srcs[k]) + start;
      reduceElements<T>(op, dst + start, dst + start, src, len);
    }
  }
}

template <typename T>
HETRA_CLONES void divideTyped(T* dst, size_t n, T divisor) {
  for (size_t i = 0; i < n; ++i) dst[i] = dst[i] / divisor;
}

template <typename T>
HETRA_CLONES void scaleTyped(const T* src, T* dst, size_t n, T factor) {
  for (size_t i = 0; i < n; ++i) dst[i] = src[i] * factor;
}

}  // namespace

constexpr NamedValue<ReduceOp> kReduceOpNames[] = {
    {ReduceOp::Sum, "sum"}, {ReduceOp::Avg, "avg"}, {ReduceOp::Min, "min"}, {ReduceOp::Max, "max"}};
static_assert(coversEnum(kReduceOpNames, ReduceOp::Max));

const char* reduceOpName(ReduceOp op) {
  return nameOf(op, kReduceOpNames);
}

ReduceOp parseReduceOp(std::string_view name) {
  return parseName(name, kReduceOpNames, "reduce op");
}

void halfToFloat(const uint16_t* src, float* dst, size_t count) {
  if (hasF16c()) return halfToFloatF16c(src, dst, count);
  for (size_t i = 0; i < count; ++i) dst[i] = hetra::halfToFloat(src[i]);
}

void floatToHalf(const float* src, uint16_t* dst, size_t count) {
  if (hasF16c()) return floatToHalfF16c(src, dst, count);
  for (size_t i = 0; i < count; ++i) dst[i] = hetra::floatToHalf(src[i]);
}

void bfloat16ToFloat(const uint16_t* src, float* dst, size_t count) {
  bf16ToFloatLoop(src, dst, count);
}
void floatToBFloat16(const float* src, uint16_t* dst, size_t count) {
  floatToBf16Loop(src, dst, count);
}

void reduce(ReduceOp op, DType dtype, void* dst, const void* a, const void* b, size_t count) {
  const void* srcs[2] = {a, b};
  reduceMany(op, dtype, dst, srcs, 2, count);
}

void reduceMany(ReduceOp op, DType dtype, void* dst, const void* const* srcs, int n, size_t count) {
  HETRA_ENFORCE_GE(n, 1);
  switch (dtype) {
    case DType::F32:
      return reduceManyTyped<float>(op, static_cast<float*>(dst), srcs, n, count);
    case DType::F64:
      return reduceManyTyped<double>(op, static_cast<double*>(dst), srcs, n, count);
    case DType::I32:
      return reduceManyTyped<int32_t>(op, static_cast<int32_t*>(dst), srcs, n, count);
    case DType::I64:
      return reduceManyTyped<int64_t>(op, static_cast<int64_t*>(dst), srcs, n, count);
    case DType::U8:
      return reduceManyTyped<uint8_t>(op, static_cast<uint8_t*>(dst), srcs, n, count);
    case DType::F16:
    case DType::BF16:
      return reduceManyHalf(op, dtype, dst, srcs, n, count);
  }
}

void scale(DType dtype, const void* src, void* dst, size_t count, double factor) {
  switch (dtype) {
    case DType::F32:
      return scaleTyped<float>(static_cast<const float*>(src), static_cast<float*>(dst), count,
                               float(factor));
    case DType::F64:
      return scaleTyped<double>(static_cast<const double*>(src), static_cast<double*>(dst), count,
                                factor);
    default:
      throw ConfigError(
          str("a premultiplied sum takes float32 or float64, not ", dtypeName(dtype)));
  }
}

void divide(DType dtype, void* dst, size_t count, int divisor) {
  HETRA_ENFORCE_GT(divisor, 0);
  switch (dtype) {
    case DType::F32:
      return divideTyped<float>(static_cast<float*>(dst), count, float(divisor));
    case DType::F64:
      return divideTyped<double>(static_cast<double*>(dst), count, double(divisor));
    case DType::I32:
      return divideTyped<int32_t>(static_cast<int32_t*>(dst), count, divisor);
    case DType::I64:
      return divideTyped<int64_t>(static_cast<int64_t*>(dst), count, divisor);
    case DType::U8:
      return divideTyped<uint8_t>(static_cast<uint8_t*>(dst), count, uint8_t(divisor));
    case DType::F16:
    case DType::BF16: {
      alignas(64) float block[kBlock];
      auto* bits = static_cast<uint16_t*>(dst);
      for (size_t start = 0; start < count; start += kBlock) {
        const size_t len = std::min(kBlock, count - start);
        toFloat(dtype, bits + start, block, len);
        divideTyped<float>(block, len, float(divisor));
        fromFloat(dtype, block, bits + start, len);
      }
      return;
    }
  }
}

}  // namespace hetra::comm
