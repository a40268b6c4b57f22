// ZeRO's plan for a run (docs/zero.md): what each rank holds under the config's [zero] stage, each
// rank's shard ("memory": by the device's headroom; "even"), and the micro-batch caps that
// follow from what the shard leaves of each device's memory.
#pragma once

#include <cstdint>
#include <vector>

#include "balance/balancer.h"
#include "train/config.h"

namespace hetra::train {

class Model;

// Device bytes of one rank under a stage, besides activations (fp32; K optimizer state bytes per
// parameter; psi parameters; f its shard's fraction):
//   stage 1: replicated 8 psi (parameters, gradients),       perElement K
//   stage 2: replicated 4 psi (parameters),                 perElement 4 + K, buffers: the
//            largest tensor's gradient, alive until its reduce-scatter
//   stage 3: replicated 0,                                  perElement 8 + K, buffers: the
//            gathered parameters of the largest block (zero.prefetch: of the largest two
//            adjacent blocks, gathered at once) and the largest block's gradients
// so a rank's peak is replicated + buffers + perElement * f * psi (+ activations).
struct ShardedBytes {
  int64_t psi = 0;  // trainable parameters: the flat space's elements
  int64_t replicated = 0;
  int64_t buffers = 0;
  int64_t perElement = 0;
  int64_t fixedFor(int64_t shardElements) const {
    return replicated + buffers + perElement * shardElements;
  }
};

// The bytes of config.zero.stage (>= 1) for `model`'s trainable parameters and blocks.
ShardedBytes shardedBytesOf(const RunConfig& config, Model& model);

// Each rank's shard of `total` elements. "even": equal. "memory": in proportion to each device's
// headroom, cap - replicated - buffers - one sample's activations (bytesPerSample): every device
// keeps the same fraction of its headroom for larger micro-batches. A device without a cap counts
// with the largest headroom of those with one (all without: even); a device with no headroom
// gets an empty shard.
std::vector<int64_t> planShards(const RunConfig& config, const ShardedBytes& bytes, int64_t total,
                                int64_t bytesPerSample);

// The balancer's micro-batch caps under the plan: what the cap leaves after the rank's fixed
// bytes, in samples of bytesPerSample (at least 1: a device that cannot hold even that fails in
// its allocator, with DeviceOutOfMemoryError), and devices[i].max_micro_batch.
std::vector<balance::RankCaps> shardedRankCaps(const RunConfig& config, const ShardedBytes& bytes,
                                               const std::vector<int64_t>& shardSizes,
                                               int64_t bytesPerSample);

}  // namespace hetra::train
