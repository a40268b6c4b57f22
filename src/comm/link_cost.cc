#include "comm/link_cost.h"

#include "common/errors.h"
#include "common/units.h"

namespace hetra::comm {

LinkCost parseLinkCost(const std::string& text) {
  const size_t comma = text.find(',');
  if (comma == std::string::npos)
    throw ConfigError(str("link cost '", text,
                          "' is not understood; use LATENCY,BANDWIDTH such as \"5us,5GB/s\""));
  LinkCost cost;
  cost.latencySeconds = parseSeconds(text.substr(0, comma), "latency");
  cost.bytesPerSecond = parseRate(text.substr(comma + 1), "bandwidth", RateUnit::kRequired);
  if (cost.bytesPerSecond <= 0)
    throw ConfigError(str("link cost '", text, "': the bandwidth must be above 0"));
  return cost;
}

}  // namespace hetra::comm
