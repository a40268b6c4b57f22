// The slow-device emulation's accounting: each phase lasts s × its work on average, late sleeps
// are paid back by the next phases, a stall is repaid only up to the cap.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "device/compute_scope.h"
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
// Clocks the test moves by hand: a segment's wall and work are exactly what the test says.
struct ManualClocks {
  double wall = 100, work = 7;
  ComputeClocks clocks() {
    return {[this] { return wall; }, [this] { return work; }};
  }
};

TEST(ComputeScope, StretchesASegmentToSTimesItsCpuTime) {
  ManualClocks time;
  const ComputeClocks clocks = time.clocks();
  LateSleep sleep;
  SlowdownEmulator emulator(sleep.fn());
  {
    ComputeScope segment(emulator, 3.0, clocks);
    time.wall += 0.004;  // 4 ms of wall time, 2 ms of it computing (the rest waiting for a core)
    time.work += 0.002;
  }
  // s x work - wall = 3 x 2 ms - 4 ms.
  ASSERT_EQ(sleep.requests.size(), 1u);
  EXPECT_NEAR(sleep.requests[0], 0.002, 1e-12);
  // A segment that ends explicitly sleeps then, and not again when the scope closes.
  {
    ComputeScope segment(emulator, 2.0, clocks);
    time.wall += 0.001;
    time.work += 0.001;
    EXPECT_NEAR(segment.end(), 0.001, 1e-12);
    time.wall += 1.0;
  }
  EXPECT_EQ(sleep.requests.size(), 2u);
}

TEST(ComputeScope, ConsecutiveSegmentsShareTheEmulatorsDebt) {
  ManualClocks time;
  const ComputeClocks clocks = time.clocks();
  LateSleep sleep;
  sleep.late = 0.0005;  // every sleep ends 0.5 ms late
  SlowdownEmulator emulator(sleep.fn());
  for (int i = 0; i < 2; ++i) {
    ComputeScope segment(emulator, 2.0, clocks);
    time.wall += 0.001;
    time.work += 0.001;
  }
  // The second segment owes 1 ms and sleeps 0.5 ms less: the first one's lateness.
  ASSERT_EQ(sleep.requests.size(), 2u);
  EXPECT_NEAR(sleep.requests[0], 0.001, 1e-12);
  EXPECT_NEAR(sleep.requests[1], 0.0005, 1e-12);
}

