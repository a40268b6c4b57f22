// Codecs that shrink float32 gradients for slow links: IEEE half, bfloat16 and the two OCP FP8
// formats with one fp32 scale per block. The compressed collectives encode what goes on the wire
// and reduce in fp32 (decode, add, encode once), so the error does not grow with the world size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace hetra::comm {

enum class Compression : uint8_t { None, F16, BF16, Fp8E4M3, Fp8E5M2 };

// "none", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2"
const char* compressionName(Compression kind);
// Accepts the names above; throws ConfigError naming the value and the allowed names.
Compression parseCompression(std::string_view name);
// Half an ulp relative to the value (2^-(m+1), m mantissa bits): fp16 2^-11, bf16 2^-8, fp8-e4m3
// 2^-4, fp8-e5m2 2^-3; 0 for none. The per-element error bound of the formats below, and of the
// compressed collectives (algorithms/compressed.h), is a small multiple of it.
double unitRoundoff(Compression kind);

// Encodes float32 buffers. Every method depends only on its arguments (no state between calls), so
// ranks that encode the same values produce the same bytes, and one codec may be used from several
// threads at once.
class Codec {
 public:
  virtual ~Codec() = default;
  virtual Compression kind() const = 0;
  // Elements per block: 1 for fp16 and bf16, the FP8 block size. A buffer encoded in pieces whose
  // counts are multiples of it (the last may be shorter) gets the same scales and codes as encoded
  // at once (each piece carries its own blocks' scales), and encodedBytes adds up over the pieces.
  virtual size_t blockSize() const = 0;
  // Bytes that encode() writes for `count` elements (for FP8: the block scales plus one byte per
  // element).
  virtual size_t encodedBytes(size_t count) const = 0;
  virtual void encode(const float* in, size_t count, void* out) const = 0;
  virtual void decode(const void* in, size_t count, float* out) const = 0;
  // out[i] += decoded element i: the receive side of a reduction in one pass.
  virtual void decodeAdd(const void* in, size_t count, float* out) const = 0;
};

// Which loops a codec runs. Auto picks, once per process, the best this CPU supports (AVX-512 BW,
// then AVX2 with F16C, then the portable loops), unless HETRA_CODEC_ISA names one. Every path gives
// bit-identical bytes and floats (under the default floating-point environment: no FTZ/DAZ), so
// ranks on different CPUs agree; Scalar exists to check that and to compare speeds.
enum class CodecIsa : uint8_t { Auto, Scalar, Avx2, Avx512 };
const char* codecIsaName(CodecIsa isa);         // "auto", "scalar", "avx2", "avx512"
CodecIsa parseCodecIsa(std::string_view name);  // throws ConfigError
// Whether this build and CPU can run `isa` (Auto and Scalar always can).
bool codecIsaSupported(CodecIsa isa);
// What Auto resolves to in this process.
CodecIsa resolveCodecIsa(CodecIsa isa);

// blockSize: elements per fp32 scale of the FP8 formats (ignored by the others); 0 throws
// ConfigError. Kind None is not a codec: asking for it is a programming error. An unsupported isa
// throws ConfigError.
std::unique_ptr<Codec> makeCodec(Compression kind, size_t blockSize = 256,
                                 CodecIsa isa = CodecIsa::Auto);

// Formats, exactly (what every path computes; the tests check each path against these):
//
// fp16 (IEEE binary16) and bf16: round to nearest, ties to even, subnormals kept. IEEE overflow:
// a finite value that rounds beyond the largest finite (fp16 |x| >= 65520, bf16 |x| >= 2^128 -
// 2^119) becomes Inf of its sign. Inf stays Inf; NaN stays NaN with its sign, quiet, and the top
// payload bits (those that fit). Decoding is exact; an fp16 NaN decodes quiet (as F16C does), a
// bf16 code decodes to its bits shifted up, NaN included. Layout: one uint16 per element, host
// byte order.
//
// fp8-e4m3 (OCP E4M3FN: bias 7, 3 mantissa bits, largest 448, no Inf, NaN = S.1111.111) and
// fp8-e5m2 (bias 15, 2 mantissa bits, largest 57344, Inf = S.11111.00, NaN = S.11111.xx, xx != 0),
// with one fp32 scale per block of blockSize elements (the last block may be shorter):
//   absmax = largest |x| over the block's finite elements (0 if none)
//   scale  = max(absmax / formatMax, FLT_MIN), one step towards 0 if formatMax * scale overflows
//   code   = fp8(x / scale): round to nearest even, subnormals kept, finite values saturate to
//            +-formatMax (never Inf or NaN); NaN -> NaN (S.1111.111 / S.11111.10); e5m2 keeps +-Inf
//            (S.11111.00); e4m3 has no Inf, so +-Inf becomes NaN (S.1111.111).
//   decode = finite code: value(code) * scale (one fp32 rounding, never overflows); NaN codes:
//            quiet NaN with the code's sign; e5m2 Inf codes: +-Inf.
// An all-zero block gets scale FLT_MIN and decodes to zeros of the same signs.
// Layout: ceil(count / blockSize) fp32 scales (host byte order, unaligned), then count code bytes.
//
// Error (finite x within the format's finite range, q = decode(encode(x)), m mantissa bits):
//   fp16/bf16: |x - q| <= 2^-(m+1) * max(|x|, smallest normal)          (m = 10 / 7)
//   fp8:       |x - q| <= (2^-(m+1) + 2^-21) * |x| + scale * 2^-(bias+m) + 2^-149   (m = 3 / 2)
// The fp8 terms: half a spacing of the format relative to x, the rounding of x / scale and of
// value * scale, half the format's smallest subnormal step (times scale) for elements far below
// the block's absmax, and half an fp32 subnormal step when q is itself an fp32 subnormal.
constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;

// Element conversions, the definitions above without the scale (scale 1). For tests and tools.
uint16_t floatToF16(float value);
float f16ToFloat(uint16_t bits);
uint16_t floatToBf16(float value);
float bf16ToFloat(uint16_t bits);
uint8_t floatToFp8E4M3(float value);
float fp8E4M3ToFloat(uint8_t code);
uint8_t floatToFp8E5M2(float value);
float fp8E5M2ToFloat(uint8_t code);
// The block scale above for the block's finite absmax (kind Fp8E4M3 or Fp8E5M2).
float fp8BlockScale(Compression kind, float absmax);

}  // namespace hetra::comm
