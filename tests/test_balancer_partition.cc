// The pipeline partitioner on synthetic per-block costs: the balanced partition is optimal against
// an enumeration of every partition priced by the test's own reckoning of a 1F1B step, never has
// an empty stage, keeps every stage within its device's memory, and wins the cases an even split
// gets wrong (a heavy head, unequal devices: the issue's worked example). The tensor split of a
// layer's units by speed is optimal against an enumeration of every split too. The watch over a
// running pipeline re-partitions once when a device slows down for good, to the optimum of the new
// speeds, and never on stationary noise or a single outlier step.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "balance/pipeline_partition.h"
#include "balance/pipeline_rebalance.h"
#include "balance/tensor_split.h"
#include "common/errors.h"

namespace hetra::balance {
namespace {

// The issue's model of one 1F1B step, reckoned here from the block counts (not with the library's
// prefix sums or formula): the first chunk's path through every stage, then M - 1 periods of the
// slowest stage.
double referenceStep(const PipelineCosts& c, const std::vector<int64_t>& sizes) {
  double path = 0, slowest = 0;
  size_t block = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    double w = 0;
    for (int64_t k = 0; k < sizes[i]; ++k) w += c.seconds[i][block++];
    path += w;
    slowest = std::max(slowest, w);
  }
  return path + double(c.chunks - 1) * slowest;
}

bool referenceFits(const PipelineCosts& c, const std::vector<int64_t>& sizes) {
  const int stages = int(sizes.size());
  size_t block = 0;
  for (int i = 0; i < stages; ++i) {
    int64_t fixed = 0, activations = 0;
    for (int64_t k = 0; k < sizes[size_t(i)]; ++k, ++block) {
      fixed += c.fixedBytes[block];
      activations += c.activationBytes[block];
    }
    const int64_t inFlight = std::min<int64_t>(stages - i, c.chunks);
    // The stage's received input per chunk in flight, its output's gradient one at a time.
    const size_t first = block - size_t(sizes[size_t(i)]);
    const auto input = [&](size_t b) { return c.inputBytes.empty() ? 0 : c.inputBytes[b]; };
    if (first > 0) activations += input(first);
    if (block < c.fixedBytes.size()) fixed += input(block);
    const int64_t cap = c.memoryBytes[size_t(i)];
    if (cap > 0 && fixed + inFlight * activations > cap) return false;
  }
  return true;
}

// Every composition of the blocks into non-empty stages; the least reference step time of those
// that fit (infinity when none does).
double bruteForce(const PipelineCosts& c) {
  const int stages = int(c.seconds.size());
  const int64_t blocks = int64_t(c.fixedBytes.size());
  std::vector<int64_t> sizes(size_t(stages), 0);
  double best = std::numeric_limits<double>::infinity();
  std::function<void(int, int64_t)> rec = [&](int i, int64_t left) {
    if (i + 1 == stages) {
      sizes[size_t(i)] = left;
      if (left >= 1 && referenceFits(c, sizes)) best = std::min(best, referenceStep(c, sizes));
      return;
    }
    for (int64_t n = 1; n <= left - (stages - 1 - i); ++n) {
      sizes[size_t(i)] = n;
      rec(i + 1, left - n);
    }
  };
  rec(0, blocks);
  return best;
}

std::vector<int64_t> sizesOf(const Partition& p) {
  std::vector<int64_t> sizes;
  for (int i = 0; i < p.stages(); ++i) sizes.push_back(p.blocksOf(i));
  return sizes;
}

// Devices of the given speeds (block times 1 / speed) and blocks of equal cost, unlimited memory.
PipelineCosts equalBlocks(const std::vector<double>& speeds, int64_t blocks, int64_t chunks) {
  PipelineCosts c;
  for (double speed : speeds) {
    c.seconds.push_back(std::vector<double>(size_t(blocks), 1.0 / speed));
    c.memoryBytes.push_back(0);
  }
  c.fixedBytes.assign(size_t(blocks), 0);
  c.activationBytes.assign(size_t(blocks), 0);
  c.chunks = chunks;
  return c;
}

// Random devices, blocks and caps; a cap is a random fraction of what the whole model would need
// on that stage, so some cases are tight and some have no partition at all.
PipelineCosts randomCase(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> stagesOf(1, 4);
  const int stages = stagesOf(rng);
  std::uniform_int_distribution<int64_t> blocksOf(stages, 9);
  const int64_t blocks = blocksOf(rng);
  std::uniform_real_distribution<double> seconds(0.1, 5.0), speed(0.2, 1.0), share(0.2, 1.5);
  std::uniform_int_distribution<int64_t> bytes(1, 1000), chunks(1, 10);
  std::bernoulli_distribution capped(0.5);
  PipelineCosts c;
  c.chunks = chunks(rng);
  std::vector<double> base(static_cast<size_t>(blocks));
  for (auto& b : base) b = seconds(rng);
  for (int d = 0; d < stages; ++d) {
    const double s = speed(rng);
    std::vector<double> row;
    for (double b : base) row.push_back(b / s);
    c.seconds.push_back(std::move(row));
  }
  for (int64_t b = 0; b < blocks; ++b) {
    c.fixedBytes.push_back(bytes(rng));
    c.activationBytes.push_back(bytes(rng));
    c.inputBytes.push_back(bytes(rng) / 4);
  }
  int64_t whole = 0;
  for (int64_t b = 0; b < blocks; ++b)
    whole += c.fixedBytes[size_t(b)] + c.activationBytes[size_t(b)];
  for (int d = 0; d < stages; ++d)
    c.memoryBytes.push_back(capped(rng) ? int64_t(share(rng) * double(whole) / stages) + 1 : 0);
  return c;
}

TEST(PipelinePartition, BalancedIsOptimalAgainstEveryPartitionOnRandomCases) {
  std::mt19937_64 rng(20261201);
  int solved = 0, infeasible = 0;
  for (int round = 0; round < 400; ++round) {
    const PipelineCosts c = randomCase(rng);
    const double best = bruteForce(c);
    if (best == std::numeric_limits<double>::infinity()) {
      EXPECT_THROW(partitionBalanced(c), ConfigError) << "round " << round;
      ++infeasible;
      continue;
    }
    const Partition p = partitionBalanced(c);
    const auto sizes = sizesOf(p);
    EXPECT_NEAR(referenceStep(c, sizes), best, 1e-9 * best) << "round " << round;
    EXPECT_NEAR(p.stepSeconds, best, 1e-9 * best) << "round " << round;
    EXPECT_TRUE(referenceFits(c, sizes)) << "round " << round;
    for (int64_t n : sizes) EXPECT_GE(n, 1) << "round " << round;
    ++solved;
  }
  // The generator covers both kinds of case.
  EXPECT_GT(solved, 100);
  EXPECT_GT(infeasible, 5);
}

TEST(PipelinePartition, NeverAnEmptyStageEvenWhenOneBlockDominates) {
  // One block far heavier than the rest pulls every other block away from its stage; an optimiser
  // of the slowest stage alone would leave stages empty (DeepSpeed PR #4312). Ours may not.
  for (int64_t blocks = 3; blocks <= 8; ++blocks) {
    PipelineCosts c = equalBlocks({1, 1, 1}, blocks, 4);
    for (auto& row : c.seconds) row[size_t(blocks / 2)] = 1000;
    const Partition p = partitionBalanced(c);
    ASSERT_EQ(p.stages(), 3);
    for (int i = 0; i < 3; ++i) EXPECT_GE(p.blocksOf(i), 1) << blocks << " blocks";
    EXPECT_EQ(p.bounds.front(), 0);
    EXPECT_EQ(p.bounds.back(), blocks);
  }
}

TEST(PipelinePartition, MoreStagesThanBlocksIsAConfigError) {
  const PipelineCosts c = equalBlocks({1, 1, 1}, 2, 4);
  try {
    partitionBalanced(c);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.pipeline = 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("only 2 blocks"), std::string::npos) << e.what();
  }
  EXPECT_THROW(partitionEven(c), ConfigError);
}

