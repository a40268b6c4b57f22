// Discovery of this machine's compute devices: CPU model, cores, memory; NVIDIA GPUs through NVML
// and AMD GPUs through ROCm SMI, both loaded with dlopen when present, with nvidia-smi / rocm-smi
// output parsed as a fallback when a library is missing but its tool exists. Nothing here needs a
// GPU SDK at build time: the few vendor types and prototypes used are declared in probe.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hetra::device {

struct GpuInfo {
  std::string vendor;  // "nvidia" | "amd"
  int index = 0;
  std::string name;
  uint64_t memoryTotal = 0;  // bytes
  uint64_t memoryFree = 0;
  std::string source;  // "nvml", "rocm_smi", "nvidia-smi", "rocm-smi"
  std::string uuid;
  std::string architecture;  // "sm_90" (CUDA compute capability) or "gfx90a"; empty when unknown
  std::string driverVersion;
  // -1 where the source does not report the value.
  int utilizationPercent = -1;
  int clockSmMHz = -1;
  int clockSmMaxMHz = -1;
  int clockMemoryMHz = -1;
  int temperatureC = -1;
};

struct HostInfo {
  std::string hostname;
  std::string cpuModel;
  int logicalCores = 0;  // CPUs this process may run on (sched_getaffinity, what `nproc` prints)
  int onlineCores = 0;   // CPUs online in the machine
  double cpuQuota = 0;   // cgroup v2 cpu.max limit in CPUs; 0 when unlimited or unknown
  uint64_t memoryTotal = 0;  // bytes
  uint64_t memoryAvailable = 0;
  uint64_t memoryLimit = 0;  // cgroup v2 memory.max; 0 when unlimited or unknown
  std::vector<GpuInfo> gpus;
  std::vector<std::string> notes;  // why a GPU library was not used, and similar
};

HostInfo probeHost();

// Human-readable summary, one "Key: value" line each; "GPUs: none found" when there are none.
std::string formatHostInfo(const HostInfo& info);
// Every field as a JSON object (unknown GPU values as null), for `hetra probe --json`.
std::string hostInfoJson(const HostInfo& info);

// Parsers of the fallback tools' output, separate so they can be tested on sample text. Both throw
// hetra::Error when the text is not what the tool prints.
//   nvidia-smi --query-gpu=<kNvidiaSmiQuery> --format=csv   (header line names the columns)
//   rocm-smi --showmeminfo vram --showproductname --json    (any text before the JSON is skipped)
extern const char* const kNvidiaSmiQuery;
std::vector<GpuInfo> parseNvidiaSmiCsv(const std::string& text);
std::vector<GpuInfo> parseRocmSmiJson(const std::string& text);

// The library probes, with symbol lookup injected (dlsym on the loaded library in probeHost) so
// tests can drive them with fake entry points. They append GPUs and notes to `info`; a false return
// means the library could not be used (a note says why) and the caller may try the tool instead.
using SymbolLookup = std::function<void*(const char* name)>;
bool probeNvml(const SymbolLookup& lookup, HostInfo& info);
bool probeRocmSmi(const SymbolLookup& lookup, HostInfo& info);

}  // namespace hetra::device
