// The element conversions of the GPU codec kernels (src/cuda/codec_elements.h), compiled here with
// the host compiler, against the CPU codecs (comm/codec): every 16-bit and 8-bit code, random
// float32 bit patterns of every class, the block scale rule, and whole buffers laid out as the
// kernels lay them out. Runs in every build, with or without a GPU toolkit; test_gpu_kernels
// compares the kernels themselves on a GPU.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "comm/codec/codec.h"
#include "cuda/codec_elements.h"

namespace hetra::comm {
namespace {

namespace el = hetra::cuda::elements;

using el::bitsOf;  // the kernels' own bit casts, host-compiled
using el::floatOf;

// Random float32 patterns of every class: uniform bits (NaN payloads, subnormals, huge and tiny),
// plus values near the formats' rounding boundaries and specials.
std::vector<float> patterns(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> out;
  out.reserve(count + 32);
  for (float v : {0.0f,
                  -0.0f,
                  INFINITY,
                  -INFINITY,
                  NAN,
                  -NAN,
                  FLT_MIN,
                  -FLT_MIN,
                  FLT_MAX,
                  -FLT_MAX,
                  65504.0f,
                  65520.0f,
                  65519.99f,
                  448.0f,
                  464.0f,
                  57344.0f,
                  61440.0f,
                  0x1p-24f,
                  0x1p-25f,
                  0x1.8p-25f,
                  0x1p-9f,
                  0x1p-10f,
                  0x1p-16f,
                  0x1p-17f,
                  floatOf(1),
                  floatOf(0x7f800001u),
                  floatOf(0xffbfffffu),
                  floatOf(0x7fc00001u)})
    out.push_back(v);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> moderate(-600.0f, 600.0f);
  for (size_t i = 0; i < count; ++i) out.push_back(i % 2 ? floatOf(bits(rng)) : moderate(rng));
  return out;
}

TEST(CodecGpuElements, HalfFormatsEveryCodeDecodesAsTheCpu) {
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(bitsOf(el::f16Decode(uint16_t(h))), bitsOf(f16ToFloat(uint16_t(h)))) << std::hex << h;
    ASSERT_EQ(bitsOf(el::bf16Decode(uint16_t(h))), bitsOf(bf16ToFloat(uint16_t(h))))
        << std::hex << h;
  }
}

TEST(CodecGpuElements, EncodeMatchesTheCpuOnRandomPatterns) {
  for (float x : patterns(1 << 20, 7)) {
    ASSERT_EQ(el::f16Encode(x), floatToF16(x)) << std::hex << bitsOf(x);
    ASSERT_EQ(el::bf16Encode(x), floatToBf16(x)) << std::hex << bitsOf(x);
    ASSERT_EQ(el::Fp8E4M3::encode(x), floatToFp8E4M3(x)) << std::hex << bitsOf(x);
    ASSERT_EQ(el::Fp8E5M2::encode(x), floatToFp8E5M2(x)) << std::hex << bitsOf(x);
  }
  // Every f16 / bf16 value (and the midpoints between neighbours) re-encodes as the CPU does.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float value = f16ToFloat(uint16_t(h));
    const float mid = floatOf(bitsOf(value) + 0x1000u);  // half an fp16 ulp above, for normals
    ASSERT_EQ(el::f16Encode(value), floatToF16(value)) << std::hex << h;
    ASSERT_EQ(el::f16Encode(mid), floatToF16(mid)) << std::hex << h;
    const float bmid = floatOf((h << 16) | 0x8000u);  // exactly halfway between two bf16
    ASSERT_EQ(el::bf16Encode(bmid), floatToBf16(bmid)) << std::hex << h;
  }
}

TEST(CodecGpuElements, BlockScaleFollowsTheCpuRule) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> finite(0, 0x7f7fffffu);
  std::vector<float> absmaxes = {
      0.0f, FLT_MIN, 0x1p-149f, 1.0f, 448.0f, 57344.0f, FLT_MAX, floatOf(0x7f7ffffeu), 3.0e38f};
  for (int i = 0; i < 100000; ++i) absmaxes.push_back(floatOf(finite(rng)));
  for (float a : absmaxes) {
    ASSERT_EQ(bitsOf(el::Fp8E4M3::blockScale(a)), bitsOf(fp8BlockScale(Compression::Fp8E4M3, a)))
        << a;
    ASSERT_EQ(bitsOf(el::Fp8E5M2::blockScale(a)), bitsOf(fp8BlockScale(Compression::Fp8E5M2, a)))
        << a;
  }
}

