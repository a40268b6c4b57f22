// train.global_batch = 0: the global batch from memory (docs/memory.md, "The global batch from
// memory"). The batch is the largest every device's memory can serve under the run's plan: the sum
// over the devices of each one's micro-batch cap (what its memory allows, with
// devices[i].max_micro_batch) times its accumulation steps. The config has no accumulation setting
// (the balancer accumulates only to cover a share beyond a cap), so that is one micro-batch per
// device. Every rank resolves it from the same config and the same caps, so all get one number.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "balance/balancer.h"
#include "train/config.h"

namespace hetra::train {

struct GlobalBatch {
  int64_t samples = 0;        // what the run trains with
  bool fromMemory = false;    // train.global_batch was 0
  std::vector<int64_t> caps;  // from memory: each device's micro-batch cap, in device order
  // From memory: "412 = sum of the devices' micro-batch caps (cpu0 300, cpu1 56, cpu2 56), one
  // micro-batch each, from memory"; else the number alone.
  std::string text;
};

// The run's global batch given the balancer's micro-batch caps under its plan (rankCapsOf for data
// parallelism, shardedRankCaps under ZeRO), one per device: config.train.global_batch when it is
// > 0, else the sum of the caps. ConfigError naming train.global_batch when it is 0 and a device
// has no bound (no memory cap, or a footprint that is not known, as a program's own model's, and no
// devices[i].max_micro_batch: INT64_MAX in `caps`), or under parallel.pipeline > 1.
GlobalBatch globalBatchOf(const RunConfig& config, const std::vector<balance::RankCaps>& caps);

// The same before any rank starts (hetra run, --print-config), with the caps computed as the
// trainer computes them for the config's own model: the analytic footprint (estimateFootprint) and,
// under ZeRO, the shard plan (planShards, shardedRankCaps). Builds the model in host memory when
// train.global_batch is 0; else returns it at once.
GlobalBatch resolveGlobalBatch(const RunConfig& config);

}  // namespace hetra::train
