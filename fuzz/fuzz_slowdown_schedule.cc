// A device's slowdown and slowdown_schedule from arbitrary text: only ConfigError, and an accepted
// schedule has strictly increasing steps >= 0 and factors >= 1 (config.h's promise).
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/errors.h"
#include "fuzz_common.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetra;
  const std::string value(reinterpret_cast<const char*>(data), size);
  // The fuzzed value is the schedule of the second device (the first one keeps the run valid).
  const std::string text =
      "[data]\nname = \"synthetic\"\n[train]\nglobal_batch = 8\nsteps = 4\n"
      "[[devices]]\nslowdown = 1\n[[devices]]\nslowdown_schedule = " +
      value + "\n";
  train::Capabilities caps;
  caps.cores = 4;
  train::RunConfig config;
  try {
    config = train::parseConfig(text, "fuzz.toml", {}, caps);
  } catch (const ConfigError&) {
    return 0;
  }
  if (config.devices.size() != 2) fuzz::fail("the device count changed");
  int64_t previous = -1;
  for (const auto& change : config.devices[1].slowdownSchedule) {
    if (change.step <= previous) fuzz::fail("accepted a schedule whose steps do not increase");
    if (!(change.factor >= 1.0)) fuzz::fail("accepted a slowdown factor below 1 (or NaN)");
    previous = change.step;
  }
  return 0;
}
