#include "train/zero_plan.h"

#include <algorithm>

#include "balance/memory_caps.h"
#include "train/device_memory.h"
#include "train/models.h"
#include "train/zero_layout.h"
#include "train/zero_parallel.h"

namespace hetra::train {

ShardedBytes shardedBytesOf(const RunConfig& config, Model& model) {
  const auto params = flatParameters(model);
  int64_t psi = 0, largestTensor = 0, largestBlock = 0, largestPair = 0;
  for (const auto& p : params) {
    psi += p.numel();
    largestTensor = std::max(largestTensor, p.numel());
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
  const int64_t k = 4 * optimizerStateCopies(config.train.optimizer, config.train.momentum);
  ShardedBytes bytes;
  bytes.psi = psi;
  switch (config.zero.stage) {
    case 1:
      bytes.replicated = 8 * psi;
      bytes.perElement = k;
      break;
    case 2:
      bytes.replicated = 4 * psi;
      bytes.buffers = 4 * largestTensor;
      bytes.perElement = 4 + k;
      break;
    default:
      // The gathered blocks (with prefetch the running one and the next) and one block's whole
      // gradient.
      bytes.buffers = 4 * (config.zero.prefetch ? largestPair : largestBlock) + 4 * largestBlock;
      bytes.perElement = 8 + k;
  }
  return bytes;
}

std::vector<int64_t> planShards(const RunConfig& config, const ShardedBytes& bytes, int64_t total,
                                int64_t bytesPerSample) {
  const size_t ranks = config.devices.size();
  if (config.zero.shards == "even") return proportionalShards(total, std::vector<double>(ranks, 1));
  std::vector<double> headroom(ranks, -1);  // -1: no cap
  double largest = 0;
  for (size_t r = 0; r < ranks; ++r) {
    const int64_t cap = config.devices[r].memoryBytes;
    if (cap == 0) continue;
    headroom[r] =
        double(std::max<int64_t>(0, cap - bytes.replicated - bytes.buffers - bytesPerSample));
    largest = std::max(largest, headroom[r]);
  }
  for (double& h : headroom)
    if (h < 0) h = largest > 0 ? largest : 1;
  return proportionalShards(total, headroom);
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
          1, balance::maxMicroBatch(device.memoryBytes, bytes.fixedFor(shardSizes.at(r)),
                                    bytesPerSample));
    if (device.maxMicroBatch > 0) c.maxMicroBatch = std::min(c.maxMicroBatch, device.maxMicroBatch);
    caps.push_back(c);
  }
  return caps;
}

}  // namespace hetra::train
