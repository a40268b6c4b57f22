#include "train/zero_plan.h"

#include <algorithm>

#include "balance/memory_caps.h"
#include "train/device_memory.h"
#include "train/models.h"
#include "train/shard_follower.h"
#include "train/zero_layout.h"
#include "train/zero_parallel.h"

namespace hetra::train {

ShardedBytes shardedBytesOf(const RunConfig& config, Model& model) {
  const auto params = flatParameters(model);
  int64_t psi = 0, largestTensor = 0, largestBlock = 0, largestPair = 0, fedBack = 0;
  // Compressed gradients with error feedback keep a residual of each tensor whose reduce-scatter
  // is compressed (at least comm.compression_min_bytes), whole, on every rank: at most 4 psi
  // (less where a hierarchy compresses only between islands and keeps none).
  const bool feedback = config.comm.compression != "none" && config.comm.errorFeedback;
  for (const auto& p : params) {
    psi += p.numel();
    largestTensor = std::max(largestTensor, p.numel());
    if (feedback && 4 * p.numel() >= config.comm.compressionMinBytes) fedBack += p.numel();
  }
  int64_t previous = 0;
  if (auto* blocks = dynamic_cast<BlockModel*>(&model))
    for (size_t b = 0; b < blocks->blockCount(); ++b) {
      int64_t elements = 0;
      for (const auto& p : blocks->blockParameters(b))
        if (p.requires_grad()) elements += p.numel();
      largestBlock = std::max(largestBlock, elements);
      largestPair = std::max(largestPair, elements + previous);  // prefetch: b and b-1 at once
      previous = elements;
    }
  ShardedBytes bytes;
  bytes.psi = psi;
  bytes.optimizer = 4 * optimizerStateCopies(config.train.optimizer, config.train.momentum);
  switch (config.zero.stage) {
    case 1:
      bytes.replicated = 8 * psi;
      break;
    case 2:
      bytes.replicated = 4 * psi;
      bytes.buffers = 4 * largestTensor;
      bytes.sharded = 4;
      break;
    default:
      // The gathered blocks (with prefetch the running one and the next) and one block's whole
      // gradient.
      bytes.buffers = 4 * (config.zero.prefetch ? largestPair : largestBlock) + 4 * largestBlock;
      bytes.sharded = 8;
  }
  bytes.replicated += 4 * fedBack;
  return bytes;
}

int64_t ShardedBytes::onDevicePerElement(Offload offload) const {
  switch (offload) {
    case Offload::kOptimizer:
      return sharded;
    case Offload::kParameters:
      return 0;
    default:
      return sharded + optimizer;
  }
}

Offload offloadOf(const RunConfig& config, size_t rank) {
  const std::string& own = config.devices.at(rank).offload;
  return parseOffload(own.empty() ? config.zero.offload : own);
}

std::vector<int64_t> planShards(const RunConfig& config, const ShardedBytes& bytes, int64_t total,
                                int64_t bytesPerSample) {
  const size_t ranks = config.devices.size();
  if (config.zero.shards == "even") return proportionalShards(total, std::vector<double>(ranks, 1));
  std::vector<double> elements(ranks, -1);  // -1: not bounded by the device's memory
  double largest = 0;
  for (size_t r = 0; r < ranks; ++r) {
    const int64_t cap = config.devices[r].memoryBytes;
    const int64_t perElement = bytes.onDevicePerElement(offloadOf(config, r));
    if (cap == 0 || perElement == 0) continue;
    const int64_t headroom = cap - bytes.replicated - bytes.buffers - bytesPerSample;
    elements[r] = double(std::max<int64_t>(0, headroom)) / double(perElement);
    largest = std::max(largest, elements[r]);
  }
  for (double& e : elements)
    if (e < 0) e = largest > 0 ? largest : 1;
  return proportionalShards(total, elements);
}

std::vector<int64_t> memoryBounds(const RunConfig& config, const ShardedBytes& bytes,
                                  const std::vector<int64_t>& shardSizes) {
  std::vector<int64_t> bounds;
  for (size_t r = 0; r < config.devices.size(); ++r) {
    const bool capped =
        config.devices[r].memoryBytes > 0 && bytes.onDevicePerElement(offloadOf(config, r)) > 0;
    bounds.push_back(capped ? shardSizes.at(r) : kUnboundedShard);
  }
  return bounds;
}

std::vector<balance::RankCaps> shardedRankCaps(const RunConfig& config, const ShardedBytes& bytes,
                                               const std::vector<int64_t>& shardSizes,
                                               int64_t bytesPerSample) {
  std::vector<balance::RankCaps> caps;
  for (size_t r = 0; r < config.devices.size(); ++r) {
    const auto& device = config.devices[r];
    balance::RankCaps c;
    if (device.memoryBytes > 0 && bytesPerSample > 0)
      c.maxMicroBatch = std::max<int64_t>(
          1, balance::maxMicroBatch(device.memoryBytes,
                                    bytes.fixedFor(shardSizes.at(r), offloadOf(config, r)),
                                    bytesPerSample));
    if (device.maxMicroBatch > 0) c.maxMicroBatch = std::min(c.maxMicroBatch, device.maxMicroBatch);
    caps.push_back(c);
  }
  return caps;
}

std::vector<ShardPlanRow> shardPlanRows(const RunConfig& config, const ShardedBytes& bytes,
                                        const std::vector<int64_t>& shardSizes,
                                        const std::vector<balance::RankCaps>& caps) {
  std::vector<ShardPlanRow> rows;
  for (size_t r = 0; r < config.devices.size(); ++r) {
    ShardPlanRow row;
    row.device = config.devices[r].name;
    row.capBytes = config.devices[r].memoryBytes;
    row.shardElements = shardSizes.at(r);
    row.offload = offloadOf(config, r);
    row.deviceBytes = bytes.fixedFor(row.shardElements, row.offload);
    row.offloadedBytes = bytes.offloadedPerElement(row.offload) * row.shardElements;
    row.maxMicroBatch = caps.at(r).maxMicroBatch;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace hetra::train
