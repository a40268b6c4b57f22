#include <gtest/gtest.h>

#include <random>

#include "train/sampler.h"

namespace hetra::train {
namespace {

// Random splits of B over `ranks` (zeros allowed).
std::vector<int64_t> randomSplit(std::mt19937& rng, int ranks, int64_t batch) {
  std::vector<int64_t> cuts = {0, batch};
  for (int r = 0; r < ranks - 1; ++r) cuts.push_back(int64_t(rng() % uint64_t(batch + 1)));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> out;
  for (size_t i = 1; i < cuts.size(); ++i) out.push_back(cuts[i] - cuts[i - 1]);
  return out;
}

TEST(Sampler, EverySampleOncePerEpochWhateverTheSplits) {
  std::mt19937 rng(1);
  for (int64_t n : {1, 7, 100, 1001}) {
    for (int64_t batch : {1, 3, 64}) {
      GlobalSampler sampler(n, batch, 99);
      const int ranks = 1 + int(rng() % 5);
      const int64_t steps = sampler.stepsFor(3.0) + 2;
      std::vector<int> seen(size_t(n), 0);
      std::vector<int64_t> stream;
      for (int64_t step = 0; step < steps; ++step) {
        const auto split = randomSplit(rng, ranks, batch);
        for (int r = 0; r < ranks; ++r)
          for (int64_t index : sampler.indices(step, split, r)) stream.push_back(index);
      }
      ASSERT_EQ(int64_t(stream.size()), steps * batch);
      // Each full epoch of the stream is a permutation of the dataset.
      for (int64_t epoch = 0; (epoch + 1) * n <= int64_t(stream.size()); ++epoch) {
        std::fill(seen.begin(), seen.end(), 0);
        for (int64_t i = epoch * n; i < (epoch + 1) * n; ++i) ++seen[size_t(stream[size_t(i)])];
        for (int count : seen)
          ASSERT_EQ(count, 1) << "n=" << n << " B=" << batch << " epoch " << epoch;
      }
    }
  }
}

TEST(Sampler, StreamDoesNotDependOnTheSplit) {
  GlobalSampler a(500, 37, 5), b(500, 37, 5);
  for (int64_t step = 0; step < 40; ++step) {
    std::vector<int64_t> streamA, streamB;
    for (int r = 0; r < 3; ++r)
      for (auto i : a.indices(step, {10, 20, 7}, r)) streamA.push_back(i);
    for (int r = 0; r < 2; ++r)
      for (auto i : b.indices(step, {36, 1}, r)) streamB.push_back(i);
    ASSERT_EQ(streamA, streamB) << "step " << step;
  }
}

TEST(Sampler, DeterministicBySeedAndShuffledPerEpoch) {
  GlobalSampler a(1000, 1000, 3), b(1000, 1000, 3), c(1000, 1000, 4);
  const auto e0 = a.indices(0, {1000}, 0);
  EXPECT_EQ(e0, b.indices(0, {1000}, 0));
  EXPECT_NE(e0, c.indices(0, {1000}, 0));
  EXPECT_NE(e0, a.indices(1, {1000}, 0)) << "each epoch has its own order";
}

}  // namespace
}  // namespace hetra::train