// Decoding a code with a scale, compared through the CPU codec's decode of a one-block buffer.
template <class Format>
void checkFp8Decode(Compression kind) {
  auto codec = makeCodec(kind, 256, CodecIsa::Scalar);
  std::vector<float> scales = {1.0f, FLT_MIN, 0x1p-20f,
                               3.5f, 1.0e30f, el::Fp8E4M3::blockScale(FLT_MAX)};
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> normal(0x00800000u, 0x7f7fffffu);
  for (int i = 0; i < 50; ++i) scales.push_back(floatOf(normal(rng)));
  std::vector<uint8_t> encoded(4 + 256);
  std::vector<float> decoded(256);
  for (float scale : scales) {
    std::memcpy(encoded.data(), &scale, 4);
    for (int c = 0; c < 256; ++c) encoded[4 + size_t(c)] = uint8_t(c);
    codec->decode(encoded.data(), 256, decoded.data());
    ASSERT_EQ(bitsOf(el::loadScale(encoded.data())), bitsOf(scale));
    for (int c = 0; c < 256; ++c)
      ASSERT_EQ(bitsOf(Format::decode(uint8_t(c), scale)), bitsOf(decoded[size_t(c)]))
          << compressionName(kind) << " code " << c << " scale " << scale;
  }
}

TEST(CodecGpuElements, Fp8DecodeMatchesTheCpuForEveryCodeAndScale) {
  checkFp8Decode<el::Fp8E4M3>(Compression::Fp8E4M3);
  checkFp8Decode<el::Fp8E5M2>(Compression::Fp8E5M2);
}

// A whole buffer as the kernels compute it: each block's absmax as an integer max of
// finiteAbsBits, the scale, then encodeScaled per element; scales first, then the codes.
template <class Format>
std::vector<uint8_t> encodeAsKernels(const std::vector<float>& x, size_t blockSize) {
  const size_t blocks = (x.size() + blockSize - 1) / blockSize;
  std::vector<uint8_t> out(blocks * 4 + x.size());
  for (size_t b = 0; b < blocks; ++b) {
    const size_t start = b * blockSize;
    const size_t n = std::min(blockSize, x.size() - start);
    uint32_t largest = 0;
    for (size_t i = 0; i < n; ++i) largest = std::max(largest, el::finiteAbsBits(x[start + i]));
    const float scale = Format::blockScale(el::floatOf(largest));
    el::storeScale(out.data() + b * 4, scale);
    for (size_t i = 0; i < n; ++i)
      out[blocks * 4 + start + i] = Format::encodeScaled(x[start + i], scale);
  }
  return out;
}

TEST(CodecGpuElements, WholeBuffersEncodeAndDecodeAsTheCpu) {
  std::mt19937 rng(3);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(255), size_t(1000), size_t(4099)}) {
    // Blocks of different magnitudes, with NaN, Inf and subnormals sprinkled in.
    std::vector<float> x(count);
    const auto special = patterns(0, 0);
    for (size_t i = 0; i < count; ++i)
      x[i] = i % 37 == 5 ? special[i % special.size()]
                         : gauss(rng) * std::ldexp(1.0f, int(i / 97 % 40) - 20);
    for (size_t blockSize : {size_t(1), size_t(7), size_t(32), size_t(256), size_t(1000)}) {
      for (Compression kind : {Compression::Fp8E4M3, Compression::Fp8E5M2}) {
        auto codec = makeCodec(kind, blockSize);
        std::vector<uint8_t> want(codec->encodedBytes(count));
        codec->encode(x.data(), count, want.data());
        const auto got = kind == Compression::Fp8E4M3 ? encodeAsKernels<el::Fp8E4M3>(x, blockSize)
                                                      : encodeAsKernels<el::Fp8E5M2>(x, blockSize);
        ASSERT_EQ(got.size(), want.size());
        ASSERT_TRUE(got == want) << compressionName(kind) << " count " << count << " block "
                                 << blockSize;
        // decodeAdd as the kernels do it: out + decoded, one IEEE addition.
        const size_t blocks = (count + blockSize - 1) / blockSize;
        std::vector<float> base(count), cpu(count);
        for (size_t i = 0; i < count; ++i) base[i] = cpu[i] = float(i % 13) - 6.5f;
        codec->decodeAdd(want.data(), count, cpu.data());
        for (size_t i = 0; i < count; ++i) {
          const float scale = el::loadScale(got.data() + i / blockSize * 4);
          const uint8_t code = got[blocks * 4 + i];
          const float decoded = kind == Compression::Fp8E4M3 ? el::Fp8E4M3::decode(code, scale)
                                                             : el::Fp8E5M2::decode(code, scale);
          const float sum = el::addRn(base[i], decoded);
          if (std::isnan(cpu[i]))
            ASSERT_TRUE(std::isnan(sum)) << i;
          else
            ASSERT_EQ(bitsOf(sum), bitsOf(cpu[i])) << compressionName(kind) << " " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace hetra::comm
