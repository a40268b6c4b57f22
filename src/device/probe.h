// Discovery of this machine's compute devices: CPU model, cores, memory; NVIDIA GPUs through NVML and
// AMD GPUs through ROCm SMI, both loaded with dlopen when present.
#pragma once

#include <cstdint>
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
};

struct HostInfo {
  std::string hostname;
  std::string cpuModel;
  int logicalCores = 0;
  uint64_t memoryTotal = 0;  // bytes
  uint64_t memoryAvailable = 0;
  std::vector<GpuInfo> gpus;
  std::vector<std::string> notes;  // why a GPU library was not used, and similar
};

HostInfo probeHost();

}  // namespace hetra::device
