// The gradient codecs against references written here independently of src/comm/codec: element
// values from ldexp, nearest-value searches in double, and the block-scale rule of codec.h. Every
// check runs on each path this CPU supports (scalar, AVX2, AVX-512), and the paths are compared
// with each other bit for bit.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "comm/codec/codec.h"
#include "common/errors.h"

namespace hetra::comm {
namespace {

uint32_t bitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
float floatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

std::vector<CodecIsa> isas() {
  std::vector<CodecIsa> out;
  for (CodecIsa isa : {CodecIsa::Scalar, CodecIsa::Avx2, CodecIsa::Avx512})
    if (codecIsaSupported(isa)) out.push_back(isa);
  return out;
}

constexpr Compression kAllKinds[] = {Compression::F16, Compression::BF16, Compression::Fp8E4M3,
                                     Compression::Fp8E5M2};
bool isFp8(Compression kind) {
  return kind == Compression::Fp8E4M3 || kind == Compression::Fp8E5M2;
}

// encode() into a buffer with a guard zone after encodedBytes(count): encode must write exactly
// that many bytes.
std::vector<uint8_t> encodeChecked(const Codec& codec, const std::vector<float>& in) {
  const size_t bytes = codec.encodedBytes(in.size());
  std::vector<uint8_t> out(bytes + 64, 0xa5);
  codec.encode(in.data(), in.size(), out.data());
  for (size_t i = bytes; i < out.size(); ++i) {
    EXPECT_EQ(out[i], 0xa5) << compressionName(codec.kind()) << " wrote past encodedBytes("
                            << in.size() << ") = " << bytes;
    if (out[i] != 0xa5) break;
  }
  out.resize(bytes);
  return out;
}

std::vector<float> decode(const Codec& codec, const std::vector<uint8_t>& in, size_t count) {
  std::vector<float> out(count + 1, floatOf(0x7fbadbadu));
  codec.decode(in.data(), count, out.data());
  EXPECT_EQ(bitsOf(out[count]), 0x7fbadbadu) << "decode wrote past count";
  out.resize(count);
  return out;
}

// ---- Independent references of the formats' values.

// Value of a format with `mantissa` bits, exponent field `exponentBits`, given bias; the all-ones
// exponent is handled by the callers.
double formatValue(uint32_t code, int exponentBits, int mantissa, int bias) {
  const uint32_t m = code & ((1u << mantissa) - 1);
  const uint32_t e = (code >> mantissa) & ((1u << exponentBits) - 1);
  const double magnitude =
      e == 0 ? std::ldexp(double(m), 1 - bias - mantissa)
             : std::ldexp(1.0 + double(m) / double(1u << mantissa), int(e) - bias);
  return (code >> (exponentBits + mantissa)) & 1 ? -magnitude : magnitude;
}

struct Fp8Spec {
  Compression kind;
  int exponentBits, mantissa, bias;
  double max;
  bool hasInf;
  uint8_t nanCode;  // what encode writes for NaN (positive sign)
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
  bool isNan(uint8_t c) const {
    return kind == Compression::Fp8E4M3 ? (c & 0x7f) == 0x7f : (c & 0x7f) > 0x7c;
  }
  bool isInf(uint8_t c) const { return hasInf && (c & 0x7f) == 0x7c; }
  double value(uint8_t c) const { return formatValue(c, exponentBits, mantissa, bias); }
  // Round to nearest, ties to the even code, saturating at +-max: a search over every finite code.
  uint8_t nearest(double y) const {
    int best = -1;
    double bestDistance = INFINITY;
    for (int c = 0; c < 128; ++c) {
      if (isNan(uint8_t(c)) || isInf(uint8_t(c))) continue;
      const double d = std::fabs(value(uint8_t(c)) - std::fabs(y));
      if (d < bestDistance || (d == bestDistance && (c & 1) == 0)) {
        best = c;
        bestDistance = d;
      }
    }
    return uint8_t(best | (std::signbit(y) ? 0x80 : 0));
  }
};

const Fp8Spec kE4M3{Compression::Fp8E4M3, 4, 3, 7, 448.0, false, 0x7f, floatToFp8E4M3,
                    fp8E4M3ToFloat};
const Fp8Spec kE5M2{Compression::Fp8E5M2, 5, 2, 15, 57344.0, true, 0x7e, floatToFp8E5M2,
                    fp8E5M2ToFloat};
const Fp8Spec& specOf(Compression kind) {
  return kind == Compression::Fp8E4M3 ? kE4M3 : kE5M2;
}

// The block scale rule of codec.h, written out again.
float referenceScale(const Fp8Spec& spec, const float* x, size_t n) {
  float absmax = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(x[i])) absmax = std::max(absmax, std::fabs(x[i]));
  float scale = absmax / float(spec.max);
  if (scale < FLT_MIN) scale = FLT_MIN;
  if (std::isinf(scale * float(spec.max))) scale = std::nextafter(scale, 0.0f);
  return scale;
}

// ---- Names and construction.

TEST(Codec, NamesRoundTripAndErrors) {
  for (Compression kind : {Compression::None, Compression::F16, Compression::BF16,
                           Compression::Fp8E4M3, Compression::Fp8E5M2})
    EXPECT_EQ(parseCompression(compressionName(kind)), kind);
  EXPECT_THROW(parseCompression("fp8"), ConfigError);
  for (CodecIsa isa : {CodecIsa::Auto, CodecIsa::Scalar, CodecIsa::Avx2, CodecIsa::Avx512})
    EXPECT_EQ(parseCodecIsa(codecIsaName(isa)), isa);
  EXPECT_THROW(parseCodecIsa("sse"), ConfigError);
  EXPECT_THROW(makeCodec(Compression::None), EnforceError);
  EXPECT_THROW(makeCodec(Compression::Fp8E4M3, 0), ConfigError);
  EXPECT_TRUE(codecIsaSupported(resolveCodecIsa(CodecIsa::Auto)));
  EXPECT_NE(resolveCodecIsa(CodecIsa::Auto), CodecIsa::Auto);
  for (CodecIsa isa : {CodecIsa::Avx2, CodecIsa::Avx512})
    if (!codecIsaSupported(isa)) {
      EXPECT_THROW(makeCodec(Compression::F16, 256, isa), ConfigError);
    }
  auto codec = makeCodec(Compression::Fp8E5M2, 100);
  EXPECT_EQ(codec->kind(), Compression::Fp8E5M2);
  EXPECT_EQ(codec->blockSize(), 100u);
  EXPECT_EQ(codec->encodedBytes(0), 0u);
  EXPECT_EQ(codec->encodedBytes(1), 5u);
  EXPECT_EQ(codec->encodedBytes(100), 104u);
  EXPECT_EQ(codec->encodedBytes(101), 109u);
  EXPECT_EQ(makeCodec(Compression::BF16)->encodedBytes(7), 14u);
  EXPECT_EQ(makeCodec(Compression::F16)->blockSize(), 1u);
}

// ---- fp16 and bf16: every bit pattern, every half-way point.

struct HalfSpec {
  Compression kind;
  int exponentBits, mantissa, bias;
  uint16_t (*encode)(float);
  float (*decode)(uint16_t);
  uint16_t quietBit;
};
const HalfSpec kF16{Compression::F16, 5, 10, 15, floatToF16, f16ToFloat, 0x200};
const HalfSpec kBF16{Compression::BF16, 8, 7, 127, floatToBf16, bf16ToFloat, 0x40};

class HalfTest : public ::testing::TestWithParam<Compression> {
 protected:
  const HalfSpec& spec() const { return GetParam() == Compression::F16 ? kF16 : kBF16; }
};

TEST_P(HalfTest, EveryBitPatternDecodesAndReencodes) {
  const HalfSpec& s = spec();
  const uint32_t infBits = ((1u << s.exponentBits) - 1) << s.mantissa;
  std::vector<uint16_t> all(65536);
  std::vector<float> want(65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    all[h] = uint16_t(h);
    const uint32_t magnitude = h & 0x7fff;
    const uint32_t sign = (h & 0x8000) << 16;
    if (magnitude > infBits && s.kind == Compression::BF16)  // bf16 widens exactly, NaN too
      want[h] = floatOf(h << 16);
    else if (magnitude > infBits)  // fp16 NaN: quiet, sign and payload kept in the top bits
      want[h] = floatOf(sign | 0x7fc00000u |
                        ((magnitude & ((1u << s.mantissa) - 1)) << (23 - s.mantissa)));
    else if (magnitude == infBits)
      want[h] = floatOf(sign | 0x7f800000u);
    else
      want[h] = float(formatValue(h, s.exponentBits, s.mantissa, s.bias));
    ASSERT_EQ(bitsOf(s.decode(uint16_t(h))), bitsOf(want[h])) << std::hex << h;
    const uint16_t again = s.encode(want[h]);
    ASSERT_EQ(again, magnitude > infBits ? h | s.quietBit : h) << std::hex << h;
  }
  for (CodecIsa isa : isas()) {
    auto codec = makeCodec(s.kind, 256, isa);
    std::vector<uint8_t> bytes(all.size() * 2);
    std::memcpy(bytes.data(), all.data(), bytes.size());
    const std::vector<float> decoded = decode(*codec, bytes, all.size());
    const std::vector<uint8_t> encoded = encodeChecked(*codec, decoded);
    for (uint32_t h = 0; h < 65536; ++h) {
      ASSERT_EQ(bitsOf(decoded[h]), bitsOf(want[h])) << codecIsaName(isa) << std::hex << " " << h;
      uint16_t code;
      std::memcpy(&code, encoded.data() + 2 * h, 2);
      ASSERT_EQ(code, (h & 0x7fff) > infBits ? h | s.quietBit : h)
          << codecIsaName(isa) << std::hex << " " << h;
    }
  }
}

// Around each pair of neighbours (lo, hi): the midpoint goes to the even one, one float32 step
// below it to lo, one above to hi. The pair (largest finite, Inf) has the midpoint of IEEE
// overflow: it and everything above round to Inf, one step below to the largest finite.
TEST_P(HalfTest, HalfWayPointsRoundToNearestEven) {
  const HalfSpec& s = spec();
  const uint32_t infBits = ((1u << s.exponentBits) - 1) << s.mantissa;
  std::vector<float> inputs;
  std::vector<uint16_t> want;
  auto add = [&](float x, uint32_t code) {
    inputs.push_back(x);
    want.push_back(uint16_t(code));
    inputs.push_back(-x);
    want.push_back(uint16_t(code | 0x8000));
  };
  for (uint32_t lo = 0; lo < infBits; ++lo) {
    const uint32_t hi = lo + 1;
    const double loValue = formatValue(lo, s.exponentBits, s.mantissa, s.bias);
    // The value beyond the largest finite that the format would have with an unbounded exponent.
    const double hiValue =
        hi == infBits
            ? loValue + (loValue - formatValue(lo - 1, s.exponentBits, s.mantissa, s.bias))
            : formatValue(hi, s.exponentBits, s.mantissa, s.bias);
    const float mid = float((loValue + hiValue) / 2);
    ASSERT_EQ(double(mid), (loValue + hiValue) / 2);  // exact in float32
    add(float(loValue), lo);
    add(mid, lo % 2 == 0 ? lo : hi);
    add(std::nextafter(mid, 0.0f), lo);
    add(std::nextafter(mid, INFINITY), hi);
  }
  add(FLT_MAX, infBits);
  add(INFINITY, infBits);
  for (size_t i = 0; i < inputs.size(); ++i)
    ASSERT_EQ(s.encode(inputs[i]), want[i]) << std::hexfloat << inputs[i];
  for (CodecIsa isa : isas()) {
    auto codec = makeCodec(s.kind, 256, isa);
    const std::vector<uint8_t> encoded = encodeChecked(*codec, inputs);
    for (size_t i = 0; i < inputs.size(); ++i) {
      uint16_t code;
      std::memcpy(&code, encoded.data() + 2 * i, 2);
      ASSERT_EQ(code, want[i]) << codecIsaName(isa) << " " << std::hexfloat << inputs[i];
    }
  }
}

// |x - q(x)| <= 2^-(m+1) * max(|x|, smallest normal) for x within the finite range, on values
// spread over the whole exponent range (subnormals of the format and of float32 included).
TEST_P(HalfTest, RandomValuesWithinErrorBound) {
  const HalfSpec& s = spec();
  const double smallestNormal = std::ldexp(1.0, 1 - s.bias);
  const double largest = formatValue((((1u << s.exponentBits) - 1) << s.mantissa) - 1,
                                     s.exponentBits, s.mantissa, s.bias);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> unit(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-s.bias - s.mantissa - 3, s.bias);
  std::vector<float> x(100003);
  for (auto& v : x) {
    v = float(std::ldexp(unit(rng), exponent(rng)) * (rng() & 1 ? -1 : 1));
    if (std::fabs(v) > largest) v = float(largest);
  }
  x[0] = floatOf(1);  // smallest float32 subnormal
  x[1] = -FLT_MIN;
  x[2] = 0.0f;
  x[3] = -0.0f;
  for (CodecIsa isa : isas()) {
    auto codec = makeCodec(s.kind, 256, isa);
    const std::vector<float> q = decode(*codec, encodeChecked(*codec, x), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double bound =
          std::ldexp(std::max(std::fabs(double(x[i])), smallestNormal), -(s.mantissa + 1));
      ASSERT_LE(std::fabs(double(x[i]) - double(q[i])), bound)
          << codecIsaName(isa) << " " << std::hexfloat << x[i] << " -> " << q[i];
      ASSERT_EQ(std::signbit(x[i]), std::signbit(q[i])) << x[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, HalfTest, ::testing::Values(Compression::F16, Compression::BF16),
                         [](const auto& info) { return std::string(compressionName(info.param)); });

// ---- FP8: every code, every half-way point, the block scale.

class Fp8Test : public ::testing::TestWithParam<Compression> {
 protected:
  const Fp8Spec& spec() const { return specOf(GetParam()); }
};

TEST_P(Fp8Test, EveryCodeDecodesAndReencodes) {
  const Fp8Spec& s = spec();
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = uint8_t(c);
    const float value = s.decode(code);
    const uint8_t sign = code & 0x80;
    if (s.isNan(code)) {
      ASSERT_TRUE(std::isnan(value)) << c;
      ASSERT_EQ(bitsOf(value), (uint32_t(sign) << 24) | 0x7fc00000u) << c;
      ASSERT_EQ(s.encode(value), s.nanCode | sign) << c;
    } else if (s.isInf(code)) {
      ASSERT_EQ(bitsOf(value), (uint32_t(sign) << 24) | 0x7f800000u) << c;
      ASSERT_EQ(s.encode(value), code) << c;
    } else {
      ASSERT_EQ(double(value), s.value(code)) << c;
      ASSERT_EQ(std::signbit(value), sign != 0) << c;
      ASSERT_EQ(s.encode(value), code) << c;
    }
  }
  // Through the codec: a block whose absmax is the format's max has scale 1, so every finite code's
  // value encodes to that code and decodes exactly.
  std::vector<float> values;
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if (!s.isNan(uint8_t(c)) && !s.isInf(uint8_t(c))) {
      values.push_back(float(s.value(uint8_t(c))));
      codes.push_back(uint8_t(c));
    }
  for (CodecIsa isa : isas()) {
    for (size_t blockSize : {values.size(), size_t(256), size_t(1000)}) {
      auto codec = makeCodec(s.kind, blockSize, isa);
      const std::vector<uint8_t> encoded = encodeChecked(*codec, values);
      ASSERT_EQ(encoded.size(), 4 + values.size());
      float scale;
      std::memcpy(&scale, encoded.data(), 4);
      ASSERT_EQ(scale, 1.0f);
      const std::vector<float> decoded = decode(*codec, encoded, values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        ASSERT_EQ(encoded[4 + i], codes[i]) << codecIsaName(isa) << " " << values[i];
        ASSERT_EQ(bitsOf(decoded[i]), bitsOf(values[i])) << codecIsaName(isa);
      }
    }
  }
}

TEST_P(Fp8Test, HalfWayPointsAndSaturation) {
  const Fp8Spec& s = spec();
  std::vector<float> inputs;
  std::vector<uint8_t> want;
  auto add = [&](float x, uint8_t code) {
    inputs.push_back(x);
    want.push_back(code);
    inputs.push_back(-x);
    want.push_back(code | 0x80);
  };
  const uint8_t maxCode = s.kind == Compression::Fp8E4M3 ? 0x7e : 0x7b;
  for (uint8_t lo = 0; lo < maxCode; ++lo) {
    const uint8_t hi = lo + 1;
    const float mid = float((s.value(lo) + s.value(hi)) / 2);
    ASSERT_EQ(double(mid), (s.value(lo) + s.value(hi)) / 2);
    add(float(s.value(lo)), lo);
    add(mid, lo % 2 == 0 ? lo : hi);
    add(std::nextafter(mid, 0.0f), lo);
    add(std::nextafter(mid, INFINITY), hi);
  }
  // Saturation: beyond the largest finite, however far, stays finite.
  for (double x : {s.max, s.max * 1.01, s.max * 1.5, s.max * 2, 1e30, double(FLT_MAX)})
    add(float(x), maxCode);
  add(INFINITY, s.hasInf ? 0x7c : 0x7f);
  inputs.push_back(NAN);
  want.push_back(s.nanCode);
  inputs.push_back(-NAN);
  want.push_back(s.nanCode | 0x80);
  inputs.push_back(floatOf(1));  // float32 subnormal: rounds to zero
  want.push_back(0);
  for (size_t i = 0; i < inputs.size(); ++i)
    ASSERT_EQ(int(s.encode(inputs[i])), int(want[i])) << std::hexfloat << inputs[i];

  // Random values over the format's whole range against the nearest-value search.
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> unit(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-s.bias - s.mantissa - 3, s.bias + 2);
  for (int i = 0; i < 20000; ++i) {
    const float x = float(std::ldexp(unit(rng), exponent(rng)) * (rng() & 1 ? -1 : 1));
    ASSERT_EQ(int(s.encode(x)), int(s.nearest(x))) << std::hexfloat << x;
  }
}

// Each block: the scale of the rule in codec.h, then code = element encode of x / scale, decode =
// element value * scale; specials kept. Checked on random blocks with specials, on every path.
TEST_P(Fp8Test, BlocksFollowTheDocumentedRule) {
  const Fp8Spec& s = spec();
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> magnitude(-140, 120);
  for (size_t blockSize : {size_t(1), size_t(3), size_t(32), size_t(255), size_t(256)}) {
    const size_t count = 5 * blockSize + blockSize / 2 + 1;  // a final partial block
    std::vector<float> x(count);
    for (size_t b = 0; b * blockSize < count; ++b) {
      const int blockExponent = magnitude(rng);  // each block its own magnitude
      for (size_t i = b * blockSize; i < std::min(count, (b + 1) * blockSize); ++i)
        x[i] = float(std::ldexp(unit(rng), blockExponent - int(rng() % 12)));
    }
    x[count / 3] = INFINITY;
    x[count / 2] = -NAN;
    x[count - 1] = -INFINITY;
    for (CodecIsa isa : isas()) {
      auto codec = makeCodec(s.kind, blockSize, isa);
      const std::vector<uint8_t> encoded = encodeChecked(*codec, x);
      const size_t blocks = (count + blockSize - 1) / blockSize;
      ASSERT_EQ(encoded.size(), blocks * 4 + count);
      const std::vector<float> decoded = decode(*codec, encoded, count);
      for (size_t b = 0; b < blocks; ++b) {
        const size_t start = b * blockSize;
        const size_t n = std::min(blockSize, count - start);
        float scale;
        std::memcpy(&scale, encoded.data() + 4 * b, 4);
        ASSERT_EQ(bitsOf(scale), bitsOf(referenceScale(s, x.data() + start, n)))
            << codecIsaName(isa) << " block " << b;
        float absmax = 0;
        for (size_t i = start; i < start + n; ++i)
          if (std::isfinite(x[i])) absmax = std::max(absmax, std::fabs(x[i]));
        ASSERT_EQ(bitsOf(fp8BlockScale(s.kind, absmax)), bitsOf(scale));
        for (size_t i = start; i < start + n; ++i) {
          const uint8_t code = encoded[blocks * 4 + i];
          ASSERT_EQ(int(code), int(s.encode(x[i] / scale))) << codecIsaName(isa) << " " << i;
          float want;
          if (s.isNan(code))
            want = floatOf((uint32_t(code & 0x80) << 24) | 0x7fc00000u);
          else if (s.isInf(code))
            want = std::copysign(INFINITY, code & 0x80 ? -1.0f : 1.0f);
          else
            want = std::copysign(std::fabs(s.decode(code)) * scale, code & 0x80 ? -1.0f : 1.0f);
          ASSERT_EQ(bitsOf(decoded[i]), bitsOf(want)) << codecIsaName(isa) << " " << i;
          if (std::isnan(x[i])) {
            ASSERT_TRUE(std::isnan(decoded[i]));
          }
          if (std::isinf(x[i]) && s.hasInf) {
            ASSERT_EQ(decoded[i], x[i]);
          }
          if (std::isinf(x[i]) && !s.hasInf) {
            ASSERT_TRUE(std::isnan(decoded[i]));
          }
          if (std::isfinite(x[i])) {
            ASSERT_TRUE(std::isfinite(decoded[i])) << x[i];
          }
        }
      }
    }
  }
}

// The documented bound: |x - q| <= (2^-(m+1) + 2^-21) |x| + scale 2^-(bias+m) + 2^-149.
TEST_P(Fp8Test, RandomValuesWithinErrorBound) {
  const Fp8Spec& s = spec();
  std::mt19937 rng(9);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> spread(-20, 20);
  for (double level : {1e-42, 1e-30, 1e-3, 1.0, 1e4, 1e30, 1e38}) {
    std::vector<float> x(70001);
    for (auto& v : x) {
      const double value = normal(rng) * level * std::ldexp(1.0, spread(rng) / 4);
      v = float(std::max(-double(FLT_MAX), std::min(double(FLT_MAX), value)));
    }
    for (CodecIsa isa : isas()) {
      auto codec = makeCodec(s.kind, 256, isa);
      const std::vector<uint8_t> encoded = encodeChecked(*codec, x);
      const std::vector<float> q = decode(*codec, encoded, x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        float scale;
        std::memcpy(&scale, encoded.data() + 4 * (i / 256), 4);
        const double bound =
            (std::ldexp(1.0, -(s.mantissa + 1)) + std::ldexp(1.0, -21)) * std::fabs(double(x[i])) +
            double(scale) * std::ldexp(1.0, -(s.bias + s.mantissa)) + std::ldexp(1.0, -149);
        ASSERT_LE(std::fabs(double(x[i]) - double(q[i])), bound)
            << codecIsaName(isa) << " level " << level << " " << std::hexfloat << x[i] << " -> "
            << q[i] << " scale " << scale;
        ASSERT_TRUE(std::isfinite(q[i]));
      }
    }
  }
}

TEST_P(Fp8Test, BlockEdgeCases) {
  const Fp8Spec& s = spec();
  const float max = float(s.max);
  for (CodecIsa isa : isas()) {
    SCOPED_TRACE(codecIsaName(isa));
    // All zeros, both signs: scale FLT_MIN, decoded exactly.
    {
      auto codec = makeCodec(s.kind, 4, isa);
      const std::vector<float> x = {0.0f, -0.0f, 0.0f, -0.0f, -0.0f, 0.0f};
      const std::vector<uint8_t> e = encodeChecked(*codec, x);
      float scale;
      std::memcpy(&scale, e.data(), 4);
      EXPECT_EQ(scale, FLT_MIN);
      const std::vector<float> q = decode(*codec, e, x.size());
      for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(bitsOf(q[i]), bitsOf(x[i])) << i;
    }
    // One huge value among tiny ones: the huge one keeps its relative precision, the tiny ones
    // fall below the smallest subnormal step and become zeros of their sign; nothing overflows.
    {
      auto codec = makeCodec(s.kind, 8, isa);
      const std::vector<float> x = {1e-3f, -2e-3f, 3e30f, 4e-3f, -5e-3f, 1e-30f, 7e-3f};
      const std::vector<float> q = decode(*codec, encodeChecked(*codec, x), x.size());
      EXPECT_NEAR(q[2], 3e30, 3e30 * std::ldexp(1.0, -(s.mantissa + 1)));
      for (size_t i : {0, 1, 3, 4, 5, 6}) {
        EXPECT_EQ(q[i], 0.0f) << i;
        EXPECT_EQ(std::signbit(q[i]), std::signbit(x[i])) << i;
      }
    }
    // The largest float32 in a block: the scale is stepped down so decoding stays finite.
    {
      auto codec = makeCodec(s.kind, 3, isa);
      const std::vector<float> x = {FLT_MAX, -FLT_MAX, FLT_MAX / 3, 1.0f};
      const std::vector<float> q = decode(*codec, encodeChecked(*codec, x), x.size());
      for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(std::isfinite(q[i])) << i;
      EXPECT_NEAR(q[0] / FLT_MAX, 1.0, 1e-6);
      EXPECT_NEAR(q[1] / FLT_MAX, -1.0, 1e-6);
      EXPECT_EQ(q[3], 1.0f);  // its own block: absmax 1 -> exact
    }
    // Inf and NaN: kept as specials (e4m3: Inf -> NaN), excluded from the absmax.
    {
      auto codec = makeCodec(s.kind, 5, isa);
      const std::vector<float> x = {INFINITY, -INFINITY, NAN, 2.0f, -1.0f, NAN, INFINITY};
      const std::vector<uint8_t> e = encodeChecked(*codec, x);
      float scale;
      std::memcpy(&scale, e.data(), 4);
      EXPECT_EQ(scale, 2.0f / max);
      const std::vector<float> q = decode(*codec, e, x.size());
      EXPECT_EQ(q[3], 2.0f);
      EXPECT_EQ(q[4], -1.0f);
      for (size_t i : {2, 5}) EXPECT_TRUE(std::isnan(q[i]));
      if (s.hasInf) {
        EXPECT_EQ(q[0], INFINITY);
        EXPECT_EQ(q[1], -INFINITY);
        EXPECT_EQ(q[6], INFINITY);  // the second block: all non-finite, scale FLT_MIN
      } else {
        for (size_t i : {0, 1, 6}) EXPECT_TRUE(std::isnan(q[i])) << i;
        EXPECT_TRUE(std::signbit(q[1]));
      }
    }
    // float32 subnormals only: the scale is FLT_MIN, so values keep a few bits.
    {
      auto codec = makeCodec(s.kind, 256, isa);
      std::vector<float> x;
      for (uint32_t b : {1u, 2u, 3u, 1000u, 0x7fffffu, 0x80000005u, 0x400000u})
        x.push_back(floatOf(b));
      const std::vector<float> q = decode(*codec, encodeChecked(*codec, x), x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_LE(std::fabs(double(x[i]) - double(q[i])),
                  std::ldexp(std::fabs(double(x[i])), -(s.mantissa + 1)) +
                      double(FLT_MIN) * std::ldexp(1.0, -(s.bias + s.mantissa)) +
                      std::ldexp(1.0, -149))
            << i;
        EXPECT_EQ(std::signbit(q[i]), std::signbit(x[i]));
      }
    }
    // Count 0 and 1.
    {
      auto codec = makeCodec(s.kind, 256, isa);
      EXPECT_TRUE(encodeChecked(*codec, {}).empty());
      codec->decode(nullptr, 0, nullptr);
      codec->decodeAdd(nullptr, 0, nullptr);
      const std::vector<float> one = {-3.25f};
      const std::vector<uint8_t> e = encodeChecked(*codec, one);
      ASSERT_EQ(e.size(), 5u);
      EXPECT_EQ(decode(*codec, e, 1)[0], -3.25f);  // the absmax of its block: exact
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Test,
                         ::testing::Values(Compression::Fp8E4M3, Compression::Fp8E5M2),
                         [](const auto& info) {
                           return info.param == Compression::Fp8E4M3 ? std::string("e4m3")
                                                                     : std::string("e5m2");
                         });

// ---- All codecs: paths agree, decodeAdd, pieces.

// Random float32 bit patterns (every class: NaN with payloads, Inf, subnormals, huge and tiny)
// mixed with ordinary gradient-like values.
std::vector<float> mixedValues(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = rng() % 3 == 0 ? floatOf(rng()) : normal(rng) * 1e-2f;
  return x;
}

class AllCodecsTest : public ::testing::TestWithParam<Compression> {};

TEST_P(AllCodecsTest, PathsAgreeBitForBit) {
  const Compression kind = GetParam();
  const std::vector<CodecIsa> paths = isas();
  for (size_t blockSize : {size_t(1), size_t(7), size_t(256), size_t(1000)}) {
    if (!isFp8(kind) && blockSize != 256) continue;
    for (size_t count : {size_t(1), size_t(15), size_t(17), size_t(100003)}) {
      const std::vector<float> x = mixedValues(count, uint32_t(count + blockSize));
      auto reference = makeCodec(kind, blockSize, CodecIsa::Scalar);
      const std::vector<uint8_t> want = encodeChecked(*reference, x);
      // Arbitrary bytes decode the same way too (scales included: NaN, Inf, negative).
      std::vector<uint8_t> noise(want.size());
      std::mt19937 rng{uint32_t(count)};
      for (auto& b : noise) b = uint8_t(rng());
      const std::vector<float> wantDecoded = decode(*reference, want, count);
      const std::vector<float> wantNoise = decode(*reference, noise, count);
      for (CodecIsa isa : paths) {
        auto codec = makeCodec(kind, blockSize, isa);
        ASSERT_EQ(encodeChecked(*codec, x), want)
            << codecIsaName(isa) << " count " << count << " block " << blockSize;
        const std::vector<float> decoded = decode(*codec, want, count);
        const std::vector<float> decodedNoise = decode(*codec, noise, count);
        ASSERT_EQ(std::memcmp(decoded.data(), wantDecoded.data(), count * 4), 0)
            << codecIsaName(isa);
        ASSERT_EQ(std::memcmp(decodedNoise.data(), wantNoise.data(), count * 4), 0)
            << codecIsaName(isa);
      }
    }
  }
}

TEST_P(AllCodecsTest, DecodeAddIsDecodeThenAdd) {
  const Compression kind = GetParam();
  for (CodecIsa isa : isas()) {
    for (size_t count : {size_t(0), size_t(1), size_t(13), size_t(513), size_t(20011)}) {
      auto codec = makeCodec(kind, 33, isa);
      const std::vector<float> x = mixedValues(count, 21);
      std::vector<float> base = mixedValues(count, 22);
      for (size_t i = 0; i < count; ++i) base[i] = float(i % 101) * 0.37f - 11.0f;
      const std::vector<uint8_t> e = encodeChecked(*codec, x);
      const std::vector<float> d = decode(*codec, e, count);
      std::vector<float> out = base;
      codec->decodeAdd(e.data(), count, out.data());
      for (size_t i = 0; i < count; ++i) {
        const float want = base[i] + d[i];
        if (std::isnan(want))
          ASSERT_TRUE(std::isnan(out[i])) << codecIsaName(isa) << " " << i;
        else
          ASSERT_EQ(bitsOf(out[i]), bitsOf(want)) << codecIsaName(isa) << " " << i;
      }
    }
  }
}

// Encoding in pieces whose counts are multiples of blockSize() gives the same scales and codes.
TEST_P(AllCodecsTest, PiecesOfWholeBlocksEncodeAsTheWhole) {
  const Compression kind = GetParam();
  auto codec = makeCodec(kind, 64);
  const size_t block = codec->blockSize();
  const size_t count = 10 * 64 + 5;
  const std::vector<float> x = mixedValues(count, 31);
  const std::vector<uint8_t> whole = encodeChecked(*codec, x);
  std::vector<float> decodedPieces;
  size_t totalBytes = 0;
  for (size_t start = 0; start < count;) {
    const size_t n = std::min(count - start, 3 * 64 / block * block);
    const std::vector<float> piece(x.begin() + start, x.begin() + start + n);
    const std::vector<uint8_t> e = encodeChecked(*codec, piece);
    totalBytes += e.size();
    const std::vector<float> d = decode(*codec, e, n);
    decodedPieces.insert(decodedPieces.end(), d.begin(), d.end());
    start += n;
  }
  EXPECT_EQ(totalBytes, whole.size());
  const std::vector<float> decodedWhole = decode(*codec, whole, count);
  EXPECT_EQ(std::memcmp(decodedPieces.data(), decodedWhole.data(), count * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Kinds, AllCodecsTest, ::testing::ValuesIn(kAllKinds),
                         [](const auto& info) {
                           std::string name = compressionName(info.param);
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

}  // namespace
}  // namespace hetra::comm
