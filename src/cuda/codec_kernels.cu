// The codec kernels. Vocabulary:
//   element  - one float32 of the buffer; fp16 and bf16 are element-wise (one thread per element,
//              grid-stride loops);
//   block    - the codec's block of blockSize elements sharing one fp32 scale (FP8);
//   group    - the threads that handle one block: 32 (a warp) for blocks of 32 elements or more,
//              else the next power of two >= blockSize, so small blocks do not idle most lanes.
//              A group reduces its block's absmax with shuffles inside the warp; every lane then
//              computes the same scale, so no shared memory or barrier is needed.
// The absmax is an integer max of float bits (codec_elements.h), exact in any reduction order,
// and every conversion is the shared element code, so results equal the CPU codecs bit for bit.
#include "cuda/codec_kernels.h"

#include <algorithm>

#include "cuda/codec_elements.h"
#include "cuda/cuda_check.h"

namespace hetra::cuda {
namespace {

namespace el = elements;

constexpr unsigned kThreads = 256;  // per CTA, a multiple of the warp size
constexpr size_t kMaxCtas = 8192;   // beyond this, grid-stride loops

unsigned ctasFor(size_t threads) {
  return unsigned(std::min(kMaxCtas, std::max<size_t>(1, (threads + kThreads - 1) / kThreads)));
}

// 16-bit codes at an address that may be odd: bytewise, little-endian like the host.
template <bool kAligned>
__device__ __forceinline__ uint16_t load16(const uint8_t* p, size_t i) {
  if constexpr (kAligned) return reinterpret_cast<const uint16_t*>(p)[i];
  return uint16_t(p[2 * i] | (uint16_t(p[2 * i + 1]) << 8));
}

template <bool kAligned>
__device__ __forceinline__ void store16(uint8_t* p, size_t i, uint16_t value) {
  if constexpr (kAligned) {
    reinterpret_cast<uint16_t*>(p)[i] = value;
  } else {
    p[2 * i] = uint8_t(value);
    p[2 * i + 1] = uint8_t(value >> 8);
  }
}

struct F16 {
  static __device__ __forceinline__ uint16_t encode(float x) { return el::f16Encode(x); }
  static __device__ __forceinline__ float decode(uint16_t h) { return el::f16Decode(h); }
};
struct Bf16 {
  static __device__ __forceinline__ uint16_t encode(float x) { return el::bf16Encode(x); }
  static __device__ __forceinline__ float decode(uint16_t h) { return el::bf16Decode(h); }
};

template <class Half, bool kAligned>
__global__ void encodeHalfKernel(const float* in, size_t count, uint8_t* out) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    store16<kAligned>(out, i, Half::encode(in[i]));
}

template <class Half, bool kAligned, bool kAdd>
__global__ void decodeHalfKernel(const uint8_t* in, size_t count, float* out) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float value = Half::decode(load16<kAligned>(in, i));
    if constexpr (kAdd)
      out[i] = el::addRn(out[i], value);
    else
      out[i] = value;
  }
}

// Where this thread's group and lane are, and how groups step through the blocks. The loop
// condition depends only on the warp (base), so every lane of a warp runs the same iterations and
// the full-mask shuffles are well defined; lanes past the last block work on nothing.
struct Groups {
  unsigned group;    // threads per block: a power of two <= 32
  unsigned lane;     // within the group
  size_t perWarp;    // groups per warp
  size_t inWarp;     // this thread's group within its warp
  size_t firstBase;  // this warp's first block
  size_t stride;     // blocks per grid-stride step
};

__device__ __forceinline__ Groups groupsOf(unsigned group) {
  Groups g;
  g.group = group;
  g.lane = threadIdx.x % group;
  g.perWarp = 32 / group;
  g.inWarp = (threadIdx.x % 32) / group;
  const size_t warp = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const size_t warps = size_t(gridDim.x) * blockDim.x / 32;
  g.firstBase = warp * g.perWarp;
  g.stride = warps * g.perWarp;
  return g;
}

template <class Format>
__global__ void encodeFp8Kernel(const float* in, size_t count, size_t blockSize, size_t blocks,
                                unsigned group, uint8_t* out) {
  const Groups g = groupsOf(group);
  uint8_t* codes = out + blocks * sizeof(float);
  for (size_t base = g.firstBase; base < blocks; base += g.stride) {
    const size_t b = base + g.inWarp;
    const size_t start = b * blockSize;
    const size_t n = b < blocks ? min(blockSize, count - start) : 0;
    uint32_t largest = 0;
    for (size_t i = g.lane; i < n; i += group)
      largest = max(largest, el::finiteAbsBits(in[start + i]));
    for (unsigned offset = group / 2; offset > 0; offset /= 2)
      largest = max(largest, hetraShuffleXor(largest, offset, group));
    if (n == 0) continue;
    const float scale = Format::blockScale(el::floatOf(largest));
    if (g.lane == 0) el::storeScale(out + b * sizeof(float), scale);
    for (size_t i = g.lane; i < n; i += group)
      codes[start + i] = Format::encodeScaled(in[start + i], scale);
  }
}

