#include "common/process.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/errors.h"

namespace hetra {

std::optional<ProcessStat> readProcessStat(int pid) {
  std::ifstream in(str("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  // The command (field 2) is in parentheses and may hold spaces and ')': the last ')' ends it.
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return std::nullopt;
  ProcessStat stat;
  stat.state = line[close + 2];
  // Fields after the command: state is field 3; starttime is field 22.
  const char* p = line.c_str() + close + 2;
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (!p) return std::nullopt;
    ++p;
  }
  stat.startTime = std::strtoull(p, nullptr, 10);
  return stat;
}

uint64_t ownStartTime() {
  const std::optional<ProcessStat> stat = readProcessStat(getpid());
  return stat ? stat->startTime : 0;
}

bool processAlive(int pid, uint64_t startTime) {
  if (pid <= 0) return true;  // not known yet: nothing to judge
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  const std::optional<ProcessStat> stat = readProcessStat(pid);
  if (!stat) return true;                                      // cannot tell: assume alive
  if (stat->state == 'Z' || stat->state == 'X') return false;  // killed but not reaped yet
  return startTime == 0 || stat->startTime == startTime;
}

}  // namespace hetra
