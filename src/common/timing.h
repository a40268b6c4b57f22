// Clocks and deadlines. Every blocking call in hetra takes a Deadline (an absolute time) so that a
// sequence of waits inside one collective shares one budget instead of stacking timeouts.
#pragma once

#include <chrono>

namespace hetra {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
using Millis = std::chrono::milliseconds;

inline Deadline deadlineAfter(Millis timeout) {
  return Clock::now() + timeout;
}

inline Millis remaining(Deadline deadline) {
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  return left.count() > 0 ? left : Millis(0);
}

inline double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace hetra
