// The codecs: the element conversions of elements.h in loops compiled three times (portable,
// AVX2 + F16C, AVX-512), one of which is chosen at run time. fp16 uses the F16C conversion
// instructions on the vector paths (the portable conversion matches them bit for bit, NaN payloads
// included); bf16 and fp8 are integer bit manipulation that the compiler vectorises from the same
// source. bf16 deliberately does not use AVX512-BF16's vcvtneps2bf16: it flushes subnormals to
// zero, which would break bit-identity with the portable path.
#include "comm/codec/codec.h"

#include <algorithm>
#include <cstring>

// The vector lanes are passed between always_inline functions only, so the ABI of passing them to
// functions compiled without AVX (what -Wpsabi warns about) never applies.
#pragma GCC diagnostic ignored "-Wpsabi"
#include "comm/codec/elements.h"
#include "common/cpu_features.h"
#include "common/errors.h"
#include "common/names.h"
#include "common/params.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define HETRA_CODEC_X86 1
#endif

namespace hetra::comm {
namespace {

using codec::Fp8E4M3;
using codec::Fp8E5M2;
using codec::Scalar;

// decodeAdd decodes this many elements to the stack, then adds: a separate add loop cannot be
// contracted with the decode's multiplication into a fused multiply-add, so decodeAdd equals decode
// followed by an addition on every path.
constexpr size_t kChunk = 512;

// ---- Loops shared by all paths (inlined into each path's functions below).

// The loops: whole vectors of L::kWidth elements, then the tail one element at a time with the
// scalar instantiation of the same conversion.
template <class L>
HETRA_CODEC_INLINE void addLoop(const float* in, size_t count, float* out) {
  size_t i = 0;
  for (; i + L::kWidth <= count; i += L::kWidth)
    L::storeF(out + i, L::loadF(out + i) + L::loadF(in + i));
  for (; i < count; ++i) out[i] += in[i];
}

template <class L>
HETRA_CODEC_INLINE void encodeBf16Loop(const float* in, size_t count, uint16_t* out) {
  size_t i = 0;
  for (; i + L::kWidth <= count; i += L::kWidth)
    L::store16(out + i, codec::bf16Encode<L>(L::loadF(in + i)));
  for (; i < count; ++i) out[i] = uint16_t(codec::bf16Encode<Scalar>(in[i]));
}

template <class L>
HETRA_CODEC_INLINE void decodeBf16Loop(const uint16_t* in, size_t count, float* out) {
  size_t i = 0;
  for (; i + L::kWidth <= count; i += L::kWidth)
    L::storeF(out + i, codec::bf16Decode<L>(L::load16(in + i)));
  for (; i < count; ++i) out[i] = codec::bf16Decode<Scalar>(in[i]);
}

template <class Format, class L>
HETRA_CODEC_INLINE void encodeFp8Loop(const float* in, size_t count, size_t blockSize,
                                      uint8_t* out) {
  const size_t blocks = (count + blockSize - 1) / blockSize;
  uint8_t* codes = out + blocks * sizeof(float);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t start = b * blockSize;
    const size_t n = std::min(blockSize, count - start);
    const float* x = in + start;
    uint8_t* c = codes + start;
    const float scale = Format::blockScale(codec::Scalar::floats(codec::finiteAbsMaxBits<L>(x, n)));
    std::memcpy(out + b * sizeof(float), &scale, sizeof scale);
    size_t i = 0;
    for (; i + L::kWidth <= n; i += L::kWidth)
      L::store8(c + i, Format::template encode<L>(L::loadF(x + i) / scale));
    for (; i < n; ++i) c[i] = uint8_t(Format::template encode<Scalar>(x[i] / scale));
  }
}

template <class Format, class L>
HETRA_CODEC_INLINE void decodeFp8Run(const uint8_t* c, size_t n, float scale, float* y) {
  size_t i = 0;
  for (; i + L::kWidth <= n; i += L::kWidth)
    L::storeF(y + i, Format::template decode<L>(L::load8(c + i), scale));
  for (; i < n; ++i) y[i] = Format::template decode<Scalar>(c[i], scale);
}

template <class Format, class L, bool kAdd>
HETRA_CODEC_INLINE void decodeFp8Loop(const uint8_t* in, size_t count, size_t blockSize,
                                      float* out) {
  const size_t blocks = (count + blockSize - 1) / blockSize;
  const uint8_t* codes = in + blocks * sizeof(float);
  alignas(64) float chunk[kChunk];
  for (size_t b = 0; b < blocks; ++b) {
    const size_t start = b * blockSize;
    const size_t n = std::min(blockSize, count - start);
    float scale;
    std::memcpy(&scale, in + b * sizeof(float), sizeof scale);
    if constexpr (kAdd) {
      for (size_t done = 0; done < n; done += kChunk) {
        const size_t len = std::min(kChunk, n - done);
        decodeFp8Run<Format, L>(codes + start + done, len, scale, chunk);
        addLoop<L>(chunk, len, out + start + done);
      }
    } else {
      decodeFp8Run<Format, L>(codes + start, n, scale, out + start);
    }
  }
}

// decodeAdd of a 16-bit format through a stack chunk, from that path's decode.
template <class L, void (*kDecode)(const uint16_t*, size_t, float*)>
HETRA_CODEC_INLINE void decodeAdd16(const uint16_t* in, size_t count, float* out) {
  alignas(64) float chunk[kChunk];
  for (size_t done = 0; done < count; done += kChunk) {
    const size_t len = std::min(kChunk, count - done);
    kDecode(in + done, len, chunk);
    addLoop<L>(chunk, len, out + done);
  }
}

struct Kernels {
  void (*encodeF16)(const float*, size_t, uint16_t*);
  void (*decodeF16)(const uint16_t*, size_t, float*);
  void (*decodeAddF16)(const uint16_t*, size_t, float*);
  void (*encodeBf16)(const float*, size_t, uint16_t*);
  void (*decodeBf16)(const uint16_t*, size_t, float*);
  void (*decodeAddBf16)(const uint16_t*, size_t, float*);
  void (*encodeE4M3)(const float*, size_t, size_t, uint8_t*);
  void (*decodeE4M3)(const uint8_t*, size_t, size_t, float*);
  void (*decodeAddE4M3)(const uint8_t*, size_t, size_t, float*);
  void (*encodeE5M2)(const float*, size_t, size_t, uint8_t*);
  void (*decodeE5M2)(const uint8_t*, size_t, size_t, float*);
  void (*decodeAddE5M2)(const uint8_t*, size_t, size_t, float*);
};

// The functions of one path: the shared loops with L lanes, compiled with the path's target
// attribute (ATTR); fp16 comes from the path itself (F16Encode, F16Decode).
#define HETRA_CODEC_PATH(ATTR, L, F16Encode, F16Decode)                                \
  ATTR void decodeAddF16(const uint16_t* in, size_t count, float* out) {               \
    decodeAdd16<L, F16Decode>(in, count, out);                                         \
  }                                                                                    \
  ATTR void encodeBf16(const float* in, size_t count, uint16_t* out) {                 \
    encodeBf16Loop<L>(in, count, out);                                                 \
  }                                                                                    \
  ATTR void decodeBf16(const uint16_t* in, size_t count, float* out) {                 \
    decodeBf16Loop<L>(in, count, out);                                                 \
  }                                                                                    \
  ATTR void decodeAddBf16(const uint16_t* in, size_t count, float* out) {              \
    decodeAdd16<L, decodeBf16>(in, count, out);                                        \
  }                                                                                    \
  ATTR void encodeE4M3(const float* in, size_t count, size_t block, uint8_t* out) {    \
    encodeFp8Loop<Fp8E4M3, L>(in, count, block, out);                                  \
  }                                                                                    \
  ATTR void decodeE4M3(const uint8_t* in, size_t count, size_t block, float* out) {    \
    decodeFp8Loop<Fp8E4M3, L, false>(in, count, block, out);                           \
  }                                                                                    \
  ATTR void decodeAddE4M3(const uint8_t* in, size_t count, size_t block, float* out) { \
    decodeFp8Loop<Fp8E4M3, L, true>(in, count, block, out);                            \
  }                                                                                    \
  ATTR void encodeE5M2(const float* in, size_t count, size_t block, uint8_t* out) {    \
    encodeFp8Loop<Fp8E5M2, L>(in, count, block, out);                                  \
  }                                                                                    \
  ATTR void decodeE5M2(const uint8_t* in, size_t count, size_t block, float* out) {    \
    decodeFp8Loop<Fp8E5M2, L, false>(in, count, block, out);                           \
  }                                                                                    \
  ATTR void decodeAddE5M2(const uint8_t* in, size_t count, size_t block, float* out) { \
    decodeFp8Loop<Fp8E5M2, L, true>(in, count, block, out);                            \
  }                                                                                    \
  const Kernels kKernels = {F16Encode,     F16Decode,     decodeAddF16, encodeBf16,    \
                            decodeBf16,    decodeAddBf16, encodeE4M3,   decodeE4M3,    \
                            decodeAddE4M3, encodeE5M2,    decodeE5M2,   decodeAddE5M2};

// The scalar tails of the fp16 vector loops.
HETRA_CODEC_INLINE void encodeF16Tail(const float* in, size_t count, uint16_t* out) {
  for (size_t i = 0; i < count; ++i) out[i] = uint16_t(codec::f16Encode<Scalar>(in[i]));
}
HETRA_CODEC_INLINE void decodeF16Tail(const uint16_t* in, size_t count, float* out) {
  for (size_t i = 0; i < count; ++i) out[i] = codec::f16Decode<Scalar>(in[i]);
}

namespace scalar {
void encodeF16(const float* in, size_t count, uint16_t* out) {
  encodeF16Tail(in, count, out);
}
void decodeF16(const uint16_t* in, size_t count, float* out) {
  decodeF16Tail(in, count, out);
}
HETRA_CODEC_PATH(, Scalar, encodeF16, decodeF16)
}  // namespace scalar

#if HETRA_CODEC_X86
#define HETRA_CODEC_AVX2 __attribute__((target("avx2,f16c")))
#define HETRA_CODEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

namespace avx2 {
HETRA_CODEC_AVX2 void encodeF16(const float* in, size_t count, uint16_t* out) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  encodeF16Tail(in + i, count - i, out + i);
}
HETRA_CODEC_AVX2 void decodeF16(const uint16_t* in, size_t count, float* out) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  decodeF16Tail(in + i, count - i, out + i);
}
HETRA_CODEC_PATH(HETRA_CODEC_AVX2, codec::Lanes8, encodeF16, decodeF16)
}  // namespace avx2

