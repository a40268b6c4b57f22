#include "balance/tensor_split.h"

#include <cmath>

#include "common/errors.h"

namespace hetra::balance {

std::vector<int64_t> splitUnitsBySpeed(int64_t units, const std::vector<double>& speeds,
                                       int64_t atLeast) {
  if (speeds.empty()) throw ConfigError("a tensor split needs at least one device");
  for (size_t i = 0; i < speeds.size(); ++i)
    if (!(speeds[i] > 0) || !std::isfinite(speeds[i]))
      throw ConfigError(str("device ", i, " of a tensor split has speed ", speeds[i],
                            "; speeds must be positive"));
  HETRA_ENFORCE_GE(atLeast, 0, "units a device holds at least");
  if (units < int64_t(speeds.size()) * atLeast)
    throw ConfigError(str(units, " units cannot be split over ", speeds.size(),
                          " devices with at least ", atLeast, " each"));
  std::vector<int64_t> split(speeds.size(), atLeast);
  // Each further unit to the device whose time with it, (units + 1) / speed, is the least: the
  // slowest device's time after every assignment is then the least any split of that many units
  // reaches (an exchange argument), so the last one is optimal.
  for (int64_t given = int64_t(speeds.size()) * atLeast; given < units; ++given) {
    size_t best = 0;
    for (size_t i = 1; i < speeds.size(); ++i)
      if (double(split[i] + 1) / speeds[i] < double(split[best] + 1) / speeds[best]) best = i;
    ++split[best];
  }
  return split;
}

std::vector<int64_t> splitUnitsEvenly(int64_t units, size_t devices) {
  HETRA_ENFORCE_GT(devices, size_t(0), "devices of an even split");
  std::vector<int64_t> split(devices, units / int64_t(devices));
  for (size_t i = 0; i < size_t(units % int64_t(devices)); ++i) ++split[i];
  return split;
}

}  // namespace hetra::balance
