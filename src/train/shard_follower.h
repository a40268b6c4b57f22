// Shards that follow the devices' measured speed, within what memory gives them (docs/zero.md,
// "Shards that follow speed").
//
// Between a step's reduce-scatter and its parameter all-gather every rank updates its own shard,
// and the all-gather waits for the last of them: that wait is max_r(shard_r x t_r), t_r the
// seconds rank r's optimizer takes per shard element. The balancer cannot shorten it, since the
// batch split comes before the reduce-scatter; the shard sizes can. Shards in proportion to 1/t_r
// make every rank's update equally long, the shortest that wait can be. Memory bounds them: a
// device with a cap never gets a larger shard than its memory plan (train/zero_plan.h) gave it,
// so the micro-batch caps planned from that shard still hold.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace hetra::train {

constexpr int64_t kUnboundedShard = std::numeric_limits<int64_t>::max();

// Shard sizes for `total` elements (aligned, as proportionalShards) that make the updates equally
// long, rank r's at most bounds[r] elements (kUnboundedShard: no bound): water-filling, the ranks
// that reach their bound keep it and the others share the rest by speed. nullopt where the
// bounds cannot hold `total`, or where alignment would push a bounded rank past its bound.
std::optional<std::vector<int64_t>> speedShards(int64_t total,
                                                const std::vector<double>& secondsPerElement,
                                                const std::vector<int64_t>& bounds);

class ShardFollower {
 public:
  // Proposes one move, once every rank has `window` measurements, and only if it shortens the
  // slowest rank's predicted update by at least `minGain` (a fraction): moving the shards' state
  // costs a gather of it. Only one: a rank's seconds per element are not constant in its shard's
  // size (a small shard's update has fixed costs that weigh more), so a second move predicted
  // from the first one's measurements would shrink a slow rank's shard further each time.
  ShardFollower(std::vector<int64_t> bounds, int window = 3, double minGain = 0.1);

  // Rank r's optimizer step updated `elements` shard elements in `seconds` of its device's
  // compute. An empty shard measures nothing.
  void observe(int rank, int64_t elements, double seconds);
  // New shard sizes for the current ones (same total), or nullopt to keep them. Every rank that
  // observed the same measurements gets the same answer.
  std::optional<std::vector<int64_t>> proposal(const std::vector<int64_t>& current) const;
  // The shards moved: nothing more is proposed.
  void resharded() { moved_ = true; }

  // Rank r's seconds per shard element, the median of its recent measurements (0: unknown).
  double secondsPerElement(int rank) const;

 private:
  std::vector<int64_t> bounds_;
  int window_;
  double minGain_;
  std::vector<std::vector<double>> recent_;  // per rank, up to window_ seconds per element
  bool moved_ = false;
};

}  // namespace hetra::train
