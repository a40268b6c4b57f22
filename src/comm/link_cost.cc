#include "comm/link_cost.h"

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

#include "common/errors.h"

namespace hetra::comm {
namespace {

double parseNumberWithUnit(const std::string& text, const std::string& what,
                           const std::vector<std::pair<std::string, double>>& units) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (used > 0 && value >= 0)
    for (const auto& [name, scale] : units)
      if (unit == name) return value * scale;
  std::string allowed;
  for (const auto& [name, scale] : units) allowed += (allowed.empty() ? "" : ", ") + name;
  throw ConfigError(
      str(what, " '", text, "' is not understood; use a number with one of: ", allowed));
}

}  // namespace

LinkCost parseLinkCost(const std::string& text) {
  const size_t comma = text.find(',');
  if (comma == std::string::npos)
    throw ConfigError(str("link cost '", text,
                          "' is not understood; use LATENCY,BANDWIDTH such as \"5us,5GB/s\""));
  LinkCost cost;
  cost.latencySeconds = parseNumberWithUnit(text.substr(0, comma), "latency",
                                            {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}});
  cost.bytesPerSecond = parseNumberWithUnit(text.substr(comma + 1), "bandwidth",
                                            {{"b/s", 1},
                                             {"kb/s", 1e3},
                                             {"mb/s", 1e6},
                                             {"gb/s", 1e9},
                                             {"kbit", 125},
                                             {"mbit", 125e3},
                                             {"gbit", 125e6}});
  if (cost.bytesPerSecond <= 0)
    throw ConfigError(str("link cost '", text, "': the bandwidth must be above 0"));
  return cost;
}

}  // namespace hetra::comm
