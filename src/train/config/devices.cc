// The device entries of the configuration: their defaults, what this build allows, and the
// public helpers that map an entry onto the device and balance layers (memory caps, slowdown).
#include "train/config/devices.h"

#include <sched.h>

#include <cstdio>
#include <map>
#include <set>
#include <thread>

#include "balance/memory_caps.h"
#include "common/errors.h"
#include "train/config/text.h"

namespace hetra::train {
namespace {

// "48.0 MiB": a size to read at a glance, next to the exact number of bytes.
std::string approxBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace

namespace cfg {

void resolveDevices(RunConfig& config) {
  std::map<std::string, std::set<int64_t>> taken;
  for (const auto& d : config.devices)
    if (d.kind != "cpu" && d.index >= 0) taken[d.kind].insert(d.index);
  std::map<std::string, int64_t> ordinal;
  for (auto& d : config.devices) {
    int64_t n = ordinal[d.kind]++;
    if (d.kind != "cpu" && d.index < 0) {
      int64_t index = 0;
      while (taken[d.kind].count(index)) ++index;
      d.index = index;
      taken[d.kind].insert(index);
    }
    if (d.name.empty()) d.name = d.kind == "cpu" ? str("cpu", n) : str(d.kind, d.index);
  }
}

}  // namespace cfg

Capabilities Capabilities::ofThisBuild() {
  Capabilities caps;
#ifdef HETRA_WITH_CUDA
  caps.cudaBuild = true;
#endif
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) caps.cores = CPU_COUNT(&set);
  if (caps.cores <= 0) caps.cores = int(std::thread::hardware_concurrency());
  return caps;
}

int64_t resyncEveryOf(const RunConfig& config) {
  if (config.train.resyncEvery >= 0) return config.train.resyncEvery;
  std::set<std::string> kinds;
  for (const auto& d : config.devices) kinds.insert(d.kind);
  return kinds.size() > 1 ? 100 : 0;
}

int64_t maxMicroBatch(const DeviceConfig& device, int64_t fixedBytes, int64_t bytesPerSample) {
  return balance::maxMicroBatch(device.memoryBytes, fixedBytes, bytesPerSample);
}

void checkMemoryCaps(const RunConfig& config, int64_t fixedBytes, int64_t bytesPerSample) {
  for (size_t i = 0; i < config.devices.size(); ++i) {
    const DeviceConfig& d = config.devices[i];
    if (maxMicroBatch(d, fixedBytes, bytesPerSample) >= 1) continue;
    const int64_t need = balance::bytesForOneSample(fixedBytes, bytesPerSample);
    throw ConfigError(
        str("devices[", i, "].memory = ", cfg::quote(formatBytes(d.memoryBytes)), " (",
            d.memoryBytes, " bytes): too small for one sample of this model: ", "needs at least ",
            need, " bytes (", approxBytes(need), ": ", fixedBytes,
            " for parameters, gradients and optimizer state + ", bytesPerSample, " per sample)"));
  }
}

double slowdownAt(const DeviceConfig& device, int64_t step) {
  return device::slowdownAt(device.slowdown, device.slowdownSchedule, step);
}

}  // namespace hetra::train
