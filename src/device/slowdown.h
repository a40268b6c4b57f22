// Emulated slow devices (docs/benchmarks.md): a rank of slowdown s runs its real computation and
// then sleeps, so that each compute phase lasts s times the CPU work it did and the device runs at
// 1/s of the CPU slot it has.
//
// Vocabulary: `wall` is a phase's elapsed seconds, `work` the seconds of computation it did (its
// CPU time per thread, at most `wall`: when ranks share a core, waiting for the core must not be
// multiplied by s). The phase is *owed* s × work − wall more seconds.
//
// A sleep ends late: the timer's slack, and on a busy core the wait until the scheduler runs the
// rank again (measured here: 0.25 ms per phase on average, p90 0.6-1.2 ms, on the core two slow
// devices share). That lateness is a *debt* the next phases pay back by sleeping less, so the
// device runs at 1/s on average, as emulated, rather than slower by whatever the scheduler adds.
// The debt is capped, so one long stall is not repaid by a burst at full speed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

namespace hetra::device {

// One change of a device's slowdown: from `step` on it runs `factor` times slower, until the next.
struct SlowdownChange {
  int64_t step = 0;
  double factor = 1.0;
  bool operator==(const SlowdownChange&) const = default;
};

// The factor in effect at `step`: `initial` before the first change of `schedule` (steps
// increasing), then that of the latest change at or before `step`.
double slowdownAt(double initial, const std::vector<SlowdownChange>& schedule, int64_t step);

class SlowdownEmulator {
 public:
  // Sleeps about `seconds` and returns the seconds it actually slept.
  using Sleep = std::function<double(double seconds)>;
  static constexpr double kMaxDebtSeconds = 0.005;

  explicit SlowdownEmulator(Sleep sleep = sleepFor);

  // Ends a compute phase: sleeps what it owes, less the debt. Returns the seconds slept.
  double endPhase(double slowdown, double wall, double work);
  // How long the emulated device takes for a phase of `wall` seconds with `work` CPU seconds:
  // the work, `slowdown` times, where that is longer than the wall time (what endPhase owes on
  // top of it), whatever the debt and the sleeps' lateness.
  static double emulatedSeconds(double slowdown, double wall, double work) {
    return std::max(wall, slowdown * std::min(wall, work));
  }

  double debtSeconds() const { return debt_; }

  // The calling thread's timer slack to 1 ns: the default 50 us is a few percent of a slow
  // device's short phases. Call on the thread that runs the phases.
  static void tightenTimerSlack();

  static double sleepFor(double seconds);

 private:
  Sleep sleep_;
  double debt_ = 0;
};

}  // namespace hetra::device
