// Trainer: one rank's training loop (the "one training step" of docs/architecture.md).
//
// Every rank runs the same loop on its own device: take its slice of the step's global batch, run
// it as k micro-batches of at most m samples (summed gradients, no communication between them),
// then the DataParallel engine all-reduces gradient buckets while the last backward runs and
// divides by the global batch. Each rank's timings are all-gathered every step and fed to an
// identical Balancer on every rank, so all ranks switch to a new split at the same step without
// further messages.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "train/config.h"

namespace at {
class Tensor;  // torch::Tensor
}

namespace hetra::train {

class Model;    // train/models.h
class Dataset;  // train/datasets.h

struct TrainerOptions {
  std::string metricsPath;   // JSON Lines written by rank 0 ("" = none)
  std::string resumeDir;     // checkpoint directory to continue from ("" = start fresh)
  bool progressBar = false;  // rank 0 redraws one progress line (a terminal) instead of plain lines
  // Append to metricsPath even when starting at step 0 (an elastic restart before the first
  // checkpoint: the records of the failed attempt and the restart record stay).
  bool appendMetrics = false;

  // A program's own model and data instead of config.model and config.data (examples/
  // custom_model.cpp). Each rank calls them once. The replicas may start different: rank 0's
  // parameters are broadcast. The datasets must be equal on every rank (the sampler hands out
  // global indices); ranks that are threads may share one. A custom model has no analytic memory
  // footprint: until its first step is measured, devices[i].memory caps do not bound its
  // micro-batches (docs/memory.md), and checkModelFits does not apply.
  std::function<std::shared_ptr<Model>()> makeModel;
  std::function<std::shared_ptr<const Dataset>(bool train)> makeDataset;

  // Called on this rank right after each optimizer step of data parallelism or of a pipeline
  // stage, with the tensors it updated (the model's parameters; the stage's) and the step
  // (0-based): a program may adjust them; tests make a rank round its updates as another kind of
  // device would, to measure the replicas' drift (train.resync_every).
  std::function<void(const std::vector<at::Tensor>& updated, int64_t step)> afterOptimizerStep;

  // What the console and metrics call makeModel's model ("": "a custom model").
  std::string modelName;
  // false: this rank reports nothing (no console, no metrics), even as rank 0 of its group.
  bool report = true;
  // The ranks that compute one replica together (a tensor-parallel group, whose members run in
  // different data-parallel groups): each step's report is made theirs alike (its rank 0's), so
  // that every data-parallel group's balancer decides the same split.
  std::shared_ptr<comm::Communicator> replicaGroup;
};

// The run's train and test sets: TrainerOptions::makeDataset's, else the config's [data].
std::pair<std::shared_ptr<const Dataset>, std::shared_ptr<const Dataset>> loadTrainAndTestData(
    const RunConfig& config, const TrainerOptions& options);

struct TrainResult {
  int64_t steps = 0;
  double wallSeconds = 0;
  double samplesPerSecond = 0;  // mean over the steps after warm-up
  double testAccuracy = -1;     // -1 when no evaluation ran
  double testLoss = -1;
  double lastLoss = 0;
};

// The checks that need the model: every device's memory cap must hold the model's parameters and
// their gradients, and caps need the memory accounting (train/device_memory.h, checkDeviceMemory).
// Throws ConfigError naming devices[i].memory. Run before any rank starts.
void checkModelFits(const RunConfig& config);

// Runs the whole training as `comm->rank()`; the communicator's ranks are config.devices in order.
TrainResult train(const RunConfig& config, std::shared_ptr<comm::Communicator> comm,
                  const TrainerOptions& options);

}  // namespace hetra::train
