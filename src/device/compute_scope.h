// One compute segment of an emulated device (docs/benchmarks.md, "every compute segment"): the
// micro-batch's forward+backward, the optimizer step, and whatever later layers compute. The
// scope measures the segment's wall time and the computing thread's CPU time, and when it ends a
// device of slowdown s sleeps what SlowdownEmulator says it owes: (s - 1) x the work, less the
// debt of earlier late wake-ups (a "slowdown sleep" span on the timeline).
//
// Work is CPU time per thread: with one thread, LibTorch and BLAS run the whole segment on the
// calling thread, so its own clock leaves out the communicator's progress thread (gradient
// allreduces, polling), whose work is communication and must not be multiplied by the slowdown.
// With more threads the process clock divided by the threads is the best there is.
//
// A segment may wait for its peers: ZeRO gathers each block inside forward and backward, and
// reduce-scatters gradients inside backward. The emulated device computes nothing then, so a
// ComputePause takes that stretch out of the segment: its wall time, and the thread's CPU time
// spinning or running the collective itself, which the slowdown must not multiply.
#pragma once

#include <functional>

#include "device/slowdown.h"

namespace hetra::device {

// Seconds, from any fixed origin. Injected by tests.
struct ComputeClocks {
  std::function<double()> wall;  // elapsed time
  std::function<double()> work;  // CPU seconds per thread of the segment's threads
  // The steady clock, and the calling thread's CPU clock (threads == 1) or the process's divided
  // by `threads`.
  static ComputeClocks ofThisProcess(int threads);
};

class ComputeScope {
 public:
  ComputeScope(SlowdownEmulator& emulator, double slowdown, const ComputeClocks& clocks);
  // Ends the segment unless an exception is leaving it (a failed segment is not emulated).
  ~ComputeScope();
  ComputeScope(const ComputeScope&) = delete;
  ComputeScope& operator=(const ComputeScope&) = delete;

  // Ends the segment now and returns the seconds slept; the destructor then does nothing.
  double end();
  // The device is about to communicate in the middle of the segment (a tensor-parallel layer's
  // allreduce): it sleeps what the work since the segment began, or since the last settle(), owes
  // now, before the communication, and the segment goes on. Returns the seconds slept.
  double settle();
  // After end(): the seconds the emulated device computed, without the pauses: its work at the
  // slowdown (SlowdownEmulator::emulatedSeconds), not what the sleep happened to take after a
  // late wake-up or while repaying one (0 before; the pieces settled so far after settle()).
  double computingSeconds() const { return computing_; }

 private:
  friend class ComputePause;
  friend double settleOpenSegment();
  // Sleeps what the work since wallStart_ / workStart_ owes; adds it to computing_.
  double sleepOwed();
  SlowdownEmulator& emulator_;
  double slowdown_;
  const ComputeClocks& clocks_;
  double wallStart_, workStart_;
  double pausedWall_ = 0, pausedWork_ = 0;
  double computing_ = 0;
  ComputeScope* enclosing_;  // the scope open on this thread before this one
  int uncaught_;
  bool ended_ = false;
};

// The segment open on this thread (if any) settles (ComputeScope::settle): for code that
// communicates inside a segment it did not open. Returns the seconds slept.
double settleOpenSegment();

// While alive, the segment open on this thread (if any) is not computing: a wait for peers.
class ComputePause {
 public:
  ComputePause();
  ~ComputePause();
  ComputePause(const ComputePause&) = delete;
  ComputePause& operator=(const ComputePause&) = delete;

 private:
  ComputeScope* segment_;
  double wallStart_ = 0, workStart_ = 0;
};

}  // namespace hetra::device