template <class Format, bool kAdd>
__global__ void decodeFp8Kernel(const uint8_t* in, size_t count, size_t blockSize, size_t blocks,
                                unsigned group, float* out) {
  const Groups g = groupsOf(group);
  const uint8_t* codes = in + blocks * sizeof(float);
  for (size_t base = g.firstBase; base < blocks; base += g.stride) {
    const size_t b = base + g.inWarp;
    if (b >= blocks) continue;  // no shuffles here: lanes may diverge
    const size_t start = b * blockSize;
    const size_t n = min(blockSize, count - start);
    const float scale = el::loadScale(in + b * sizeof(float));
    for (size_t i = g.lane; i < n; i += group) {
      const float value = Format::decode(codes[start + i], scale);
      if constexpr (kAdd)
        out[start + i] = el::addRn(out[start + i], value);
      else
        out[start + i] = value;
    }
  }
}

unsigned groupFor(size_t blockSize) {
  unsigned group = 1;
  while (group < 32 && group < blockSize) group *= 2;
  return group;
}

// CTAs for one group per block.
unsigned fp8Ctas(size_t blocks, unsigned group) {
  const size_t perWarp = 32 / group;
  return ctasFor((blocks + perWarp - 1) / perWarp * 32);
}

void checkArguments(comm::Compression kind, size_t blockSize) {
  HETRA_ENFORCE(kind != comm::Compression::None, "cuda codec: compression None is not a codec");
  if (blockSize == 0) throw ConfigError("codec block size 0: it must be at least 1 element");
}

bool aligned2(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 2 == 0;
}

template <class Half>
void launchEncodeHalf(const float* in, size_t count, void* out, cudaStream_t stream) {
  auto* bytes = static_cast<uint8_t*>(out);
  if (aligned2(out))
    encodeHalfKernel<Half, true><<<ctasFor(count), kThreads, 0, stream>>>(in, count, bytes);
  else
    encodeHalfKernel<Half, false><<<ctasFor(count), kThreads, 0, stream>>>(in, count, bytes);
}

template <class Half, bool kAdd>
void launchDecodeHalf(const void* in, size_t count, float* out, cudaStream_t stream) {
  const auto* bytes = static_cast<const uint8_t*>(in);
  if (aligned2(in))
    decodeHalfKernel<Half, true, kAdd><<<ctasFor(count), kThreads, 0, stream>>>(bytes, count, out);
  else
    decodeHalfKernel<Half, false, kAdd><<<ctasFor(count), kThreads, 0, stream>>>(bytes, count, out);
}

template <class Format>
void launchEncodeFp8(const float* in, size_t count, size_t blockSize, void* out,
                     cudaStream_t stream) {
  const size_t blocks = (count + blockSize - 1) / blockSize;
  const unsigned group = groupFor(blockSize);
  encodeFp8Kernel<Format><<<fp8Ctas(blocks, group), kThreads, 0, stream>>>(
      in, count, blockSize, blocks, group, static_cast<uint8_t*>(out));
}

template <class Format, bool kAdd>
void launchDecodeFp8(const void* in, size_t count, size_t blockSize, float* out,
                     cudaStream_t stream) {
  const size_t blocks = (count + blockSize - 1) / blockSize;
  const unsigned group = groupFor(blockSize);
  decodeFp8Kernel<Format, kAdd><<<fp8Ctas(blocks, group), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(in), count, blockSize, blocks, group, out);
}

template <bool kAdd>
void decodeAny(comm::Compression kind, size_t blockSize, const void* in, size_t count, float* out,
               cudaStream_t stream) {
  checkArguments(kind, blockSize);
  if (count == 0) return;
  switch (kind) {
    case comm::Compression::F16:
      launchDecodeHalf<F16, kAdd>(in, count, out, stream);
      break;
    case comm::Compression::BF16:
      launchDecodeHalf<Bf16, kAdd>(in, count, out, stream);
      break;
    case comm::Compression::Fp8E4M3:
      launchDecodeFp8<el::Fp8E4M3, kAdd>(in, count, blockSize, out, stream);
      break;
    case comm::Compression::Fp8E5M2:
      launchDecodeFp8<el::Fp8E5M2, kAdd>(in, count, blockSize, out, stream);
      break;
    case comm::Compression::None:
      break;
  }
  HETRA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

size_t encodedBytes(comm::Compression kind, size_t blockSize, size_t count) {
  checkArguments(kind, blockSize);
  if (kind == comm::Compression::F16 || kind == comm::Compression::BF16)
    return count * sizeof(uint16_t);
  return (count + blockSize - 1) / blockSize * sizeof(float) + count;
}

void cudaEncode(comm::Compression kind, size_t blockSize, const float* in, size_t count, void* out,
                cudaStream_t stream) {
  checkArguments(kind, blockSize);
  if (count == 0) return;
  switch (kind) {
    case comm::Compression::F16:
      launchEncodeHalf<F16>(in, count, out, stream);
      break;
    case comm::Compression::BF16:
      launchEncodeHalf<Bf16>(in, count, out, stream);
      break;
    case comm::Compression::Fp8E4M3:
      launchEncodeFp8<el::Fp8E4M3>(in, count, blockSize, out, stream);
      break;
    case comm::Compression::Fp8E5M2:
      launchEncodeFp8<el::Fp8E5M2>(in, count, blockSize, out, stream);
      break;
    case comm::Compression::None:
      break;
  }
  HETRA_CUDA_CHECK(cudaGetLastError());
}

void cudaDecode(comm::Compression kind, size_t blockSize, const void* in, size_t count, float* out,
                cudaStream_t stream) {
  decodeAny<false>(kind, blockSize, in, count, out, stream);
}

void cudaDecodeAdd(comm::Compression kind, size_t blockSize, const void* in, size_t count,
                   float* out, cudaStream_t stream) {
  decodeAny<true>(kind, blockSize, in, count, out, stream);
}

}  // namespace hetra::cuda
