// The global sample order and each rank's slice of a step.
//
// Vocabulary: the *stream* is the concatenation of one seeded permutation of the dataset per epoch;
// step s takes stream positions [s*B, (s+1)*B) (B = global batch), so a step may straddle two
// epochs and B never changes. Rank i takes the contiguous sub-range of that step that starts after
// the batches of ranks 0..i-1. Whatever the per-rank batches are, every sample is used exactly once
// per epoch, and the order depends only on the seed.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace hetra::train {

class GlobalSampler {
 public:
  GlobalSampler(int64_t datasetSize, int64_t globalBatch, uint64_t seed);

  // Dataset indices of `rank` at `step`; batches[r] is rank r's share (they sum to the global
  // batch).
  std::vector<int64_t> indices(int64_t step, const std::vector<int64_t>& batches, int rank);

  int64_t datasetSize() const { return datasetSize_; }
  int64_t globalBatch() const { return globalBatch_; }
  // Epoch (possibly fractional) reached after `steps` steps.
  double epochsAfter(int64_t steps) const {
    return double(steps * globalBatch_) / double(datasetSize_);
  }
  // Steps needed to cover `epochs` full passes (the last step may reach into the next epoch).
  int64_t stepsFor(double epochs) const;

 private:
  const std::vector<int64_t>& permutation(int64_t epoch);

  int64_t datasetSize_;
  int64_t globalBatch_;
  uint64_t seed_;
  std::mutex mutex_;
  int64_t cachedEpoch_ = -1;
  std::vector<int64_t> cached_;
};

}  // namespace hetra::train
