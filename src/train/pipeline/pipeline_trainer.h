// Training with the model's blocks split into pipeline stages ([parallel] pipeline = P): rank r
// holds stage r, every step pushes parallel.chunks micro-batches through the stages on the 1F1B
// schedule (schedule.h), and each stage's optimizer updates its own blocks.
//
// The run starts with a short profile (profile.h) of every block on every rank's device; the
// ranks all-gather the numbers and each computes the same partition (balance/pipeline_partition.h)
// from them, so no rank decides for the others. Every rank builds the whole model (same seed, in
// host memory, so equal everywhere), keeps its stage's blocks as device memory and frees the rest.
//
// Evaluation pushes the test set through the stages forward only. Not yet: several pipelines as
// data-parallel replicas, checkpoints, gradient clipping, re-partitioning (config validation
// refuses what a pipeline cannot do).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "train/config.h"
#include "train/trainer.h"

namespace hetra::train::pipeline {

// train() for config.parallel.pipeline > 1; the communicator's size must be the pipeline's.
TrainResult train(const RunConfig& config, std::shared_ptr<comm::Communicator> comm,
                  const TrainerOptions& options);

// What `hetra run --print-config` says of a pipeline: the partition chosen from a profile of one
// chunk on this host, each device's time the profile's times its slowdown, and the predicted 1F1B
// step time of it and of an even partition, as TOML comment lines. "" when pipeline = 1.
std::string predictedPipeline(const RunConfig& config);

}  // namespace hetra::train::pipeline
