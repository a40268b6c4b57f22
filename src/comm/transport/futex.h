// Futex wait/wake on 32-bit words of memory shared between processes (never FUTEX_PRIVATE: the
// waiters and wakers of a shared-memory segment live in different processes).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

#include "common/timing.h"

namespace hetra::comm::futex {

// Sleeps while *word == expected, at most `timeout`; returns early on a wake, a signal or when the
// word already differs. The caller re-checks its condition in every case.
inline void wait(const std::atomic<uint32_t>* word, uint32_t expected, Millis timeout) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  timespec ts;
  ts.tv_sec = timeout.count() / 1000;
  ts.tv_nsec = long(timeout.count() % 1000) * 1000000L;
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr,
          0);
}

inline void wakeAll(const std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

// The low half of a 64-bit counter, which is what a futex can watch (x86-64 is little endian): it
// changes whenever the counter does, short of 2^32 increments between two looks.
inline const std::atomic<uint32_t>* lowHalf(const std::atomic<uint64_t>* counter) {
  static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t));
  return reinterpret_cast<const std::atomic<uint32_t>*>(counter);
}

}  // namespace hetra::comm::futex
