// A rank's device memory while it trains (docs/memory.md): its claim on the process's memory
// ledger with the device's cap, and the gradients' category. Autograd allocates a parameter's
// gradient while it computes activations' gradients and then adopts the buffer as .grad, so the
// allocator alone would count gradients as activations; a post-hook on each parameter's gradient
// accumulator moves the buffer to "gradients" the moment it becomes the .grad.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "device/memory_accounting.h"
#include "train/config.h"

namespace torch::autograd {
struct Node;
}

namespace hetra::train {

class DeviceMemory {
 public:
  // Installs the counting allocator (train/counting_allocator.h), claims the process's ledger for
  // `device` with `capBytes` (0: no cap) and restarts its peaks.
  DeviceMemory(const std::string& device, int64_t capBytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // Whether this rank has the process to itself: its cap is enforced and its usage is its own.
  // False when ranks are threads of one process (their allocations cannot be told apart).
  bool enforced() const { return claim_.enforced(); }

  // Counts every gradient of `params` as gradients from the moment autograd accumulates it.
  void trackGradients(const std::vector<torch::Tensor>& params);
  // Moves every defined .grad of the tracked parameters to gradients (what finish() allocated).
  void adoptGradients();

  device::MemoryUsage usage() const { return device::MemoryLedger::process().usage(); }
  device::MemoryUsage usageAtLastRefusal() const {
    return device::MemoryLedger::process().usageAtLastRefusal();
  }

 private:
  device::MemoryLedger::Claim claim_;
  std::vector<torch::Tensor> params_;
  // Held so that the accumulators carrying our hooks live as long as we do.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hookKeys_;
};

// What a rank that ran out of memory during a micro-batch of `microBatch` samples would fit in,
// from what it measured when it failed (`error`, the ledger's usage at the refusal), the
// parameters' bytes and the optimizer's state copies per parameter (0, 1 or 2): the largest
// micro-batch its cap can hold (with gradient accumulation the step stays the same), activation
// checkpointing, and, when not even the fixed part fits, that the fixed part needs sharding or more
// memory. `deviceKey` names the config key ("devices[1]"). Returns the error's text with that
// added.
std::string whatFits(const DeviceOutOfMemoryError& error, const device::MemoryUsage& usage,
                     int64_t microBatch, int stateCopies, bool checkpointing,
                     const std::string& deviceKey);

// Optimizer state copies per parameter: 2 for adam and adamw, 1 for sgd with momentum, else 0.
int optimizerStateCopies(const std::string& optimizer, double momentum);

// What `hetra run --print-config` says of memory: per device, the predicted peak at the micro-batch
// an equal split of the global batch gives it under its caps, from the model's analytic footprint
// (train/models.h, which errs high), as TOML comment lines. Custom models have none: "".
std::string predictedMemory(const RunConfig& config);

// Writes the rank's memory for a step report: *peak = the device categories' peak and
// categories[c] = each category's peak, or -1 and zeros when the memory is not this rank's alone.
void reportMemory(const DeviceMemory& memory, double* peak, double* categories);

}  // namespace hetra::train
