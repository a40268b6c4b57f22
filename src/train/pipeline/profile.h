// The short profile a pipeline starts with: each block's forward+backward time for one chunk on
// this rank's device, measured through the compute scopes (so an emulated device's slowdown is in
// the numbers, device/compute_scope.h), the activation bytes each block keeps for its backward,
// and the shape of each block's output (what the next stage receives).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "device/compute_scope.h"
#include "device/slowdown.h"
#include "train/datasets.h"

namespace hetra::train {
class BlockModel;
}

namespace hetra::train::pipeline {

// A rank's compute: every segment runs inside a ComputeScope of its device's slowdown.
class EmulatedDevice {
 public:
  explicit EmulatedDevice(int threads) : clocks_(device::ComputeClocks::ofThisProcess(threads)) {}
  // Runs `work` as one compute segment; returns its wall seconds, the emulation's sleep included.
  double compute(double slowdown, const std::function<void()>& work);

 private:
  device::SlowdownEmulator emulator_;
  device::ComputeClocks clocks_;
};

struct BlockProfile {
  std::vector<double> seconds;  // per block: forward + backward of the profiled chunk
  // Per block: activation bytes its forward left alive (the process's memory ledger; 0 where no
  // counting allocator runs).
  std::vector<int64_t> activationBytes;
  std::vector<std::vector<int64_t>> outputShapes;  // per block, without the batch dimension
};

// Runs `rounds` forward and backward passes of `chunk` through the model block by block, each
// block's forward and its backward one segment of `device` at `slowdown`, and keeps each block's
// fastest round. The parameters' gradients are cleared afterwards: the profile leaves no trace on
// the training.
BlockProfile profileBlocks(BlockModel& model, const Batch& chunk, EmulatedDevice& device,
                           double slowdown, int rounds);

// Summed cross-entropy of logits against targets: the loss every stage and test uses.
torch::Tensor summedLoss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace hetra::train::pipeline
