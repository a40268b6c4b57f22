// parseConfig on arbitrary text: it may only throw ConfigError (an uncaught exception of any other
// type aborts, which libFuzzer reports), and a config it accepts prints (toToml) as TOML that
// parses back to an equal config, as config.h promises. Lines "#set key=value" at the start of the
// input become --set overrides, so the override path is fuzzed too.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.h"
#include "fuzz_common.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetra;
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> sets;
  while (text.rfind("#set ", 0) == 0) {
    const size_t end = text.find('\n');
    sets.push_back(text.substr(5, end == std::string::npos ? std::string::npos : end - 5));
    text = end == std::string::npos ? "" : text.substr(end + 1);
  }
  train::Capabilities caps;  // fixed, so a crash reproduces on any machine
  caps.cores = 4;
  train::RunConfig config;
  try {
    config = train::parseConfig(text, "fuzz.toml", sets, caps);
  } catch (const ConfigError&) {
    return 0;
  }
  const std::string printed = train::toToml(config);
  try {
    if (!(train::parseConfig(printed, "printed.toml", {}, caps) == config))
      fuzz::fail("toToml of an accepted config parses to a different config:\n" + printed);
  } catch (const ConfigError& e) {
    fuzz::fail(std::string("toToml of an accepted config is refused: ") + e.what() + "\n" +
               printed);
  }
  return 0;
}
