// How a tensor-parallel layer's units (attention heads, MLP hidden units) are split over devices
// of unequal speed (train/tensor_parallel.h): each device computes its units, and the layer waits
// for the slowest, so the split that minimises the slowest device's time, max_i units_i / speed_i,
// is the one to take. Pure logic, deterministic: every rank computes the same split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hetra::balance {

// `units` over devices of relative `speeds` (> 0), each device at least `atLeast` units: the split
// with the least max_i units_i / speed_i, ties to the lower index (one unit at a time to the
// device that would finish it first, which is optimal for this objective). ConfigError when
// units < devices x atLeast or a speed is not positive.
std::vector<int64_t> splitUnitsBySpeed(int64_t units, const std::vector<double>& speeds,
                                       int64_t atLeast = 1);

// An equal split: units / devices each, the remainder one more each on the first devices.
std::vector<int64_t> splitUnitsEvenly(int64_t units, size_t devices);

}  // namespace hetra::balance
