#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <set>

#include "common/names.h"
#include "common/net.h"
#include "common/params.h"

namespace hetra::log {
namespace {

const Param kLogLevel("HETRA_LOG", "warn", "Log level: error, warn, info or debug.");
const Param kLogSubsys(
    "HETRA_LOG_SUBSYS", "",
    "Comma-separated subsystems to log (comm, store, device, balance, train, cli); "
    "a leading ^ logs all but those. Empty logs all.");

struct Config {
  Level level = Level::Warn;
  std::set<std::string> subsystems;
  bool exclude = false;
};

std::mutex configMutex;
Config config;
std::atomic<int> levelCache{int(Level::Warn)};
thread_local int threadRank = -2;  // -2: use the process rank
std::atomic<int> processRank{-1};

Config readConfig() {
  Config c;
  const std::string level = kLogLevel.str();
  if (level == "error")
    c.level = Level::Error;
  else if (level == "info")
    c.level = Level::Info;
  else if (level == "debug" || level == "trace")
    c.level = Level::Debug;
  else
    c.level = Level::Warn;
  std::string subsys = kLogSubsys.str();
  if (!subsys.empty() && subsys[0] == '^') {
    c.exclude = true;
    subsys.erase(0, 1);
  }
  size_t start = 0;
  while (start <= subsys.size() && !subsys.empty()) {
    size_t comma = subsys.find(',', start);
    if (comma == std::string::npos) comma = subsys.size();
    if (comma > start) c.subsystems.insert(subsys.substr(start, comma - start));
    start = comma + 1;
  }
  return c;
}

struct Init {
  Init() { reloadConfig(); }
} init;

constexpr NamedValue<Level> kLevelNames[] = {
    {Level::Error, "ERROR"}, {Level::Warn, "WARN"}, {Level::Info, "INFO"}, {Level::Debug, "DEBUG"}};
static_assert(coversEnum(kLevelNames, Level::Debug));

const char* levelName(Level level) {
  return nameOf(level, kLevelNames);
}

}  // namespace

void reloadConfig() {
  std::lock_guard<std::mutex> lock(configMutex);
  config = readConfig();
  levelCache.store(int(config.level));
}

bool enabled(Level level, const char* subsystem) {
  if (int(level) > levelCache.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(configMutex);
  if (config.subsystems.empty()) return true;
  const bool listed = config.subsystems.count(subsystem) > 0;
  return config.exclude ? !listed : listed;
}

void setRank(int rank) {
  threadRank = rank;
  processRank.store(rank);
}

void write(Level level, const char* subsystem, const std::string& message) {
  static const std::string host = net::hostName();
  const int rank = threadRank != -2 ? threadRank : processRank.load();
  char rankText[24] = "";
  if (rank >= 0) std::snprintf(rankText, sizeof rankText, " r%d", rank);
  std::fprintf(stderr, "[%s:%d%s] %s %s: %s\n", host.c_str(), int(getpid()), rankText,
               levelName(level), subsystem, message.c_str());
}

}  // namespace hetra::log
