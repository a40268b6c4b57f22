#include "train/specs.h"

#include <algorithm>

namespace hetra::train {

ModelSpec modelSpecOf(const RunConfig& config, const DatasetGeometry& geometry) {
  ModelSpec spec;
  spec.name = config.model.name;
  spec.sampleShape = geometry.sampleShape;
  spec.classes = geometry.classes;
  spec.hidden = config.model.hidden;
  spec.channels = config.model.channels;
  spec.layers = config.model.layers;
  spec.heads = config.model.heads;
  spec.dim = config.model.dim;
  spec.seqLen = config.model.seqLen;
  spec.seed = uint64_t(config.train.seed);
  spec.checkpointBlocks = config.train.activationCheckpointing == "blocks";
  return spec;
}

DataSpec dataSpecOf(const RunConfig& config) {
  return DataSpec{config.data, uint64_t(config.train.seed)};
}

OptimSpec optimSpecOf(const TrainConfig& train) {
  OptimSpec spec;
  spec.name = train.optimizer;
  spec.lr = train.lr;
  spec.momentum = train.momentum;
  spec.nesterov = train.nesterov;
  spec.weightDecay = train.weightDecay;
  spec.beta1 = train.betas.at(0);
  spec.beta2 = train.betas.at(1);
  spec.eps = train.eps;
  return spec;
}

LrScheduleSpec scheduleSpecOf(const TrainConfig& train, int64_t totalSteps) {
  LrScheduleSpec spec;
  spec.kind = train.lrSchedule;
  spec.lr = train.lr;
  spec.warmupSteps = train.warmupSteps;
  spec.totalSteps = totalSteps;
  return spec;
}

balance::BalancerOptions balancerOptionsOf(const RunConfig& config) {
  balance::BalancerOptions o;
  o.mode = balance::parseMode(config.balance.mode);
  o.globalBatch = config.train.globalBatch;
  o.rebalanceThreshold = config.balance.threshold;
  o.minStepsBetweenChanges = int(config.balance.minStepsBetween);
  o.persistSteps = int(config.balance.persistSteps);
  o.profileSteps = int(config.balance.profileSteps);
  // ZeRO-2/3 ranks that accumulate hold the whole gradient, which the shard plan does not reserve.
  o.sharesWithinCaps = config.zero.stage >= 2;
  // Only plain synchronous data parallelism runs without a rank: ZeRO's shards and periodic
  // averaging's rounds need every rank.
  o.leaveOut = config.balance.leaveOut && config.zero.stage == 0 && config.train.syncEvery == 1 &&
               config.parallel.pipeline == 1 && config.parallel.tensor == 1;
  return o;
}

std::vector<balance::RankCaps> rankCapsOf(const RunConfig& config,
                                          const MemoryFootprint& footprint) {
  std::vector<balance::RankCaps> caps;
  for (const auto& device : config.devices) {
    balance::RankCaps c;
    // The analytic footprint is the first guess only (it errs high): the measured activations
    // replace it after the first step (train/device_memory.h), so one sample is always tried.
    if (device.memoryBytes > 0 && footprint.bytesPerSample > 0)
      c.maxMicroBatch = std::max<int64_t>(1, maxMicroBatch(footprint, device.memoryBytes));
    if (device.maxMicroBatch > 0) c.maxMicroBatch = std::min(c.maxMicroBatch, device.maxMicroBatch);
    caps.push_back(c);
  }
  return caps;
}

}  // namespace hetra::train