TEST(PipelinePartition, MemoryCapsMoveBlocksOffASmallDevice) {
  // Two equal devices, 6 equal blocks: unconstrained the balanced split is (3, 3). Stage 0 holds
  // 2 chunks' activations, stage 1 one; a cap on device 0 that holds only 2 blocks' worth forces
  // (2, 4).
  PipelineCosts c = equalBlocks({1, 1}, 6, 4);
  c.fixedBytes.assign(6, 100);
  c.activationBytes.assign(6, 10);
  EXPECT_EQ(sizesOf(partitionBalanced(c)), (std::vector<int64_t>{3, 3}));
  c.memoryBytes[0] = 2 * 100 + 2 * 2 * 10;  // two blocks, two chunks in flight
  const Partition p = partitionBalanced(c);
  EXPECT_EQ(sizesOf(p), (std::vector<int64_t>{2, 4}));
  EXPECT_LE(p.stageBytes[0], c.memoryBytes[0]);
  EXPECT_EQ(p.stageBytes[0], 240);
  EXPECT_EQ(p.stageBytes[1], 4 * 100 + 1 * 4 * 10);
  // The even split does not fit that cap: refused, naming the keys.
  try {
    partitionEven(c);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("devices[i].memory"), std::string::npos) << e.what();
  }
  c.memoryBytes[0] = 100;  // not even one block with its activations
  EXPECT_THROW(partitionBalanced(c), ConfigError);
}

