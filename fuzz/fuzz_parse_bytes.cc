// parseBytes on arbitrary text: only ConfigError; an accepted size is >= 0 and formatBytes of it
// parses back to the same number.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/errors.h"
#include "fuzz_common.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetra;
  const std::string text(reinterpret_cast<const char*>(data), size);
  int64_t bytes = 0;
  try {
    bytes = train::parseBytes(text);
  } catch (const ConfigError&) {
    return 0;
  }
  if (bytes < 0) fuzz::fail("parseBytes accepted '" + text + "' as a negative size");
  const std::string printed = train::formatBytes(bytes);
  try {
    if (train::parseBytes(printed) != bytes)
      fuzz::fail("formatBytes(" + std::to_string(bytes) + ") = '" + printed + "' parses back to " +
                 std::to_string(train::parseBytes(printed)));
  } catch (const ConfigError& e) {
    fuzz::fail("formatBytes(" + std::to_string(bytes) + ") = '" + printed +
               "' is refused: " + e.what());
  }
  return 0;
}
