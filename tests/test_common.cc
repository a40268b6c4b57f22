#include <immintrin.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "common/dtype.h"
#include "common/errors.h"
#include "common/params.h"
#include "common/process.h"

namespace hetra {
namespace {

float bitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The hardware conversion (F16C) is the reference for our portable scalar code.
__attribute__((target("f16c"))) uint16_t hardwareHalf(float f) {
  return uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hardwareHalfToFloat(uint16_t h) {
  return _cvtsh_ss(h);
}

TEST(DType, HalfToFloatMatchesHardwareOnEveryBitPattern) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float ours = halfToFloat(uint16_t(bits));
    const float ref = hardwareHalfToFloat(uint16_t(bits));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(ours)) << bits;
    } else {
      ASSERT_EQ(std::memcmp(&ours, &ref, 4), 0) << "half bits " << bits;
    }
  }
}

TEST(DType, FloatToHalfMatchesHardware) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  // Every float around the half range boundaries plus a random sample of all bit patterns.
  std::mt19937 rng(7);
  std::vector<uint32_t> patterns;
  for (uint32_t e = 0; e < 256; ++e)
    for (uint32_t m : {0u, 1u, 0x1000u, 0x1fffu, 0x2000u, 0x3000u, 0x7fffffu, 0x400000u})
      for (uint32_t s : {0u, 0x80000000u}) patterns.push_back(s | (e << 23) | m);
  for (int i = 0; i < 2000000; ++i) patterns.push_back(rng());
  for (uint32_t bits : patterns) {
    const float f = bitsToFloat(bits);
    const uint16_t ours = floatToHalf(f);
    const uint16_t ref = hardwareHalf(f);
    if (std::isnan(f)) {
      ASSERT_EQ(ours & 0x7c00, 0x7c00);
      ASSERT_NE(ours & 0x3ff, 0) << "NaN must stay NaN";
    } else {
      ASSERT_EQ(ours, ref) << "float bits 0x" << std::hex << bits;
    }
  }
}

TEST(DType, BFloat16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(floatToBFloat16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(floatToBFloat16(bitsToFloat(0x3f808000u)), 0x3f80);
  EXPECT_EQ(floatToBFloat16(bitsToFloat(0x3f818000u)), 0x3f82);
  EXPECT_EQ(floatToBFloat16(bitsToFloat(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(bfloat16ToFloat(floatToBFloat16(NAN))));
  EXPECT_TRUE(std::isinf(bfloat16ToFloat(floatToBFloat16(INFINITY))));
  // Every bf16 value survives a round trip through float32.
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float f = bfloat16ToFloat(uint16_t(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(floatToBFloat16(f), bits);
  }
}

TEST(DType, NamesParseBothWays) {
  for (DType d : kAllDTypes) EXPECT_EQ(parseDType(dtypeName(d)), d);
  EXPECT_EQ(parseDType("bf16"), DType::BF16);
  EXPECT_EQ(dtypeSize(DType::F64), 8u);
  try {
    parseDType("float8");
    FAIL() << "float8 must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("float8"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("allowed"), std::string::npos);
  }
}

TEST(Errors, EnforcePrintsBothValues) {
  try {
    int a = 3, b = 4;
    HETRA_ENFORCE_EQ(a, b, "while testing");
    FAIL();
  } catch (const EnforceError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("3 vs 4"), std::string::npos) << what;
    EXPECT_NE(what.find("while testing"), std::string::npos) << what;
    EXPECT_NE(what.find("test_common.cc"), std::string::npos) << what;
  }
}

TEST(Params, EnvironmentOverridesDefaultAndBadValuesAreNamed) {
  Param p("HETRA_TEST_PARAM", "17", "A parameter of the tests.");
  unsetenv("HETRA_TEST_PARAM");
  EXPECT_EQ(p.integer(), 17);
  setenv("HETRA_TEST_PARAM", "42", 1);
  EXPECT_EQ(p.integer(), 42);
  setenv("HETRA_TEST_PARAM", "4x", 1);
  try {
    p.integer();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("HETRA_TEST_PARAM='4x'"), std::string::npos);
  }
  unsetenv("HETRA_TEST_PARAM");
  bool listed = false;
  for (const auto& info : allParams()) listed |= info.env == "HETRA_TEST_PARAM";
  EXPECT_TRUE(listed);
}

// The start time tells a process apart from a later one with its pid; a stopped process reads 'T';
// a process that exited is gone while still a zombie (not yet reaped).
TEST(Process, StateAndStartTimeTellAProcessApart) {
  const std::optional<ProcessStat> own = readProcessStat(getpid());
  ASSERT_TRUE(own);
  EXPECT_EQ(own->state, 'R');  // it runs while it reads its own stat
  EXPECT_GT(own->startTime, 0u);
  EXPECT_EQ(ownStartTime(), own->startTime);
  EXPECT_TRUE(processAlive(getpid(), own->startTime));
  EXPECT_TRUE(processAlive(getpid(), 0));
  EXPECT_FALSE(processAlive(getpid(), own->startTime + 1));  // its pid, but a later process

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  ASSERT_EQ(kill(child, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  const std::optional<ProcessStat> stopped = readProcessStat(child);
  ASSERT_TRUE(stopped);
  EXPECT_EQ(stopped->state, 'T');
  EXPECT_TRUE(processAlive(child, stopped->startTime));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, id_t(child), &info, WEXITED | WNOWAIT), 0);  // a zombie now
  EXPECT_FALSE(processAlive(child, stopped->startTime));
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // Reaped: gone, even if a new process took the pid meanwhile (its start time differs).
  EXPECT_FALSE(processAlive(child, stopped->startTime));
}

}  // namespace
}  // namespace hetra