TEST(PipelinePartition, HeavyHeadGetsAStageOfItsOwn) {
  // DeepSpeed#2974: the head (vocabulary projection) costs as much as several layers; an even
  // split puts it on a stage with as many layers as the others and that stage sets the pace.
  PipelineCosts c = equalBlocks({1, 1, 1}, 9, 8);
  for (auto& row : c.seconds) row.back() = 4;  // 8 layers of 1, a head of 4
  const Partition even = partitionEven(c);
  const Partition balanced = partitionBalanced(c);
  EXPECT_EQ(sizesOf(even), (std::vector<int64_t>{3, 3, 3}));
  EXPECT_DOUBLE_EQ(even.stepSeconds, 12 + 7 * 6.0);  // w = (3, 3, 6)
  EXPECT_EQ(sizesOf(balanced), (std::vector<int64_t>{4, 4, 1}));
  EXPECT_DOUBLE_EQ(balanced.stepSeconds, 12 + 7 * 4.0);  // w = (4, 4, 4)
  EXPECT_DOUBLE_EQ(balanced.stepSeconds, bruteForce(c));
}

TEST(PipelinePartition, TheIssuesWorkedExample) {
  // Speeds 1, 1/2, 1/4 (block times 1, 2, 4), 14 equal blocks, 8 chunks.
  const PipelineCosts c = equalBlocks({1, 0.5, 0.25}, 14, 8);
  const Partition even = partitionBy("even", c);
  EXPECT_EQ(sizesOf(even), (std::vector<int64_t>{5, 5, 4}));
  EXPECT_EQ(even.stageSeconds, (std::vector<double>{5, 10, 16}));
  EXPECT_DOUBLE_EQ(even.stepSeconds, 143);
  const Partition balanced = partitionBy("balanced", c);
  EXPECT_EQ(sizesOf(balanced), (std::vector<int64_t>{8, 4, 2}));
  EXPECT_EQ(balanced.stageSeconds, (std::vector<double>{8, 8, 8}));
  EXPECT_DOUBLE_EQ(balanced.stepSeconds, 80);
  EXPECT_DOUBLE_EQ(referenceStep(c, sizesOf(balanced)), bruteForce(c));
}

