#include "device/slowdown.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace hetra::device {

double slowdownAt(double initial, const std::vector<SlowdownChange>& schedule, int64_t step) {
  double factor = initial;
  for (const auto& change : schedule) {
    if (change.step > step) break;
    factor = change.factor;
  }
  return factor;
}

SlowdownEmulator::SlowdownEmulator(Sleep sleep) : sleep_(std::move(sleep)) {}

double SlowdownEmulator::endPhase(double slowdown, double wall, double work) {
  if (slowdown <= 1.0) return 0;
  const double owed = emulatedSeconds(slowdown, wall, work) - wall;
  if (owed <= 0) return 0;
  const double sleep = owed - debt_;
  if (sleep <= 0) {
    debt_ = -sleep;
    return 0;
  }
  const double slept = sleep_(sleep);
  debt_ = std::clamp(slept - sleep, 0.0, kMaxDebtSeconds);
  return slept;
}

void SlowdownEmulator::tightenTimerSlack() {
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
}

double SlowdownEmulator::sleepFor(double seconds) {
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace hetra::device
