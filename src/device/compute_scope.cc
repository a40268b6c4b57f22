#include "device/compute_scope.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <exception>

#include "common/timeline.h"

namespace hetra::device {
namespace {

double cpuSeconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

thread_local ComputeScope* tOpenSegment = nullptr;

}  // namespace

ComputeClocks ComputeClocks::ofThisProcess(int threads) {
  ComputeClocks clocks;
  clocks.wall = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  if (threads <= 1)
    clocks.work = [] { return cpuSeconds(CLOCK_THREAD_CPUTIME_ID); };
  else
    clocks.work = [threads] { return cpuSeconds(CLOCK_PROCESS_CPUTIME_ID) / double(threads); };
  return clocks;
}

ComputeScope::ComputeScope(SlowdownEmulator& emulator, double slowdown, const ComputeClocks& clocks)
    : emulator_(emulator),
      slowdown_(slowdown),
      clocks_(clocks),
      wallStart_(clocks.wall()),
      workStart_(clocks.work()),
      enclosing_(tOpenSegment),
      uncaught_(std::uncaught_exceptions()) {
  tOpenSegment = this;
}

ComputeScope::~ComputeScope() {
  if (!ended_ && std::uncaught_exceptions() == uncaught_) end();
  if (!ended_) tOpenSegment = enclosing_;  // a failed segment
}

double ComputeScope::end() {
  if (ended_) return 0;
  ended_ = true;
  tOpenSegment = enclosing_;
  return sleepOwed();
}

double ComputeScope::settle() {
  if (ended_) return 0;
  const double slept = sleepOwed();
  wallStart_ = clocks_.wall();
  workStart_ = clocks_.work();
  pausedWall_ = pausedWork_ = 0;
  return slept;
}

double ComputeScope::sleepOwed() {
  timeline::Span sleep(timeline::Lane::Compute, "emulation", "slowdown sleep");
  sleep.arg("slowdown", slowdown_);
  const double wall = clocks_.wall() - wallStart_ - pausedWall_;
  const double work = clocks_.work() - workStart_ - pausedWork_;
  computing_ += SlowdownEmulator::emulatedSeconds(std::max(slowdown_, 1.0), std::max(wall, 0.0),
                                                  std::max(work, 0.0));
  return emulator_.endPhase(slowdown_, std::max(wall, 0.0), std::max(work, 0.0));
}

double settleOpenSegment() {
  return tOpenSegment ? tOpenSegment->settle() : 0.0;
}

ComputePause::ComputePause() : segment_(tOpenSegment) {
  if (!segment_) return;
  wallStart_ = segment_->clocks_.wall();
  workStart_ = segment_->clocks_.work();
}

ComputePause::~ComputePause() {
  if (!segment_ || segment_->ended_) return;
  segment_->pausedWall_ += segment_->clocks_.wall() - wallStart_;
  segment_->pausedWork_ += segment_->clocks_.work() - workStart_;
}

}  // namespace hetra::device
