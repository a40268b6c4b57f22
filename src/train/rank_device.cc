#include "train/rank_device.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include "device/host_heap.h"
#include "device/slowdown.h"

namespace hetra::train {

// A device of N threads must use N cores, also inside BLAS: OpenBLAS keeps its own thread pool,
// sized for the whole machine and spinning between calls, which LibTorch's set_num_threads does not
// touch. Looked up at run time, so other BLAS libraries simply skip this.
void setComputeThreads(int threads) {
  torch::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set(threads);
}

RankDevice::RankDevice(const RunConfig& runConfig, int rankIndex)
    : rank(rankIndex),
      config(runConfig.devices.at(size_t(rankIndex))),
      memory(config.name, config.memoryBytes) {
  setComputeThreads(int(config.threads));
  device::keepHostHeap();  // a step's tensors stay in the heap for the next (device/host_heap.h)
  // A slowed device sleeps in short pieces; the kernel's default slack would stretch each one.
  if (slowdownAt(config, 0) > 1.0 || !config.slowdownSchedule.empty())
    device::SlowdownEmulator::tightenTimerSlack();
}

}  // namespace hetra::train
