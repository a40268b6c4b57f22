// Training with the model's blocks split into pipeline stages ([parallel] pipeline = P): the
// devices form R = devices / P pipelines, pipeline j of devices [j P, (j + 1) P), its device i
// holding stage i. Every step each pipeline pushes its share of the global batch as up to
// parallel.chunks micro-batches through its stages on the 1F1B schedule (schedule.h); then the
// replicas of each stage sum their gradients and update (stage_update.h: each its optimizer, or
// ZeRO-1 over the replicas).
//
// The run starts with a short profile (profile.h) of every block on every rank's device; the
// ranks all-gather the numbers and each computes the same partition (balance/pipeline_partition.h)
// from them, so no rank decides for the others. Every pipeline has the same partition (a stage's
// replicas hold the same blocks, so their gradients add up tensor by tensor): stage i is sized for
// the slowest, and the smallest memory, of the devices at position i of the pipelines. Every rank
// builds the whole model (same seed, in host memory, so equal everywhere), keeps its stage's
// blocks as device memory and frees the rest.
//
// With R > 1 the pipelines are the balancer's devices (balance/balancer.h): each step's measured
// pipeline time (the slowest of its stages' schedules) at the pipeline's share feeds the same
// Balancer on every rank, which moves samples from the slower pipelines to the faster ones. The
// profile and the memory check take a chunk of the whole batch (B / chunks samples), what one
// pipeline's chunk can grow to, so no share the balancer picks exceeds a device's memory.
//
// Evaluation pushes the test set through the stages forward only, each pipeline a contiguous part
// of it. Not yet: checkpoints, gradient clipping, re-partitioning, tensor parallelism inside a
// pipeline (config validation refuses what a pipeline cannot do).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "train/config.h"
#include "train/trainer.h"

namespace hetra::train::pipeline {

// train() for config.parallel.pipeline > 1; the communicator's ranks are config.devices, a
// multiple of parallel.pipeline.
TrainResult train(const RunConfig& config, std::shared_ptr<comm::Communicator> comm,
                  const TrainerOptions& options);

// What `hetra run --print-config` says of a pipeline: the partition chosen from a profile of one
// chunk on this host, each device's time the profile's times its slowdown, and the predicted 1F1B
// step time of it and of an even partition, as TOML comment lines. "" when pipeline = 1.
std::string predictedPipeline(const RunConfig& config);

}  // namespace hetra::train::pipeline