TEST(PipelinePartition, ChunksInFlightFollowOneFOneB) {
  EXPECT_EQ(chunksInFlight(0, 3, 8), 3);
  EXPECT_EQ(chunksInFlight(2, 3, 8), 1);
  EXPECT_EQ(chunksInFlight(0, 3, 2), 2);  // fewer chunks than stages
  EXPECT_EQ(chunksInFlight(1, 4, 1), 1);
}

TEST(PipelinePartition, UnknownModeNamesTheKeyAndTheChoices) {
  try {
    partitionBy("uniform", equalBlocks({1, 1}, 4, 2));
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.partition = \"uniform\""), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("balanced, even"), std::string::npos);
  }
}

// ---- The tensor split ---------------------------------------------------------------------------

// The least max_i units_i / speed_i over every split of `units` with at least `atLeast` each,
// enumerated.
double bruteForceSlowest(int64_t units, const std::vector<double>& speeds, int64_t atLeast) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int64_t> split(speeds.size(), atLeast);
  std::function<void(size_t, int64_t)> place = [&](size_t i, int64_t left) {
    if (i + 1 == speeds.size()) {
      split[i] = left;
      double slowest = 0;
      for (size_t j = 0; j < speeds.size(); ++j)
        slowest = std::max(slowest, double(split[j]) / speeds[j]);
      best = std::min(best, slowest);
      return;
    }
    for (int64_t u = atLeast; u <= left - atLeast * int64_t(speeds.size() - i - 1); ++u) {
      split[i] = u;
      place(i + 1, left - u);
    }
  };
  place(0, units);
  return best;
}

// ---- The devices' order ------------------------------------------------------------------------

// The least reference step over every order of the devices and every partition (infinity when
// nothing fits), by enumeration.
double bruteForceOverOrders(const PipelineCosts& c) {
  std::vector<int> order(c.seconds.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  double best = std::numeric_limits<double>::infinity();
  do {
    PipelineCosts r = c;
    for (size_t i = 0; i < order.size(); ++i) {
      r.seconds[i] = c.seconds[size_t(order[i])];
      r.memoryBytes[i] = c.memoryBytes[size_t(order[i])];
    }
    best = std::min(best, bruteForce(r));
  } while (std::next_permutation(order.begin(), order.end()));
  return best;
}

TEST(PipelinePartition, OverOrdersIsOptimalOrKeepsTheGivenOrderWithinFivePercent) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const PipelineCosts c = randomCase(rng);
    const double best = bruteForceOverOrders(c);
    if (!std::isfinite(best)) {
      EXPECT_THROW(partitionOverOrders(c), ConfigError) << "trial " << trial;
      continue;
    }
    const OrderedPartition got = partitionOverOrders(c);
    const PipelineCosts inOrder = reordered(c, got.order);
    const auto sizes = sizesOf(got.partition);
    EXPECT_TRUE(referenceFits(inOrder, sizes)) << "trial " << trial;
    const double step = referenceStep(inOrder, sizes);
    const bool given = std::is_sorted(got.order.begin(), got.order.end());
    if (given)
      EXPECT_LE(step, 1.05 * best * (1 + 1e-12)) << "trial " << trial;
    else
      EXPECT_NEAR(step, best, 1e-9 * best) << "trial " << trial;
  }
}

TEST(PipelinePartition, TheLargestMemoryGoesWhereTheMostActivationsWait) {
  // Equal speeds; 6 blocks whose activations dominate. Stage 0 holds 3 chunks in flight, stage 2
  // one: only the big device listed last can take stage 0's share, so the order puts it first.
  PipelineCosts c = equalBlocks({1.0, 1.0, 1.0}, 6, 8);
  c.activationBytes.assign(6, 100);
  c.memoryBytes = {250, 250, 900};
  EXPECT_THROW(partitionBalanced(c), ConfigError);  // the given order: stage 0 cannot fit
  const OrderedPartition got = partitionOverOrders(c);
  EXPECT_EQ(got.order.front(), 2);
  EXPECT_DOUBLE_EQ(got.partition.stepSeconds, bruteForceOverOrders(c));
}

