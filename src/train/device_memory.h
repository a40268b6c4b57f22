// A rank's device memory while it trains (docs/memory.md): its claim on the process's memory
// ledger with the device's cap, the gradients' category, the activations each micro-batch
// measures (which bound the balancer's micro-batches), and what would fit when the cap is passed.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"
#include "device/memory_accounting.h"
#include "train/config.h"

namespace torch::autograd {
struct Node;
}

namespace hetra::train {

class Dataset;
class Model;

// Autograd allocates a parameter's gradient while it computes activations' gradients and then
// adopts the buffer as .grad, so the allocator alone would count gradients as activations; a
// post-hook on each parameter's gradient accumulator moves the buffer to "gradients" the moment it
// becomes the .grad.
class GradientCategory {
 public:
  explicit GradientCategory(const std::vector<torch::Tensor>& params);
  ~GradientCategory();
  GradientCategory(const GradientCategory&) = delete;
  GradientCategory& operator=(const GradientCategory&) = delete;
  // Moves every defined .grad of the parameters to gradients (what DataParallel's finish() wrote).
  void adopt();

 private:
  std::vector<torch::Tensor> params_;
  // Held so that the accumulators carrying our hooks live as long as we do.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hookKeys_;
};

// One step's micro-batches, measured: the largest it ran, the device's peak during it and the
// activations' part of that micro-batch (their peak beyond what was live when it began), of the
// micro-batch of that size whose device peak was highest (0 samples: nothing measured).
struct ActivationMeasurement {
  int64_t samples = 0;
  int64_t bytes = 0;
  int64_t devicePeak = 0;
};

class DeviceMemory {
 public:
  // Installs the counting allocator (train/counting_allocator.h), claims the process's ledger for
  // `device` with `capBytes` (0: no cap) and restarts its peaks. ConfigError for a cap with the
  // accounting off (device/memory_accounting.h): nothing could enforce it.
  DeviceMemory(const std::string& device, int64_t capBytes);
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // Whether this rank's memory is counted and its own: its cap is enforced and its usage real.
  // False with the accounting off, or when ranks are threads of one process (their allocations
  // cannot be told apart).
  bool enforced() const { return accounting_ && claim_.enforced(); }

  // Counts every gradient of `params` as gradients from the moment autograd accumulates it.
  void trackGradients(const std::vector<torch::Tensor>& params);
  void adoptGradients();

  // Around each micro-batch's forward+backward: its activations' peak is measured on its own.
  void startMicroBatch();
  void endMicroBatch(int64_t samples);
  // The step's measurement, and a fresh one for the next step.
  ActivationMeasurement takeMeasurement();

  device::MemoryUsage usage() const { return device::MemoryLedger::process().usage(); }
  device::MemoryUsage usageAtLastRefusal() const {
    return device::MemoryLedger::process().usageAtLastRefusal();
  }

 private:
  bool accounting_;
  device::MemoryLedger::Claim claim_;
  std::optional<GradientCategory> gradients_;
  int64_t windowLive_ = 0;  // activations live when the current micro-batch started
  ActivationMeasurement step_;
};

// The micro-batch bound a rank's measurement gives its device: balance::measuredMaxMicroBatch of
// the cap, the fixed bytes (the device's peak during the micro-batch less its activations: what
// the micro-batch's size does not change) and the measured activations, within
// devices[i].max_micro_batch. 0 when there is nothing to go by (no cap, nothing measured).
int64_t measuredMicroBatchBound(const DeviceConfig& device, const ActivationMeasurement& measured);

// What a device measured of its footprint after it ran out of memory (docs/memory.md, "What
// fits"): the fixed part as it will be at the step's end, and the activations of a micro-batch of
// m samples, base + perSample * m, from two measured sizes.
struct MeasuredFootprint {
  int64_t parameters = 0;
  int64_t gradients = 0;         // of the trainable parameters, whether or not they exist yet
  int64_t optimizerState = 0;    // its copies per trainable parameter, whether or not allocated yet
  int64_t communication = 0;     // buckets, error feedback residuals
  int64_t largestParameter = 0;  // what ZeRO-3 gathers at a time (docs/memory.md)
  int64_t activationBase = 0, activationPerSample = 0;
  int64_t checkpointedActivations = -1;  // at the failing micro-batch with checkpointing; -1: none
  int64_t fixed() const { return parameters + gradients + optimizerState + communication; }
  int64_t activationsAt(int64_t samples) const {
    return activationBase + activationPerSample * samples;
  }
};

// The settings that would fit under `capBytes`, predicted from a footprint for a run of
// `devices` devices whose failing micro-batch had `microBatch` samples.
struct WhatFits {
  int64_t largestMicroBatch = 0;  // below the failing one; 0: not one sample beside the fixed part
  int64_t checkpointedPeak = -1;  // at microBatch, with activation checkpointing; -1: not known
  // The least ZeRO stage that holds the failing micro-batch, or, when not one sample fits without
  // ZeRO, the least that holds any (at its largest micro-batch); 0: none.
  int zeroStage = 0;
  int64_t zeroMicroBatch = 0;  // the micro-batch at that stage
  int64_t zeroPeak = 0;        // the predicted peak at that stage and micro-batch
};
WhatFits whatFits(const MeasuredFootprint& footprint, int64_t capBytes, int64_t microBatch,
                  int devices);
// The predicted peak of ZeRO stage `stage` (0-3) with `devices` devices at a micro-batch of
// `samples` (the formula of docs/memory.md).
int64_t zeroPeak(const MeasuredFootprint& footprint, int stage, int devices, int64_t samples);

// `error`, which a micro-batch of `microBatch` samples raised on rank `rank`, with what would fit
// added: measures the model's footprint with the cap lifted (a replica of the model, built as the
// run built it, on `data`'s first samples) and names the settings (the message of docs/memory.md).
// `makeModel` is a program's own model, or empty for the config's.
DeviceOutOfMemoryError withWhatFits(const DeviceOutOfMemoryError& error, const RunConfig& config,
                                    const std::function<std::shared_ptr<Model>()>& makeModel,
                                    const Dataset& data, int64_t microBatch, int rank);

// Optimizer state copies per parameter: 2 for adam and adamw, 1 for sgd with momentum, else 0.
int optimizerStateCopies(const std::string& optimizer, double momentum);

// Refuses, before any rank starts, a config whose caps cannot work: a cap with the accounting off,
// or one below the model's parameters and their gradients (8 bytes a parameter, which every
// device of data-parallel training holds; the rest is measured once the run starts).
void checkDeviceMemory(const RunConfig& config);

// What `hetra run --print-config` says of memory: per device, the predicted peak at the micro-batch
// an equal split of the global batch gives it under its caps, from the model's analytic footprint
// (train/models.h, which errs high), as TOML comment lines. Custom models have none: "".
std::string predictedMemory(const RunConfig& config);

// Writes the rank's memory for a step report: *peak = the device categories' peak and
// categories[c] = each category's peak, or -1 and zeros when the memory is not this rank's alone.
void reportMemory(const DeviceMemory& memory, double* peak, double* categories);

}  // namespace hetra::train
