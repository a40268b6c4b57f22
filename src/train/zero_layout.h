// The flat parameter space of ZeRO (train/zero_parallel.h) and its shards.
//
// Vocabulary:
//   flat space  the trainable float32 parameters one after the other (a BlockModel's in block
//               order), psi elements: element e of tensor k is flat index tensor(k).begin + e.
//   shard       rank r's contiguous range of the flat space. Shards follow rank order and cover
//               it; one may be empty, and a boundary may fall inside a tensor. Every boundary
//               but psi, the end, is a multiple of kShardAlign elements, so each shard starts on a
//               cache line and a vector of the one-pass optimizer loops.
//   piece       a shard's part of a range (a tensor, a block): what that rank contributes to, or
//               receives from, the range's reduce-scatter or allgather.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hetra::train {

constexpr int64_t kShardAlign = 16;  // float32 elements: 64 bytes

struct FlatRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const FlatRange&) const = default;
};

FlatRange intersect(FlatRange a, FlatRange b);

class ShardLayout {
 public:
  // `tensorSizes` in flat order; `shardSizes` one per rank, summing to the flat space (ConfigError
  // otherwise) with aligned boundaries.
  ShardLayout(const std::vector<int64_t>& tensorSizes, const std::vector<int64_t>& shardSizes);

  int64_t total() const { return total_; }
  int ranks() const { return int(shardBegin_.size()) - 1; }
  size_t tensors() const { return tensorBegin_.size() - 1; }
  FlatRange shard(int rank) const;
  FlatRange tensor(size_t k) const;
  std::vector<int64_t> shardSizes() const;
  // Each rank's piece of `range`, as element counts: the counts of its reduce-scatter or
  // allgather (they sum to range.size()).
  std::vector<size_t> countsOf(FlatRange range) const;

 private:
  int64_t total_ = 0;
  std::vector<int64_t> tensorBegin_;  // tensors() + 1 entries, the last = total_
  std::vector<int64_t> shardBegin_;   // ranks() + 1 entries, the last = total_
};

// Tensors updated and all-gathered together (ZeRO stage 1's overlapped step): runs of
// consecutive tensors in reverse flat order, the order backward produces their gradients, each
// closed once it holds at least `atLeast` elements (the last may hold fewer).
struct TensorGroup {
  FlatRange range;
  size_t firstTensor = 0, endTensor = 0;  // its tensors: [firstTensor, endTensor)
};
std::vector<TensorGroup> tensorGroups(const ShardLayout& layout, int64_t atLeast);
// The default: 64 Ki elements (256 KiB, DataParallel's direct buckets).
constexpr int64_t kTensorGroupElements = int64_t(1) << 16;

// Shard sizes for `total` elements in proportion to `weights` (>= 0, one per rank; all zero: even):
// boundary r is total * (w_0 + ... + w_{r-1}) / (w_0 + ... + w_{n-1}) rounded to the nearest
// multiple of kShardAlign, the last rank with a weight ends at total. A rank of weight zero gets an
// empty shard, as may a rank whose share is below kShardAlign / 2 elements.
std::vector<int64_t> proportionalShards(int64_t total, const std::vector<double>& weights);

}  // namespace hetra::train
