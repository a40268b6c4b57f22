// The run configuration translated into each component's own spec. The components (models,
// datasets, optimizers, the balancer) never read a RunConfig, so tests and programs build them
// without one; this is the one place that knows which config key feeds which field.
#pragma once

#include <cstdint>
#include <vector>

#include "balance/balancer.h"
#include "train/config.h"
#include "train/dataset_geometry.h"
#include "train/datasets.h"
#include "train/models.h"
#include "train/optim.h"

namespace hetra::train {

// The model config.model names, for samples of `geometry` (datasetGeometry(config.data), known
// without loading the data, or a program's own dataset's).
ModelSpec modelSpecOf(const RunConfig& config, const DatasetGeometry& geometry);
DataSpec dataSpecOf(const RunConfig& config);
OptimSpec optimSpecOf(const TrainConfig& train);
LrScheduleSpec scheduleSpecOf(const TrainConfig& train, int64_t totalSteps);
balance::BalancerOptions balancerOptionsOf(const RunConfig& config);
// Per device: the memory cap bounds the micro-batch when the model's footprint is known
// (bytesPerSample > 0; a custom model's is not), and so does devices[i].max_micro_batch.
std::vector<balance::RankCaps> rankCapsOf(const RunConfig& config,
                                          const MemoryFootprint& footprint);

}  // namespace hetra::train
