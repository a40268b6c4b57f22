// What Linux says of a process by its pid (/proc/<pid>/stat): its state, and its start time, which
// tells the process apart from a later one that reuses its pid. Used by the shared-memory transport
// to notice a dead peer and by the launcher to say what a hung rank is doing.
#pragma once

#include <cstdint>
#include <optional>

namespace hetra {

struct ProcessStat {
  char state = 0;  // 'R' running, 'S' sleeping, 'D' in the kernel, 'T' stopped, 'Z' zombie...
  uint64_t startTime = 0;  // clock ticks after boot (field 22)
};

// Nullopt when it cannot be read: no such process, or no /proc.
std::optional<ProcessStat> readProcessStat(int pid);

// This process's start time, 0 when unknown.
uint64_t ownStartTime();

// False when process `pid` is known to be gone: it does not exist, it is a zombie, or its pid now
// belongs to a process that started later than `startTime` (0: any start time is it). True when it
// cannot tell (pid <= 0 names no process yet).
bool processAlive(int pid, uint64_t startTime);

}  // namespace hetra
