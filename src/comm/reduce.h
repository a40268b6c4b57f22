// Element-wise reduction kernels on raw buffers. Vectorised: the float and integer loops are
// compiled for AVX-512, AVX2 and baseline x86-64 and picked at run time (target_clones); half types
// convert with F16C when the CPU has it. float16 and bfloat16 are always added in float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/dtype.h"

namespace hetra::comm {

enum class ReduceOp : uint8_t { Sum, Avg, Min, Max };

const char* reduceOpName(ReduceOp op);
ReduceOp parseReduceOp(std::string_view name);  // sum, avg, min, max; throws ConfigError

// dst[i] = a[i] op b[i]; dst may alias a or b. Avg adds (the caller divides once at the end).
void reduce(ReduceOp op, DType dtype, void* dst, const void* a, const void* b, size_t count);

// dst[i] = op over srcs[k][i], k < n (n >= 1); half types accumulate in float32 and round once.
// dst may alias srcs[0] or srcs[1].
void reduceMany(ReduceOp op, DType dtype, void* dst, const void* const* srcs, int n, size_t count);

// dst[i] /= divisor: the last step of Avg (integers truncate toward zero).
void divide(DType dtype, void* dst, size_t count, int divisor);

// dst[i] = src[i] * factor (float32 and float64; dst may alias src): a premultiplied sum's
// first pass.
void scale(DType dtype, const void* src, void* dst, size_t count, double factor);

// Bulk conversions between float32 and the 16-bit float types (round to nearest even).
void halfToFloat(const uint16_t* src, float* dst, size_t count);
void floatToHalf(const float* src, uint16_t* dst, size_t count);
void bfloat16ToFloat(const uint16_t* src, float* dst, size_t count);
void floatToBFloat16(const float* src, uint16_t* dst, size_t count);

}  // namespace hetra::comm
