#include "train/global_batch.h"

#include <limits>

#include "common/errors.h"
#include "device/memory_accounting.h"
#include "train/dataset_geometry.h"
#include "train/models.h"
#include "train/specs.h"
#include "train/zero_plan.h"

namespace hetra::train {

GlobalBatch globalBatchOf(const RunConfig& config, const std::vector<balance::RankCaps>& caps) {
  GlobalBatch batch;
  if (config.train.globalBatch > 0) {
    batch.samples = config.train.globalBatch;
    batch.text = std::to_string(batch.samples);
    return batch;
  }
  if (config.parallel.pipeline > 1)
    throw ConfigError(
        str("train.global_batch = 0 (from memory) is not supported with "
            "parallel.pipeline > 1 yet: set the global batch"));
  HETRA_ENFORCE_EQ(caps.size(), config.devices.size(), "one micro-batch cap per device");
  constexpr int64_t kNoBound = std::numeric_limits<int64_t>::max();
  std::string unbounded, list;
  for (size_t i = 0; i < caps.size(); ++i) {
    const int64_t cap = caps[i].maxMicroBatch;
    const std::string& name = config.devices[i].name;
    if (cap == kNoBound) {
      unbounded += str(unbounded.empty() ? "" : ", ", "devices[", i, "] (", name, ")");
      continue;
    }
    HETRA_ENFORCE_GE(cap, 1, "the micro-batch cap of devices[", i, "]");
    // Saturates rather than wraps: a sum this large is refused below.
    batch.samples = batch.samples > kNoBound - cap ? kNoBound : batch.samples + cap;
    batch.caps.push_back(cap);
    list += str(list.empty() ? "" : ", ", name, " ", cap);
  }
  if (!unbounded.empty())
    throw ConfigError(
        str("train.global_batch = 0 sums the devices' micro-batch caps, but these "
            "devices have none: ",
            unbounded,
            " (no devices[i].memory cap, or a model whose footprint is not known "
            "before it runs, as a program's own, and no devices[i].max_micro_batch); "
            "set devices[i].max_micro_batch for each, or train.global_batch > 0"));
  if (batch.samples == kNoBound)
    throw ConfigError(str("train.global_batch = 0: the devices' micro-batch caps (", list,
                          ") sum past what a step can hold; set train.global_batch > 0"));
  batch.fromMemory = true;
  batch.text = str(batch.samples, " = sum of the devices' micro-batch caps (", list,
                   "), one micro-batch each, from memory");
  return batch;
}

GlobalBatch resolveGlobalBatch(const RunConfig& config) {
  if (config.train.globalBatch > 0 || config.parallel.pipeline > 1)
    return globalBatchOf(config, {});
  const ModelSpec spec = modelSpecOf(config, datasetGeometry(config.data));
  const MemoryFootprint footprint = estimateFootprint(spec);
  if (config.zero.stage == 0) return globalBatchOf(config, rankCapsOf(config, footprint));
  // The trainer plans the shards of the model it built; this one is built alike, in host memory.
  device::MemoryScope host(device::MemoryCategory::kHostData);
  const auto model = makeModel(spec);
  const ShardedBytes bytes = shardedBytesOf(config, *model);
  const auto shards = planShards(config, bytes, bytes.psi, footprint.bytesPerSample);
  return globalBatchOf(config, shardedRankCaps(config, bytes, shards, footprint.bytesPerSample));
}

}  // namespace hetra::train
