// `hetra run` with [parallel] tensor = T (train/tensor_parallel.h): the devices in groups of T
// consecutive ones, each group one replica of the transformer with every layer's heads and MLP
// units split over its devices, the replicas data-parallel.
//
// Rank r is device r: replica j = r / T, tensor rank t = r % T. Two groups split from the world:
// the tensor group (replica j's ranks, where the layers' allreduces run) and the data-parallel
// group (the ranks of tensor rank t of every replica, where the gradients of their slices are
// all-reduced and the balancer splits the global batch over the replicas). Each rank then runs
// the data-parallel trainer (train/trainer.h) over its data-parallel group, on the devices of that
// group, with its slice of the model; the ranks of one replica take the same batch because their
// step reports are made alike (TrainerOptions::replicaGroup). Tensor rank 0's trainers report.
//
// The split: by each device's speed, measured at start as data parallelism's balancer would see
// it: the whole model's forward and backward of a few samples in a compute segment (so an emulated
// device's slowdown shows), the median of three after one warm-up, all-gathered over every rank;
// one split for every replica (their slices are all-reduced between them), from the slowest
// device of each tensor rank; or even (parallel.tensor_split).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "train/config.h"
#include "train/tensor_parallel.h"
#include "train/trainer.h"

namespace hetra::train {

TrainResult trainTensorParallel(const RunConfig& config, std::shared_ptr<comm::Communicator> world,
                                const TrainerOptions& options);

// What `hetra run --print-config` says of tensor parallelism: the split of heads and MLP units
// from each device's slowdown times a profile of the whole model on one thread of this host, and
// the predicted compute time of a replica's step under it and under an even split, as TOML
// comment lines. "" when parallel.tensor = 1.
std::string predictedTensorParallel(const RunConfig& config);

// The seconds this device takes for the whole model's forward and backward of `samples` samples,
// as its compute segments count them (device/compute_scope.h): the median of three after a
// warm-up.
double profileModelSeconds(const ModelSpec& spec, const DeviceConfig& device, int64_t samples);

}  // namespace hetra::train
