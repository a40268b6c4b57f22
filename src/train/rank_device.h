// The device a rank trains on, as both trainers (data-parallel, train/trainer.cc; pipeline,
// train/pipeline/pipeline_trainer.cc) set it up before anything else: its entry of the config, its
// memory (the ledger claim and the cap every later allocation is counted against), the process's
// compute threads and timer slack for the device's emulated speed, and its host heap kept
// (device/host_heap.h).
#pragma once

#include "train/config.h"
#include "train/device_memory.h"

namespace hetra::train {

// LibTorch's and OpenBLAS's compute threads, for a device of `threads` threads.
void setComputeThreads(int threads);

struct RankDevice {
  // Throws ConfigError where the device's memory cap cannot be enforced (DeviceMemory).
  RankDevice(const RunConfig& config, int rank);
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;

  const int rank;
  const DeviceConfig& config;  // config.devices[rank]
  DeviceMemory memory;         // a trainer's first member: before every member that allocates
};

}  // namespace hetra::train
