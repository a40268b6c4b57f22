// common/units: the one parser per quantity (bytes, rates, durations) with good and bad input.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/errors.h"
#include "common/units.h"

namespace hetra {
namespace {

// The error of `parse` on `text`: it must be a ConfigError (any other type fails the test) whose
// message quotes the text.
template <class Parse>
std::string configErrorOf(const std::string& text, Parse parse) {
  try {
    parse(text);
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("\"" + text + "\""), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "accepted \"" << text << "\"";
  return "";
}

TEST(Units, BytesReadDecimalAndBinaryUnitsExactly) {
  EXPECT_EQ(parseBytes("48MiB"), int64_t(48) * 1024 * 1024);
  EXPECT_EQ(parseBytes("1.5GB"), int64_t(1500000000));
  EXPECT_EQ(parseBytes("1.5GiB"), int64_t(1610612736));
  EXPECT_EQ(parseBytes(" 64 kib "), int64_t(65536));
  EXPECT_EQ(parseBytes("7B"), 7);
  EXPECT_EQ(parseBytes("1000"), 1000);
  EXPECT_EQ(parseBytes("0.001KB"), 1);
  EXPECT_EQ(parseBytes("3TB"), int64_t(3000000000000));
  EXPECT_EQ(parseBytes("8TiB"), int64_t(8796093022208));
}

TEST(Units, BytesRefuseFractionsExponentsAndUnknownUnits) {
  for (const char* bad : {"", "MiB", "1.5", "0.3B", "2G", "-1", "1e9", "1..5MB", "9999999999TiB",
                          "12 MiBs", "0.0001KB"}) {
    const std::string message = configErrorOf(bad, parseBytes);
    EXPECT_NE(message.find("KiB, MiB"), std::string::npos) << message;
  }
}

TEST(Units, FormatBytesPicksTheExactUnitAndReadsBack) {
  EXPECT_EQ(formatBytes(int64_t(48) << 20), "48MiB");
  EXPECT_EQ(formatBytes(1500000000), "1500MB");
  EXPECT_EQ(formatBytes(1536), "1536");
  EXPECT_EQ(formatBytes(0), "0");
  for (int64_t v : {int64_t(1), int64_t(1024), int64_t(1000), int64_t(3) << 40, int64_t(123456789)})
    EXPECT_EQ(parseBytes(formatBytes(v)), v) << v;
}

TEST(Units, RatesInBytesAndBits) {
  EXPECT_DOUBLE_EQ(parseRate("1gbit", "X"), 125000000.0);
  EXPECT_DOUBLE_EQ(parseRate("100mbit", "X"), 12500000.0);
  EXPECT_DOUBLE_EQ(parseRate("4kbit/s", "X"), 500.0);
  EXPECT_DOUBLE_EQ(parseRate("20MB/s", "X"), 20000000.0);
  EXPECT_DOUBLE_EQ(parseRate("512KiB", "X"), 524288.0);
  EXPECT_DOUBLE_EQ(parseRate("1.5GB", "X"), 1500000000.0);
  EXPECT_DOUBLE_EQ(parseRate("1e3kb/s", "X"), 1000000.0);
  EXPECT_DOUBLE_EQ(parseRate("125000000", "X"), 125000000.0);
  EXPECT_DOUBLE_EQ(parseRate("0", "X"), 0.0);
  EXPECT_DOUBLE_EQ(parseRate("3GBIT", "X", RateUnit::kRequired), 375000000.0);
  EXPECT_DOUBLE_EQ(parseRate("5GB/s", "X", RateUnit::kRequired), 5e9);
}

TEST(Units, RatesRefuseBadTextAndNameTheSetting) {
  auto rate = [](const std::string& text) { return parseRate(text, "HETRA_TCP_RATE_LIMIT"); };
  for (const char* bad : {"", "fast", "-1MB", "10XB", "5 parsecs", "nan", "inf", "5/s", "1gbit/m"})
    EXPECT_NE(configErrorOf(bad, rate).find("HETRA_TCP_RATE_LIMIT"), std::string::npos);
  // With the unit required, byte amounts without "/s" and bare numbers are refused.
  auto strict = [](const std::string& text) {
    return parseRate(text, "bandwidth", RateUnit::kRequired);
  };
  for (const char* bad : {"5GB", "1000", "512KiB"}) configErrorOf(bad, strict);
}

TEST(Units, SecondsNeedAUnit) {
  EXPECT_DOUBLE_EQ(parseSeconds("5us", "X"), 5e-6);
  EXPECT_DOUBLE_EQ(parseSeconds("0.5ms", "X"), 5e-4);
  EXPECT_DOUBLE_EQ(parseSeconds("2e-6s", "X"), 2e-6);
  EXPECT_DOUBLE_EQ(parseSeconds("7NS", "X"), 7e-9);
  EXPECT_DOUBLE_EQ(parseSeconds("0us", "X"), 0.0);
  auto seconds = [](const std::string& text) { return parseSeconds(text, "latency"); };
  for (const char* bad : {"", "5", "us", "-1us", "5 parsecs", "nanus", "5min"}) {
    const std::string message = configErrorOf(bad, seconds);
    EXPECT_NE(message.find("latency"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace hetra
