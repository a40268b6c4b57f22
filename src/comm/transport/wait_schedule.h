// How a transport's wait spends the time until its message arrives, shared by the tcp and mpi
// transports. A small message arrives within microseconds, but a thread that sleeps in the kernel
// needs tens of microseconds to be woken on a busy machine (and a sleep slice is coarser still), so
// a wait first polls without sleeping, then polls and yields the core to other threads, and only
// then blocks.
#pragma once

#include <chrono>

#include "common/timing.h"

namespace hetra::comm {

enum class WaitPhase { kSpin, kYield, kBlock };

struct WaitSchedule {
  Clock::duration spinFor;   // poll without giving up the core
  Clock::duration yieldFor;  // then poll and sched_yield() until this much time has passed
  WaitPhase phase(Clock::duration waited) const {
    return waited < spinFor    ? WaitPhase::kSpin
           : waited < yieldFor ? WaitPhase::kYield
                               : WaitPhase::kBlock;
  }
};

}  // namespace hetra::comm
