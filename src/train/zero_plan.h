// ZeRO's plan for a run (docs/zero.md): what each rank holds under the config's [zero] stage, each
// rank's shard ("memory": by the device's headroom; "even"), and the micro-batch caps that
// follow from what the shard leaves of each device's memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "balance/balancer.h"
#include "train/config.h"
#include "train/zero_offload.h"

namespace hetra::train {

class Model;

// Device bytes of one rank under a stage, besides activations (fp32; K optimizer state bytes per
// parameter; psi parameters; f its shard's fraction):
//   stage 1: replicated 8 psi (parameters, gradients),       per shard element K
//   stage 2: replicated 4 psi (parameters),                 per shard element 4 + K, buffers:
//            the largest tensor's gradient, alive until its reduce-scatter
//   stage 3: replicated 0,                                  per shard element 8 + K, buffers:
//            the gathered parameters of the largest block (zero.prefetch: of the largest two
//            adjacent blocks, gathered at once) and the largest block's gradients
// plus, with compressed gradients and error feedback, replicated 4 bytes per element of every
// compressed tensor (its residual, whole on every rank),
// so a rank's peak is replicated + buffers + perElement * f * psi (+ activations). What the
// rank offloads leaves the device for host memory: "optimizer" the K, "parameters" (stage 3)
// all 8 + K.
struct ShardedBytes {
  int64_t psi = 0;  // trainable parameters: the flat space's elements
  int64_t replicated = 0;
  int64_t buffers = 0;
  int64_t sharded = 0;    // bytes per shard element of parameters and gradients (stages 2, 3)
  int64_t optimizer = 0;  // K: bytes per shard element of optimizer state
  // Bytes per shard element on the device, and in host memory, of a rank offloading `offload`.
  int64_t onDevicePerElement(Offload offload) const;
  int64_t offloadedPerElement(Offload offload) const {
    return sharded + optimizer - onDevicePerElement(offload);
  }
  int64_t fixedFor(int64_t shardElements, Offload offload) const {
    return replicated + buffers + onDevicePerElement(offload) * shardElements;
  }
};

// devices[rank].offload, or [zero] offload where the device says nothing.
Offload offloadOf(const RunConfig& config, size_t rank);

// The bytes of config.zero.stage (>= 1) for `model`'s trainable parameters and blocks.
ShardedBytes shardedBytesOf(const RunConfig& config, Model& model);

// Each rank's shard of `total` elements. "even": equal. "memory": in proportion to the elements
// each device's headroom holds, (cap - replicated - buffers - one sample's activations
// (bytesPerSample)) / its bytes per shard element on the device: every device keeps the same
// fraction of its headroom for larger micro-batches. A device without a cap, or one that keeps no
// byte of its shard (everything offloaded), counts with the largest share of the others (all
// alike: even); a device with no headroom gets an empty shard.
std::vector<int64_t> planShards(const RunConfig& config, const ShardedBytes& bytes, int64_t total,
                                int64_t bytesPerSample);

// What a rank's shard may grow to when it follows speed (train/shard_follower.h): a device with a
// cap that keeps shard bytes on it no more than `shardSizes` (the memory plan's) gives it, any
// other kUnboundedShard.
std::vector<int64_t> memoryBounds(const RunConfig& config, const ShardedBytes& bytes,
                                  const std::vector<int64_t>& shardSizes);

// The balancer's micro-batch caps under the plan: what the cap leaves after the rank's fixed
// bytes, in samples of bytesPerSample (at least 1: a device that cannot hold even that fails in
// its allocator, with DeviceOutOfMemoryError), and devices[i].max_micro_batch.
std::vector<balance::RankCaps> shardedRankCaps(const RunConfig& config, const ShardedBytes& bytes,
                                               const std::vector<int64_t>& shardSizes,
                                               int64_t bytesPerSample);

// One rank's part of the plan, as the run's start reports it (train/report.h).
struct ShardPlanRow {
  std::string device;
  int64_t capBytes = 0;  // 0: no cap
  int64_t shardElements = 0;
  Offload offload = Offload::kNone;
  int64_t deviceBytes = 0;     // parameters, gradients, optimizer state and buffers on the device
  int64_t offloadedBytes = 0;  // the same in host memory
  int64_t maxMicroBatch = 0;   // the balancer's cap; 0: none
};

std::vector<ShardPlanRow> shardPlanRows(const RunConfig& config, const ShardedBytes& bytes,
                                        const std::vector<int64_t>& shardSizes,
                                        const std::vector<balance::RankCaps>& caps);

}  // namespace hetra::train
