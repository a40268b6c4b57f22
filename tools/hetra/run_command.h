// `hetra run CONFIG.toml`: trains on the devices the config lists, one local process per device.
#pragma once

#include <string>
#include <vector>

namespace hetra::cli {

struct RunOptions {
  std::string configPath;
  std::vector<std::string> sets;  // "key=value" overrides, in order
  std::string metricsPath;
  std::string resumeDir;
  std::string timelinePath;  // "" = HETRA_TIMELINE's, if any (tools/hetra/timeline_merge.h)
  bool printConfig = false;
  bool rankFromEnv = false;  // run only the rank the environment names; fail without one
};

// Validates the config, then either runs as the rank the environment describes or starts one local
// rank per device. Returns the process exit status.
int runTraining(const RunOptions& options, const std::vector<std::string>& argv);

}  // namespace hetra::cli