namespace avx512 {
HETRA_CODEC_AVX512 void encodeF16(const float* in, size_t count, uint16_t* out) {
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    // The maskz forms: the unmasked ones trip GCC 12's -Wmaybe-uninitialized in its own headers.
    const __m256i h =
        _mm512_maskz_cvtps_ph(0xffff, _mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
  }
  encodeF16Tail(in + i, count - i, out + i);
}
HETRA_CODEC_AVX512 void decodeF16(const uint16_t* in, size_t count, float* out) {
  size_t i = 0;
  for (; i + 16 <= count; i += 16)
    _mm512_storeu_ps(out + i,
                     _mm512_maskz_cvtph_ps(
                         0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  decodeF16Tail(in + i, count - i, out + i);
}
HETRA_CODEC_PATH(HETRA_CODEC_AVX512, codec::Lanes16, encodeF16, decodeF16)
}  // namespace avx512
#endif

const Kernels& kernelsFor(CodecIsa isa) {
#if HETRA_CODEC_X86
  if (isa == CodecIsa::Avx512) return avx512::kKernels;
  if (isa == CodecIsa::Avx2) return avx2::kKernels;
#endif
  return scalar::kKernels;
}

CodecIsa bestIsa() {
#if HETRA_CODEC_X86
  if (codecIsaSupported(CodecIsa::Avx512)) return CodecIsa::Avx512;
  if (codecIsaSupported(CodecIsa::Avx2)) return CodecIsa::Avx2;
#endif
  return CodecIsa::Scalar;
}

const Param kIsaParam("HETRA_CODEC_ISA", "auto",
                      "Loops of the gradient codecs (fp16, bf16, fp8): auto (the best this CPU "
                      "supports), avx512, avx2 or scalar; all give identical bytes");

// Auto as resolved once per process: HETRA_CODEC_ISA, else the best the CPU supports.
CodecIsa autoIsa() {
  static const CodecIsa resolved = [] {
    const CodecIsa chosen = parseCodecIsa(kIsaParam.str());
    if (chosen == CodecIsa::Auto) return bestIsa();
    if (!codecIsaSupported(chosen))
      throw ConfigError(
          str("HETRA_CODEC_ISA=", kIsaParam.str(), ": this CPU or build does not support it"));
    return chosen;
  }();
  return resolved;
}

class HalfCodec final : public Codec {
 public:
  HalfCodec(Compression kind, const Kernels& kernels) : kind_(kind) {
    const bool f16 = kind == Compression::F16;
    encode_ = f16 ? kernels.encodeF16 : kernels.encodeBf16;
    decode_ = f16 ? kernels.decodeF16 : kernels.decodeBf16;
    decodeAdd_ = f16 ? kernels.decodeAddF16 : kernels.decodeAddBf16;
  }
  Compression kind() const override { return kind_; }
  size_t blockSize() const override { return 1; }
  size_t encodedBytes(size_t count) const override { return count * sizeof(uint16_t); }
  void encode(const float* in, size_t count, void* out) const override {
    encode_(in, count, static_cast<uint16_t*>(out));
  }
  void decode(const void* in, size_t count, float* out) const override {
    decode_(static_cast<const uint16_t*>(in), count, out);
  }
  void decodeAdd(const void* in, size_t count, float* out) const override {
    decodeAdd_(static_cast<const uint16_t*>(in), count, out);
  }

 private:
  Compression kind_;
  void (*encode_)(const float*, size_t, uint16_t*);
  void (*decode_)(const uint16_t*, size_t, float*);
  void (*decodeAdd_)(const uint16_t*, size_t, float*);
};

class Fp8Codec final : public Codec {
 public:
  Fp8Codec(Compression kind, size_t blockSize, const Kernels& kernels)
      : kind_(kind), blockSize_(blockSize) {
    const bool e4m3 = kind == Compression::Fp8E4M3;
    encode_ = e4m3 ? kernels.encodeE4M3 : kernels.encodeE5M2;
    decode_ = e4m3 ? kernels.decodeE4M3 : kernels.decodeE5M2;
    decodeAdd_ = e4m3 ? kernels.decodeAddE4M3 : kernels.decodeAddE5M2;
  }
  Compression kind() const override { return kind_; }
  size_t blockSize() const override { return blockSize_; }
  size_t encodedBytes(size_t count) const override {
    return (count + blockSize_ - 1) / blockSize_ * sizeof(float) + count;
  }
  void encode(const float* in, size_t count, void* out) const override {
    encode_(in, count, blockSize_, static_cast<uint8_t*>(out));
  }
  void decode(const void* in, size_t count, float* out) const override {
    decode_(static_cast<const uint8_t*>(in), count, blockSize_, out);
  }
  void decodeAdd(const void* in, size_t count, float* out) const override {
    decodeAdd_(static_cast<const uint8_t*>(in), count, blockSize_, out);
  }

 private:
  Compression kind_;
  size_t blockSize_;
  void (*encode_)(const float*, size_t, size_t, uint8_t*);
  void (*decode_)(const uint8_t*, size_t, size_t, float*);
  void (*decodeAdd_)(const uint8_t*, size_t, size_t, float*);
};

}  // namespace

constexpr NamedValue<Compression> kCompressionNames[] = {{Compression::None, "none"},
                                                         {Compression::F16, "fp16"},
                                                         {Compression::BF16, "bf16"},
                                                         {Compression::Fp8E4M3, "fp8-e4m3"},
                                                         {Compression::Fp8E5M2, "fp8-e5m2"}};
static_assert(coversEnum(kCompressionNames, Compression::Fp8E5M2));

const char* compressionName(Compression kind) {
  return nameOf(kind, kCompressionNames);
}

Compression parseCompression(std::string_view name) {
  return parseName(name, kCompressionNames, "compression");
}

double unitRoundoff(Compression kind) {
  switch (kind) {
    case Compression::None:
      return 0;
    case Compression::F16:
      return 0x1p-11;
    case Compression::BF16:
      return 0x1p-8;
    case Compression::Fp8E4M3:
      return 0x1p-4;
    case Compression::Fp8E5M2:
      return 0x1p-3;
  }
  return 0;
}

constexpr NamedValue<CodecIsa> kCodecIsaNames[] = {{CodecIsa::Auto, "auto"},
                                                   {CodecIsa::Scalar, "scalar"},
                                                   {CodecIsa::Avx2, "avx2"},
                                                   {CodecIsa::Avx512, "avx512"}};
static_assert(coversEnum(kCodecIsaNames, CodecIsa::Avx512));

const char* codecIsaName(CodecIsa isa) {
  return nameOf(isa, kCodecIsaNames);
}

CodecIsa parseCodecIsa(std::string_view name) {
  return parseName(name, kCodecIsaNames, "codec ISA");
}

bool codecIsaSupported(CodecIsa isa) {
  switch (isa) {
    case CodecIsa::Auto:
    case CodecIsa::Scalar:
      return true;
#if HETRA_CODEC_X86
    case CodecIsa::Avx2:
      return __builtin_cpu_supports("avx2") && cpuHasF16c();
    case CodecIsa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && codecIsaSupported(CodecIsa::Avx2);
#else
    case CodecIsa::Avx2:
    case CodecIsa::Avx512:
      return false;
#endif
  }
  return false;
}

CodecIsa resolveCodecIsa(CodecIsa isa) {
  return isa == CodecIsa::Auto ? autoIsa() : isa;
}

std::unique_ptr<Codec> makeCodec(Compression kind, size_t blockSize, CodecIsa isa) {
  HETRA_ENFORCE(kind != Compression::None, "makeCodec(None): no compression is not a codec");
  if (blockSize == 0) throw ConfigError("codec block size 0: it must be at least 1 element");
  isa = resolveCodecIsa(isa);
  if (!codecIsaSupported(isa))
    throw ConfigError(
        str("codec ISA '", codecIsaName(isa), "' is not supported by this CPU or build"));
  const Kernels& kernels = kernelsFor(isa);
  switch (kind) {
    case Compression::F16:
    case Compression::BF16:
      return std::make_unique<HalfCodec>(kind, kernels);
    case Compression::Fp8E4M3:
    case Compression::Fp8E5M2:
      return std::make_unique<Fp8Codec>(kind, blockSize, kernels);
    case Compression::None:
      break;
  }
  throw EnforceError(str("makeCodec: unknown compression ", int(kind)));
}

uint16_t floatToF16(float value) {
  return uint16_t(codec::f16Encode<Scalar>(value));
}
float f16ToFloat(uint16_t bits) {
  return codec::f16Decode<Scalar>(bits);
}
uint16_t floatToBf16(float value) {
  return uint16_t(codec::bf16Encode<Scalar>(value));
}
float bf16ToFloat(uint16_t bits) {
  return codec::bf16Decode<Scalar>(bits);
}
uint8_t floatToFp8E4M3(float value) {
  return uint8_t(Fp8E4M3::encode<Scalar>(value));
}
float fp8E4M3ToFloat(uint8_t code) {
  return Fp8E4M3::decode<Scalar>(code, 1.0f);
}
uint8_t floatToFp8E5M2(float value) {
  return uint8_t(Fp8E5M2::encode<Scalar>(value));
}
float fp8E5M2ToFloat(uint8_t code) {
  return Fp8E5M2::decode<Scalar>(code, 1.0f);
}

float fp8BlockScale(Compression kind, float absmax) {
  HETRA_ENFORCE(kind == Compression::Fp8E4M3 || kind == Compression::Fp8E5M2, "fp8BlockScale of ",
                compressionName(kind));
  return kind == Compression::Fp8E4M3 ? Fp8E4M3::blockScale(absmax) : Fp8E5M2::blockScale(absmax);
}

}  // namespace hetra::comm
