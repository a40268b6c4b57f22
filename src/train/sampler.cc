#include "train/sampler.h"

#include <cmath>
#include <numeric>
#include <random>

#include "common/errors.h"

namespace hetra::train {

GlobalSampler::GlobalSampler(int64_t datasetSize, int64_t globalBatch, uint64_t seed)
    : datasetSize_(datasetSize), globalBatch_(globalBatch), seed_(seed) {
  if (datasetSize < 1) throw ConfigError(str("the dataset is empty (", datasetSize, " samples)"));
  if (globalBatch < 1)
    throw ConfigError(
        str("train.global_batch = ", globalBatch, " is not allowed; it must be at least 1"));
}

int64_t GlobalSampler::stepsFor(double epochs) const {
  return int64_t(std::ceil(epochs * double(datasetSize_) / double(globalBatch_)));
}

const std::vector<int64_t>& GlobalSampler::permutation(int64_t epoch) {
  if (epoch != cachedEpoch_) {
    cached_.resize(size_t(datasetSize_));
    std::iota(cached_.begin(), cached_.end(), int64_t(0));
    // Fisher-Yates with a generator of our own: std::shuffle's algorithm is not fixed by the
    // standard, and the order must not depend on the standard library.
    std::mt19937_64 rng(seed_ * 0x9e3779b97f4a7c15ull + uint64_t(epoch));
    for (int64_t i = datasetSize_ - 1; i > 0; --i) {
      const int64_t j = int64_t(rng() % uint64_t(i + 1));
      std::swap(cached_[size_t(i)], cached_[size_t(j)]);
    }
    cachedEpoch_ = epoch;
  }
  return cached_;
}

std::vector<int64_t> GlobalSampler::indices(int64_t step, const std::vector<int64_t>& batches,
                                            int rank) {
  HETRA_ENFORCE(rank >= 0 && size_t(rank) < batches.size(), "rank ", rank, " has no batch entry");
  HETRA_ENFORCE_EQ(std::accumulate(batches.begin(), batches.end(), int64_t(0)), globalBatch_,
                   "per-rank batches must sum to the global batch");
  int64_t position = step * globalBatch_;
  for (int r = 0; r < rank; ++r) position += batches[size_t(r)];
  std::vector<int64_t> out;
  out.reserve(size_t(batches[size_t(rank)]));
  std::lock_guard<std::mutex> lock(mutex_);
  for (int64_t k = 0; k < batches[size_t(rank)]; ++k, ++position) {
    const auto& perm = permutation(position / datasetSize_);
    out.push_back(perm[size_t(position % datasetSize_)]);
  }
  return out;
}

}  // namespace hetra::train
