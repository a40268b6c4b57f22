// The codecs of comm/codec/codec.h as CUDA kernels on device buffers: the same bytes as the CPU
// codecs for every input (same rounding, same block scale rule, same layout: for FP8 the block
// scales first, then one code per element), so a GPU rank and a CPU rank that encode the same
// values put the same bytes on the wire, and decode the same bytes to the same floats.
//
// decodeAdd is decode followed by one IEEE float32 addition (no fused multiply-add), like the CPU.
// The one documented difference: where that addition gives NaN (a NaN operand, Inf - Inf) the
// result is NaN on both, but its payload follows the hardware (GPUs return one canonical NaN).
//
// Every call is asynchronous on `stream`; the buffers must stay valid until the stream reaches
// it. Pointers may be unaligned (FP8 scales are stored bytewise); counts may be 0.
#pragma once

#include <cstddef>

#include "comm/codec/codec.h"
#include "cuda/gpu_runtime.h"

namespace hetra::cuda {

// Bytes cudaEncode writes for `count` elements: Codec::encodedBytes of the same kind and block.
size_t encodedBytes(comm::Compression kind, size_t blockSize, size_t count);

// kind: any but None (EnforceError); blockSize: elements per FP8 scale (ignored by fp16/bf16),
// 0 throws ConfigError. A failed launch throws IoError.
void cudaEncode(comm::Compression kind, size_t blockSize, const float* in, size_t count, void* out,
                cudaStream_t stream);
void cudaDecode(comm::Compression kind, size_t blockSize, const void* in, size_t count, float* out,
                cudaStream_t stream);
// out[i] += decoded element i.
void cudaDecodeAdd(comm::Compression kind, size_t blockSize, const void* in, size_t count,
                   float* out, cudaStream_t stream);

}  // namespace hetra::cuda
