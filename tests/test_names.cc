// common/names.h, and the enums whose names it holds: each name table parses back what it prints,
// and the errors keep the exact text they had when each parser had its own list.
#include <string>

#include <gtest/gtest.h>

#include "balance/balancer.h"
#include "comm/codec/codec.h"
#include "comm/reduce.h"
#include "common/dtype.h"
#include "common/errors.h"
#include "common/names.h"

namespace hetra {
namespace {

enum class Fruit : uint8_t { Apple, Pear, Plum };

constexpr NamedValue<Fruit> kFruitNames[] = {
    {Fruit::Apple, "apple"}, {Fruit::Pear, "pear"}, {Fruit::Plum, "plum"}};
static_assert(coversEnum(kFruitNames, Fruit::Plum));

// A table missing a value, or out of order, is refused.
constexpr NamedValue<Fruit> kMissingPlum[] = {{Fruit::Apple, "apple"}, {Fruit::Pear, "pear"}};
constexpr NamedValue<Fruit> kSwapped[] = {
    {Fruit::Pear, "pear"}, {Fruit::Apple, "apple"}, {Fruit::Plum, "plum"}};
static_assert(!coversEnum(kMissingPlum, Fruit::Plum));
static_assert(!coversEnum(kSwapped, Fruit::Plum));

std::string configErrorOf(void (*call)()) {
  try {
    call();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST(Names, NameOfAndParseNameAreInverse) {
  for (const auto& entry : kFruitNames) {
    EXPECT_STREQ(nameOf(entry.value, kFruitNames), entry.name);
    EXPECT_EQ(parseName(entry.name, kFruitNames, "fruit"), entry.value);
  }
  EXPECT_EQ(findName("pear", kFruitNames), Fruit::Pear);
  EXPECT_FALSE(findName("Pear", kFruitNames).has_value());  // names are case-sensitive
  EXPECT_FALSE(findName("", kFruitNames).has_value());
}

TEST(Names, ValueOutsideTheTableGetsTheFallback) {
  EXPECT_STREQ(nameOf(Fruit(7), kFruitNames), "?");
  EXPECT_STREQ(nameOf(Fruit(7), kFruitNames, "unknown"), "unknown");
}

TEST(Names, UnknownNameErrorNamesTheTextAndEveryAllowedName) {
  EXPECT_EQ(allowedNames(kFruitNames), "apple, pear, plum");
  try {
    parseName("kiwi", kFruitNames, "fruit");
    FAIL() << "kiwi must be refused";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "fruit 'kiwi' is not supported; allowed: apple, pear, plum");
  }
}

TEST(Names, EnumParsersKeepTheirErrorTexts) {
  EXPECT_EQ(configErrorOf([] { parseDType("float8"); }),
            "dtype 'float8' is not supported; allowed: float32 (f32), float64 (f64), float16 "
            "(f16), bfloat16 (bf16), int32 (i32), int64 (i64), uint8 (u8)");
  EXPECT_EQ(configErrorOf([] { comm::parseCompression("int4"); }),
            "compression 'int4' is not supported; allowed: none, fp16, bf16, fp8-e4m3, fp8-e5m2");
  EXPECT_EQ(configErrorOf([] { comm::parseCodecIsa("neon"); }),
            "codec ISA 'neon' is not supported; allowed: auto, scalar, avx2, avx512");
  EXPECT_EQ(configErrorOf([] { comm::parseReduceOp("prod"); }),
            "reduce op 'prod' is not supported; allowed: sum, avg, min, max");
  EXPECT_EQ(configErrorOf([] { balance::parseMode("fastest"); }),
            "balance: mode (HETRA_BALANCE_MODE)='fastest' is unknown; allowed: dynamic, static, "
            "equal");
}

TEST(Names, EnumNamesRoundTrip) {
  for (DType d : kAllDTypes) {
    EXPECT_EQ(parseDType(dtypeName(d)), d);
    EXPECT_GT(dtypeSize(d), 0u);
  }
  EXPECT_EQ(parseDType("i64"), DType::I64);
  EXPECT_EQ(dtypeSize(DType::BF16), 2u);
  EXPECT_EQ(dtypeSize(DType::I64), 8u);
  EXPECT_STREQ(dtypeName(DType(200)), "unknown");
  EXPECT_THROW(dtypeSize(DType(200)), EnforceError);
  for (auto kind : {comm::Compression::None, comm::Compression::F16, comm::Compression::BF16,
                    comm::Compression::Fp8E4M3, comm::Compression::Fp8E5M2})
    EXPECT_EQ(comm::parseCompression(comm::compressionName(kind)), kind);
  for (auto isa :
       {comm::CodecIsa::Auto, comm::CodecIsa::Scalar, comm::CodecIsa::Avx2, comm::CodecIsa::Avx512})
    EXPECT_EQ(comm::parseCodecIsa(comm::codecIsaName(isa)), isa);
  for (auto op :
       {comm::ReduceOp::Sum, comm::ReduceOp::Avg, comm::ReduceOp::Min, comm::ReduceOp::Max})
    EXPECT_EQ(comm::parseReduceOp(comm::reduceOpName(op)), op);
  for (auto mode : {balance::Mode::Dynamic, balance::Mode::Static, balance::Mode::Equal})
    EXPECT_EQ(balance::parseMode(balance::modeName(mode)), mode);
}

}  // namespace
}  // namespace hetra
