// Logging gated by level and subsystem, checked before any formatting (NCCL_DEBUG style):
//   HETRA_LOG=error|warn|info|debug        (default warn)
//   HETRA_LOG_SUBSYS=comm,store,...        (default all; a leading ^ excludes: ^store)
// Each line is prefixed with host, pid and rank:  [host:pid r2] INFO comm: message
#pragma once

#include <string>

#include "common/errors.h"

namespace hetra::log {

enum class Level { Error = 0, Warn = 1, Info = 2, Debug = 3 };

bool enabled(Level level, const char* subsystem);
void write(Level level, const char* subsystem, const std::string& message);
// The rank shown in the prefix of this process's lines (-1 hides it). Thread ranks in tests set it
// per thread.
void setRank(int rank);
// Re-reads HETRA_LOG / HETRA_LOG_SUBSYS (tests change them at run time).
void reloadConfig();

}  // namespace hetra::log

#define HETRA_LOG_AT(level, subsys, ...)                             \
  do {                                                               \
    if (::hetra::log::enabled(level, subsys))                        \
      ::hetra::log::write(level, subsys, ::hetra::str(__VA_ARGS__)); \
  } while (0)

#define HETRA_ERROR(subsys, ...) HETRA_LOG_AT(::hetra::log::Level::Error, subsys, __VA_ARGS__)
#define HETRA_WARN(subsys, ...) HETRA_LOG_AT(::hetra::log::Level::Warn, subsys, __VA_ARGS__)
#define HETRA_INFO(subsys, ...) HETRA_LOG_AT(::hetra::log::Level::Info, subsys, __VA_ARGS__)
#define HETRA_DEBUG(subsys, ...) HETRA_LOG_AT(::hetra::log::Level::Debug, subsys, __VA_ARGS__)
