#include "train/zero_layout.h"

#include <algorithm>
#include <cmath>

#include "common/errors.h"

namespace hetra::train {

std::vector<TensorGroup> tensorGroups(const ShardLayout& layout, int64_t atLeast) {
  HETRA_ENFORCE_GT(atLeast, 0, "elements a tensor group holds at least");
  std::vector<TensorGroup> groups;
  int64_t end = layout.total();
  size_t endTensor = layout.tensors();
  for (size_t k = endTensor; k-- > 0;) {
    const int64_t begin = layout.tensor(k).begin;
    if (end - begin >= atLeast || k == 0) {
      groups.push_back({{begin, end}, k, endTensor});
      end = begin;
      endTensor = k;
    }
  }
  return groups;
}

FlatRange intersect(FlatRange a, FlatRange b) {
  const int64_t begin = std::max(a.begin, b.begin), end = std::min(a.end, b.end);
  return end > begin ? FlatRange{begin, end} : FlatRange{begin, begin};
}

ShardLayout::ShardLayout(const std::vector<int64_t>& tensorSizes,
                         const std::vector<int64_t>& shardSizes) {
  tensorBegin_.push_back(0);
  for (int64_t n : tensorSizes) {
    HETRA_ENFORCE_GE(n, 0, "tensor size");
    tensorBegin_.push_back(tensorBegin_.back() + n);
  }
  total_ = tensorBegin_.back();
  if (shardSizes.empty()) throw ConfigError("ZeRO needs at least one shard");
  shardBegin_.push_back(0);
  for (size_t r = 0; r < shardSizes.size(); ++r) {
    if (shardSizes[r] < 0)
      throw ConfigError(str("shard ", r, " has ", shardSizes[r], " elements; it must be >= 0"));
    // The end of the parameters need not be aligned: the last non-empty shard ends there even
    // when empty shards follow it (a rank without headroom last in rank order).
    const int64_t end = shardBegin_.back() + shardSizes[r];
    if (end % kShardAlign != 0 && end != total_)
      throw ConfigError(
          str("shard ", r, " ends at element ", end, ", not a multiple of ", kShardAlign));
    shardBegin_.push_back(shardBegin_.back() + shardSizes[r]);
  }
  if (shardBegin_.back() != total_)
    throw ConfigError(
        str("the shards hold ", shardBegin_.back(), " elements, the parameters ", total_));
}

FlatRange ShardLayout::shard(int rank) const {
  HETRA_ENFORCE(rank >= 0 && rank < ranks(), "rank ", rank, " of ", ranks());
  return {shardBegin_[size_t(rank)], shardBegin_[size_t(rank) + 1]};
}

FlatRange ShardLayout::tensor(size_t k) const {
  HETRA_ENFORCE_LT(k, tensors(), "tensor index");
  return {tensorBegin_[k], tensorBegin_[k + 1]};
}

std::vector<int64_t> ShardLayout::shardSizes() const {
  std::vector<int64_t> sizes;
  for (int r = 0; r < ranks(); ++r) sizes.push_back(shard(r).size());
  return sizes;
}

std::vector<size_t> ShardLayout::countsOf(FlatRange range) const {
  std::vector<size_t> counts;
  for (int r = 0; r < ranks(); ++r) counts.push_back(size_t(intersect(shard(r), range).size()));
  return counts;
}

std::vector<int64_t> proportionalShards(int64_t total, const std::vector<double>& weights) {
  HETRA_ENFORCE(!weights.empty(), "no ranks to shard over");
  double sum = 0;
  for (double w : weights) {
    HETRA_ENFORCE(w >= 0 && std::isfinite(w), "shard weight ", w);
    sum += w;
  }
  std::vector<double> share = weights;
  if (sum == 0) {
    share.assign(weights.size(), 1.0);
    sum = double(weights.size());
  }
  std::vector<int64_t> sizes;
  int64_t previous = 0;
  double cumulative = 0;
  for (size_t r = 0; r < share.size(); ++r) {
    cumulative += share[r];
    int64_t boundary;
    if (share[r] == 0) {
      boundary = previous;
    } else if (cumulative >= sum) {
      boundary = total;  // the last rank with a share takes the rest
    } else {
      const double exact = double(total) * cumulative / sum;
      boundary = int64_t(std::llround(exact / double(kShardAlign))) * kShardAlign;
      boundary = std::clamp(boundary, previous, std::max(previous, total - total % kShardAlign));
    }
    sizes.push_back(boundary - previous);
    previous = boundary;
  }
  return sizes;
}

}  // namespace hetra::train