TEST(ComputeScope, AFailedSegmentIsNotEmulated) {
  ManualClocks time;
  const ComputeClocks clocks = time.clocks();
  LateSleep sleep;
  SlowdownEmulator emulator(sleep.fn());
  try {
    ComputeScope segment(emulator, 5.0, clocks);
    time.work += 0.001;
    time.wall += 0.001;
    throw std::runtime_error("out of memory");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(sleep.requests.empty());
}

// A wait for peers inside a segment (ZeRO's gathers): its wall time and the CPU time spent
// spinning are not the device's work, and the slowdown does not stretch them.
TEST(ComputeScope, APauseIsLeftOutOfTheSegment) {
  ManualClocks time;
  const ComputeClocks clocks = time.clocks();
  LateSleep sleep;
  SlowdownEmulator emulator(sleep.fn());
  {
    ComputeScope segment(emulator, 3.0, clocks);
    time.wall += 0.002;  // 2 ms computing
    time.work += 0.002;
    {
      ComputePause waiting;
      time.wall += 0.010;  // 10 ms waiting, 4 ms of it spinning
      time.work += 0.004;
    }
    time.wall += 0.001;  // 1 ms computing
    time.work += 0.001;
  }
  // 3 x 3 ms - 3 ms; with the pause counted it would be 3 x 7 ms - 13 ms.
  ASSERT_EQ(sleep.requests.size(), 1u);
  EXPECT_NEAR(sleep.requests[0], 0.006, 1e-12);
}

// What the emulated device computed: three times the 2 ms of work outside the pause, whatever the
// sleep actually took (here 1 ms late) or the debt it repays.
TEST(ComputeScope, ComputingSecondsAreTheWorkAtTheSlowdownWithoutPauses) {
  ManualClocks time;
  const ComputeClocks clocks = time.clocks();
  LateSleep sleep;
  sleep.late = 0.001;
  SlowdownEmulator emulator(sleep.fn());
  ComputeScope segment(emulator, 3.0, clocks);
  EXPECT_EQ(segment.computingSeconds(), 0.0);
  time.wall += 0.002;
  time.work += 0.002;
  {
    ComputePause waiting;
    time.wall += 0.010;
    time.work += 0.004;
  }
  EXPECT_NEAR(segment.end(), 0.005, 1e-12);  // 2 x 2 ms, less 0 debt, + 1 ms late
  EXPECT_NEAR(segment.computingSeconds(), 0.006, 1e-12);
  // The next segment repays the 1 ms of debt with a shorter, punctual sleep; what it computed is
  // the same.
  sleep.late = 0;
  ComputeScope next(emulator, 3.0, clocks);
  time.wall += 0.002;
  time.work += 0.002;
  EXPECT_NEAR(next.end(), 0.003, 1e-12);
  EXPECT_NEAR(next.computingSeconds(), 0.006, 1e-12);
  // On a device of full speed it is the wall time, waiting for the core included.
  ComputeScope full(emulator, 1.0, clocks);
  time.wall += 0.004;
  time.work += 0.001;
  full.end();
  EXPECT_NEAR(full.computingSeconds(), 0.004, 1e-12);
}

// A tensor-parallel layer communicates in the middle of its segment: the device sleeps what the
// work so far owes before it (settleOpenSegment), the pause after it is left out, and the end
// sleeps for the work since; the computing seconds add up over the pieces.
TEST(ComputeScope, ASettledSegmentSleepsBeforeItsCommunicationAndGoesOn) {
  ManualClocks time;
  const ComputeClocks clocks = time.clocks();
  LateSleep sleep;
  SlowdownEmulator emulator(sleep.fn());
  EXPECT_EQ(settleOpenSegment(), 0.0);  // no segment open: nothing
  ComputeScope segment(emulator, 3.0, clocks);
  time.wall += 0.002;  // 2 ms of work
  time.work += 0.002;
  EXPECT_NEAR(settleOpenSegment(), 0.004, 1e-12);  // 3 x 2 ms - 2 ms, before the allreduce
  ASSERT_EQ(sleep.requests.size(), 1u);
  {
    ComputePause allreduce;
    time.wall += 0.010;
    time.work += 0.003;
  }
  time.wall += 0.001;  // 1 ms more work
  time.work += 0.001;
  EXPECT_NEAR(segment.end(), 0.002, 1e-12);  // only the work since the settle
  ASSERT_EQ(sleep.requests.size(), 2u);
  EXPECT_NEAR(segment.computingSeconds(), 0.009, 1e-12);  // 3 x (2 + 1) ms
  EXPECT_EQ(settleOpenSegment(), 0.0);                    // ended: nothing open any more
}

// A pause outside any segment changes nothing, nor does one in a segment that has ended; the next
// segment starts with nothing paused.
TEST(ComputeScope, APauseOutsideASegmentChangesNothing) {
  ManualClocks time;
  const ComputeClocks clocks = time.clocks();
  LateSleep sleep;
  SlowdownEmulator emulator(sleep.fn());
  {
    ComputePause waiting;
    time.wall += 0.005;
  }
  {
    ComputeScope segment(emulator, 2.0, clocks);
    time.wall += 0.001;
    time.work += 0.001;
    segment.end();
    ComputePause late;
    time.wall += 0.005;
    time.work += 0.005;
  }
  {
    ComputeScope segment(emulator, 2.0, clocks);
    time.wall += 0.003;
    time.work += 0.003;
  }
  ASSERT_EQ(sleep.requests.size(), 2u);
  EXPECT_NEAR(sleep.requests[0], 0.001, 1e-12);
  EXPECT_NEAR(sleep.requests[1], 0.003, 1e-12);
}

TEST(ComputeScope, ThisProcessesClocksMeasureTheCallingThread) {
  const ComputeClocks clocks = ComputeClocks::ofThisProcess(1);
  const double wall = clocks.wall(), work = clocks.work();
  volatile double sink = 0;
  for (int i = 0; i < 2000000; ++i) sink = sink + 1e-9 * i;
  EXPECT_GT(clocks.work(), work);
  EXPECT_GE(clocks.wall() - wall, clocks.work() - work - 1e-3);
}

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