TEST(PipelinePartition, EqualDevicesKeepTheGivenOrder) {
  const PipelineCosts c = equalBlocks({1.0, 1.0, 1.0, 1.0}, 10, 6);
  EXPECT_EQ(partitionOverOrders(c).order, (std::vector<int>{0, 1, 2, 3}));
}

// ---- Re-partitioning a running pipeline --------------------------------------------------------

// What stage position i measures in a step of `samples` (the profile's chunk size times chunks):
// its blocks' true seconds (the profile's times `slowdowns[i]`) for that many samples, times noise.
std::vector<double> measuredStages(const PipelineCosts& profile, const Partition& current,
                                   const std::vector<double>& slowdowns, double samplesRatio,
                                   const std::function<double()>& noise) {
  std::vector<double> seconds;
  for (int i = 0; i < current.stages(); ++i) {
    double w = 0;
    for (int64_t b = current.bounds[size_t(i)]; b < current.bounds[size_t(i) + 1]; ++b)
      w += profile.seconds[size_t(i)][size_t(b)];
    seconds.push_back(w * slowdowns[size_t(i)] * samplesRatio * noise());
  }
  return seconds;
}

TEST(PartitionWatch, StationaryNoiseAndAnOutlierStepNeverMoveBlocks) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> jitter(0.9, 1.1);
  const PipelineCosts profile = equalBlocks({1.0, 0.5, 0.25}, 14, 8);
  PartitionWatch watch(profile, 16, partitionBalanced(profile));
  const auto start = watch.current().bounds;
  const std::vector<int64_t> samples(3, 128);  // 8 chunks of the profiled 16
  for (int64_t step = 0; step < 300; ++step) {
    // Step 100: one stage takes 10 times longer once (a preempted step).
    const double outlier = step == 100 ? 10.0 : 1.0;
    auto seconds =
        measuredStages(profile, watch.current(), {1, 1, 1}, 8.0, [&] { return jitter(rng); });
    seconds[1] *= outlier;
    EXPECT_FALSE(watch.observe(step, seconds, samples).has_value()) << "step " << step;
  }
  EXPECT_EQ(watch.current().bounds, start);
}

TEST(PartitionWatch, ADeviceThatSlowsDownForGoodMovesBlocksOnceToTheNewOptimum) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> jitter(0.95, 1.05);
  const PipelineCosts profile = equalBlocks({1.0, 0.5, 0.25}, 14, 8);
  RepartitionOptions options;
  PartitionWatch watch(profile, 16, partitionBalanced(profile), options);
  // From step 30 on the first device runs 4 times slower than profiled.
  const int64_t change = 30;
  std::vector<double> slowdowns{1, 1, 1};
  int changes = 0;
  int64_t changedAt = -1;
  for (int64_t step = 0; step < 200; ++step) {
    if (step == change) slowdowns[0] = 4;
    const auto seconds =
        measuredStages(profile, watch.current(), slowdowns, 8.0, [&] { return jitter(rng); });
    if (watch.observe(step, seconds, std::vector<int64_t>(3, 128))) {
      ++changes;
      changedAt = step;
    }
  }
  EXPECT_EQ(changes, 1);
  // Not before the imbalance persisted, and soon after.
  EXPECT_GE(changedAt, change + options.persistSteps - 1);
  EXPECT_LE(changedAt, change + 3 * options.persistSteps);
  // The new partition's true step is within 3% of the optimum of the slowed costs, by the
  // enumeration (the watch knows the slowdown only through +-5% noisy measurements).
  PipelineCosts slowed = profile;
  for (double& t : slowed.seconds[0]) t *= 4;
  EXPECT_LE(referenceStep(slowed, sizesOf(watch.current())), 1.03 * bruteForce(slowed));
  EXPECT_LT(watch.current().blocksOf(0), partitionBalanced(profile).blocksOf(0));
  EXPECT_NEAR(watch.speedFactors()[0], 4.0, 0.25);
}

