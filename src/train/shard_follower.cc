#include "train/shard_follower.h"

#include <algorithm>

#include "common/errors.h"
#include "train/zero_layout.h"

namespace hetra::train {

std::optional<std::vector<int64_t>> speedShards(int64_t total,
                                                const std::vector<double>& secondsPerElement,
                                                const std::vector<int64_t>& bounds) {
  const size_t ranks = secondsPerElement.size();
  HETRA_ENFORCE_EQ(bounds.size(), ranks, "one bound per rank");
  std::vector<double> target(ranks, 0.0);
  std::vector<bool> free(ranks);
  for (size_t r = 0; r < ranks; ++r) free[r] = secondsPerElement[r] > 0 && bounds[r] > 0;
  double left = double(total);
  // Each round shares what is left among the free ranks by speed; a rank whose share passes its
  // bound keeps the bound and leaves the pool. At most `ranks` rounds.
  for (bool clipped = true; clipped && left > 0;) {
    clipped = false;
    double speed = 0;
    for (size_t r = 0; r < ranks; ++r)
      if (free[r]) speed += 1.0 / secondsPerElement[r];
    if (speed == 0) return std::nullopt;  // the bounded ranks cannot hold the rest
    for (size_t r = 0; r < ranks; ++r) {
      if (!free[r]) continue;
      const double share = left / secondsPerElement[r] / speed;
      // Rounding the boundaries to kShardAlign moves each by at most half of it: a bounded
      // rank aims one alignment below its bound so that it ends within it.
      const double most = double(std::max<int64_t>(0, bounds[r] - kShardAlign));
      if (bounds[r] != kUnboundedShard && share > most) {
        target[r] = most;
        free[r] = false;
        clipped = true;
      }
    }
    if (!clipped) {
      for (size_t r = 0; r < ranks; ++r)
        if (free[r]) target[r] = left / secondsPerElement[r] / speed;
    } else {
      left = double(total);
      for (size_t r = 0; r < ranks; ++r)
        if (!free[r]) left -= target[r];
    }
  }
  auto sizes = proportionalShards(total, target);
  for (size_t r = 0; r < ranks; ++r)
    if (bounds[r] != kUnboundedShard && sizes[r] > bounds[r]) return std::nullopt;
  return sizes;
}

ShardFollower::ShardFollower(std::vector<int64_t> bounds, int window, double minGain)
    : bounds_(std::move(bounds)),
      window_(std::max(1, window)),
      minGain_(minGain),
      recent_(bounds_.size()) {}

void ShardFollower::observe(int rank, int64_t elements, double seconds) {
  const size_t r = size_t(rank);
  if (elements <= 0 || seconds <= 0) return;
  auto& recent = recent_.at(r);
  recent.push_back(seconds / double(elements));
  if (recent.size() > size_t(window_)) recent.erase(recent.begin());
}

double ShardFollower::secondsPerElement(int rank) const {
  auto recent = recent_.at(size_t(rank));
  if (recent.empty()) return 0;
  const auto middle = recent.begin() + long(recent.size() / 2);
  std::nth_element(recent.begin(), middle, recent.end());
  return *middle;
}

std::optional<std::vector<int64_t>> ShardFollower::proposal(
    const std::vector<int64_t>& current) const {
  HETRA_ENFORCE_EQ(current.size(), bounds_.size(), "one shard per rank");
  if (moved_) return std::nullopt;
  std::vector<double> perElement(current.size(), 0.0);
  int64_t total = 0;
  for (size_t r = 0; r < current.size(); ++r) {
    total += current[r];
    // A rank with an empty shard measures nothing and stays empty.
    if (current[r] == 0) continue;
    if (recent_[r].size() < size_t(window_)) return std::nullopt;
    perElement[r] = secondsPerElement(int(r));
  }
  const auto next = speedShards(total, perElement, bounds_);
  if (!next || *next == current) return std::nullopt;
  double now = 0, then = 0;  // the slowest rank's update, predicted
  for (size_t r = 0; r < current.size(); ++r) {
    now = std::max(now, double(current[r]) * perElement[r]);
    then = std::max(then, double((*next)[r]) * perElement[r]);
  }
  if (then > (1.0 - minGain_) * now) return std::nullopt;
  return next;
}

}  // namespace hetra::train
