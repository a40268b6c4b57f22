// parseBytes and formatBytes of train/config.h: memory sizes as the config writes them.
#include <algorithm>
#include <cctype>
#include <limits>
#include <map>

#include "common/errors.h"
#include "train/config.h"
#include "train/config/text.h"

namespace hetra::train {

using namespace cfg;  // the configuration's own helpers

int64_t parseBytes(const std::string& text) {
  auto bad = [&]() -> ConfigError {
    return ConfigError(str("memory size ", quote(text),
                           ": expected a whole number of bytes with an optional unit (B, KB, MB, "
                           "GB, TB = powers of 1000; KiB, MiB, GiB, TiB = powers of 1024), e.g. "
                           "\"512MiB\", \"1.5GB\" or \"1000\""));
  };
  std::string s = trim(text);
  size_t i = 0;
  __int128 mantissa = 0, scale = 1;
  bool digits = false;
  for (; i < s.size() && std::isdigit((unsigned char)s[i]); ++i, digits = true) {
    mantissa = mantissa * 10 + (s[i] - '0');
    if (mantissa > (__int128(1) << 80)) throw bad();
  }
  if (i < s.size() && s[i] == '.') {
    for (++i; i < s.size() && std::isdigit((unsigned char)s[i]); ++i, digits = true) {
      if (scale > __int128(1e18)) throw bad();
      mantissa = mantissa * 10 + (s[i] - '0');
      // Bounded like the integer part: 2^80 * 1 TiB still fits __int128 (found by fuzzing).
      if (mantissa > (__int128(1) << 80)) throw bad();
      scale *= 10;
    }
  }
  if (!digits) throw bad();
  std::string unit = trim(s.substr(i));
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  static const std::map<std::string, int64_t> kUnits = {
      {"", 1},
      {"b", 1},
      {"kb", 1000},
      {"mb", 1000 * 1000},
      {"gb", 1000 * 1000 * 1000},
      {"tb", int64_t(1000) * 1000 * 1000 * 1000},
      {"kib", int64_t(1) << 10},
      {"mib", int64_t(1) << 20},
      {"gib", int64_t(1) << 30},
      {"tib", int64_t(1) << 40},
  };
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) throw bad();
  __int128 bytes = mantissa * it->second;
  if (bytes % scale != 0) throw bad();
  bytes /= scale;
  if (bytes > std::numeric_limits<int64_t>::max()) throw bad();
  return int64_t(bytes);
}

std::string formatBytes(int64_t bytes) {
  if (bytes > 0) {
    const std::pair<int64_t, const char*> units[] = {{int64_t(1) << 40, "TiB"},
                                                     {int64_t(1) << 30, "GiB"},
                                                     {int64_t(1) << 20, "MiB"},
                                                     {int64_t(1) << 10, "KiB"},
                                                     {int64_t(1000) * 1000 * 1000 * 1000, "TB"},
                                                     {1000 * 1000 * 1000, "GB"},
                                                     {1000 * 1000, "MB"},
                                                     {1000, "KB"}};
    for (const auto& [size, name] : units)
      if (bytes % size == 0) return str(bytes / size, name);
  }
  return std::to_string(bytes);
}

}  // namespace hetra::train