TEST(PartitionWatch, AProfileThatNeverFitsTheMeasurementsMovesBlocksLogarithmicallyOften) {
  // Adversarial measurements: whichever stage holds the first block measures 3 times its
  // profile, so every partition looks improvable. The gap between changes doubles: in 320 steps
  // at most log2(320 / 10) + 1 = 6 changes, not one every 10 steps.
  const PipelineCosts profile = equalBlocks({1.0, 1.0, 1.0}, 12, 4);
  RepartitionOptions options;
  PartitionWatch watch(profile, 10, partitionBalanced(profile), options);
  std::vector<int64_t> at;
  for (int64_t step = 0; step < 320; ++step) {
    const auto seconds =
        measuredStages(profile, watch.current(), {3, 1, 1}, 4.0, [] { return 1.0; });
    if (watch.observe(step, seconds, std::vector<int64_t>(3, 40))) at.push_back(step);
  }
  EXPECT_GE(at.size(), 1u);
  EXPECT_LE(at.size(), 6u);
  for (size_t k = 1; k < at.size(); ++k)
    EXPECT_GE(at[k] - at[k - 1], options.minStepsBetween << k) << "change " << k;
}

TEST(PartitionWatch, NoChangeBeforeMinStepsBetweenEvenWhenTheProfileWasWrong) {
  // The profile said equal devices; the third is really 3 times slower from the first step.
  const PipelineCosts profile = equalBlocks({1.0, 1.0, 1.0}, 9, 4);
  RepartitionOptions options;
  options.minStepsBetween = 12;
  PartitionWatch watch(profile, 10, partitionBalanced(profile), options);
  int64_t changedAt = -1;
  for (int64_t step = 0; step < 40 && changedAt < 0; ++step) {
    const auto seconds =
        measuredStages(profile, watch.current(), {1, 1, 3}, 4.0, [] { return 1.0; });
    if (watch.observe(step, seconds, std::vector<int64_t>(3, 40))) changedAt = step;
  }
  EXPECT_EQ(changedAt, options.minStepsBetween);
  EXPECT_LT(watch.current().blocksOf(2), 3) << "the slow device keeps fewer than a third";
}

TEST(TensorSplit, BySpeedIsOptimalAgainstEverySplitOnRandomCases) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> speed(0.1, 1.0);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t devices = 1 + size_t(trial % 4);
    const int64_t atLeast = trial % 3 == 0 ? 0 : 1;
    const int64_t units = int64_t(devices) * atLeast + int64_t(rng() % 10);
    std::vector<double> speeds;
    for (size_t i = 0; i < devices; ++i) speeds.push_back(speed(rng));
    const auto split = splitUnitsBySpeed(units, speeds, atLeast);
    ASSERT_EQ(split.size(), devices);
    int64_t total = 0;
    double slowest = 0;
    for (size_t i = 0; i < devices; ++i) {
      EXPECT_GE(split[i], atLeast) << "trial " << trial;
      total += split[i];
      slowest = std::max(slowest, double(split[i]) / speeds[i]);
    }
    EXPECT_EQ(total, units) << "trial " << trial;
    EXPECT_NEAR(slowest, bruteForceSlowest(units, speeds, atLeast), 1e-12) << "trial " << trial;
  }
}

TEST(TensorSplit, TheIssuesExampleAndTheEvenSplit) {
  // 6 heads on speeds 1 : 1/2 (the issue's example): 4 and 2, each taking 4 head-times.
  EXPECT_EQ(splitUnitsBySpeed(6, {1.0, 0.5}), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(splitUnitsEvenly(7, 3), (std::vector<int64_t>{3, 2, 2}));
}

TEST(TensorSplit, TooFewUnitsOrABadSpeedIsAConfigError) {
  EXPECT_THROW(splitUnitsBySpeed(2, {1, 1, 1}), ConfigError);
  EXPECT_THROW(splitUnitsBySpeed(4, {1, 0}), ConfigError);
  EXPECT_THROW(splitUnitsBySpeed(4, {}), ConfigError);
}

}  // namespace
}  // namespace hetra::balance
