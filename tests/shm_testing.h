// Helpers shared by the shared-memory tests.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/errors.h"
#include "store/store.h"

namespace hetra::test {

// Names of the /dev/shm segments that process `pid` created (hetra-<pid>-<random>).
inline std::vector<std::string> shmSegmentsOfPid(int pid) {
  std::vector<std::string> names;
  const std::string prefix = str("hetra-", pid, "-");
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* e = readdir(dir))
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) names.push_back(e->d_name);
    closedir(dir);
  }
  return names;
}

// One store per group, so that repeated groups in one test do not read each other's keys.
inline std::shared_ptr<store::Store> newGroupStore() {
  static auto root = std::make_shared<store::MemoryStore>();
  static int groups = 0;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  return std::make_shared<store::PrefixStore>(str("group", groups++), root);
}

}  // namespace hetra::test
