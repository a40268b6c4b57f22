// common/units.h wholeInteger / wholeNumber: the plain-number readers that Param and the stores
// share. All of the text must be a number; anything left over, or out of range, gives nullopt.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "common/units.h"

namespace hetra {
namespace {

TEST(WholeNumbers, IntegerReadsTheWholeText) {
  EXPECT_EQ(wholeInteger("42"), 42);
  EXPECT_EQ(wholeInteger("-7"), -7);
  EXPECT_EQ(wholeInteger(" 13"), 13);  // std::stoll skips leading spaces
  EXPECT_EQ(wholeInteger("9223372036854775807"), std::numeric_limits<int64_t>::max());
}

TEST(WholeNumbers, IntegerRefusesLeftoversAndOverflow) {
  EXPECT_FALSE(wholeInteger(""));
  EXPECT_FALSE(wholeInteger("12x"));
  EXPECT_FALSE(wholeInteger("1.5"));
  EXPECT_FALSE(wholeInteger("13 "));
  EXPECT_FALSE(wholeInteger("abc"));
  EXPECT_FALSE(wholeInteger("9223372036854775808"));
}

TEST(WholeNumbers, NumberReadsTheWholeText) {
  EXPECT_EQ(wholeNumber("0.25"), 0.25);
  EXPECT_EQ(wholeNumber("-3e2"), -300.0);
  EXPECT_EQ(wholeNumber("7"), 7.0);
  std::optional<double> inf = wholeNumber("inf");
  ASSERT_TRUE(inf);
  EXPECT_TRUE(std::isinf(*inf));
}

TEST(WholeNumbers, NumberRefusesLeftoversAndOverflow) {
  EXPECT_FALSE(wholeNumber(""));
  EXPECT_FALSE(wholeNumber("5us"));
  EXPECT_FALSE(wholeNumber("0.5 "));
  EXPECT_FALSE(wholeNumber("1e999"));
}

}  // namespace
}  // namespace hetra
