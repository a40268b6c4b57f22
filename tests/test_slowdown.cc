// The slow-device emulation's accounting: each phase lasts s × its work on average, late sleeps
// are paid back by the next phases, a stall is repaid only up to the cap.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "device/slowdown.h"

namespace hetra::device {
namespace {

// A sleep that overruns every request by `late` seconds (a busy core, timer slack), recording
// the requests.
struct LateSleep {
  double late = 0;
  std::vector<double> requests;
  SlowdownEmulator::Sleep fn() {
    return [this](double seconds) {
      requests.push_back(seconds);
      return seconds + late;
    };
  }
};

TEST(SlowdownEmulator, PunctualSleepsMakeEachPhaseSTimesItsWork) {
  LateSleep sleep;
  SlowdownEmulator emulator(sleep.fn());
  EXPECT_DOUBLE_EQ(emulator.endPhase(4.0, 0.002, 0.002), 0.006);
  // A phase that waited for its core (wall > work): only the work is multiplied.
  EXPECT_DOUBLE_EQ(emulator.endPhase(4.0, 0.003, 0.001), 0.001);
  // Waiting alone already took longer than s × work: no sleep.
  EXPECT_DOUBLE_EQ(emulator.endPhase(2.0, 0.005, 0.002), 0.0);
  // Full speed devices never sleep.
  EXPECT_DOUBLE_EQ(emulator.endPhase(1.0, 0.002, 0.002), 0.0);
  EXPECT_EQ(sleep.requests.size(), 2u);
  EXPECT_DOUBLE_EQ(emulator.debtSeconds(), 0.0);
}

TEST(SlowdownEmulator, LateSleepsArePaidBackSoTheAverageSpeedHolds) {
  const double work = 0.002, slowdown = 3.0, late = 0.0004;
  const int phases = 200;
  LateSleep sleep;
  sleep.late = late;
  SlowdownEmulator emulator(sleep.fn());
  double elapsed = 0;
  for (int i = 0; i < phases; ++i) elapsed += work + emulator.endPhase(slowdown, work, work);
  // Every phase but the first asks for `late` less; in all, the device was slow by one sleep's
  // lateness (the debt still open), not by `late` per phase.
  EXPECT_NEAR(sleep.requests[0], 0.004, 1e-12);
  EXPECT_NEAR(sleep.requests[1], 0.004 - late, 1e-12);
  EXPECT_NEAR(elapsed, phases * slowdown * work + emulator.debtSeconds(), 1e-9);
  EXPECT_NEAR(emulator.debtSeconds(), late, 1e-12);
}

TEST(SlowdownEmulator, ADebtLargerThanThePhaseSkipsItsSleep) {
  LateSleep sleep;
  sleep.late = 0.003;
  SlowdownEmulator emulator(sleep.fn());
  emulator.endPhase(2.0, 0.001, 0.001);  // owes 1 ms, sleeps 4
  EXPECT_NEAR(emulator.debtSeconds(), 0.003, 1e-12);
  sleep.late = 0;
  EXPECT_EQ(emulator.endPhase(2.0, 0.001, 0.001), 0.0);  // owes 1 ms, pays it from the debt
  EXPECT_NEAR(emulator.debtSeconds(), 0.002, 1e-12);
  EXPECT_EQ(sleep.requests.size(), 1u);
}

TEST(SlowdownEmulator, AStallIsRepaidOnlyUpToTheCap) {
  LateSleep sleep;
  sleep.late = 0.050;  // one 50 ms stall
  SlowdownEmulator emulator(sleep.fn());
  emulator.endPhase(2.0, 0.001, 0.001);
  EXPECT_DOUBLE_EQ(emulator.debtSeconds(), SlowdownEmulator::kMaxDebtSeconds);
  sleep.late = 0;
  double skipped = 0;
  for (int i = 0; i < 20; ++i) skipped += 0.001 - emulator.endPhase(2.0, 0.001, 0.001);
  EXPECT_NEAR(skipped, SlowdownEmulator::kMaxDebtSeconds, 1e-12);
}

// The real sleep: never shorter than asked, and what it reports is time that passed (measured
// around it here, so no bound on how late a busy machine wakes it).
TEST(SlowdownEmulator, RealSleepReturnsWhatItSlept) {
  SlowdownEmulator::tightenTimerSlack();
  const auto before = std::chrono::steady_clock::now();
  const double slept = SlowdownEmulator::sleepFor(0.002);
  const double around =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  EXPECT_GE(slept, 0.002);
  EXPECT_LE(slept, around);
}

}  // namespace
}  // namespace hetra::device
