// Tests of Balancer::idealSamplesPerSecond(), the balancer's prediction of the best synchronous
// step. References are computed here: each rank's curve T_i(b) = ceil(b / cap_i) * a_i + c_i * b
// evaluated by this file, and the best split found by enumerating every integer split.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "balance/balancer.h"

namespace hetra::balance {
namespace {

constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max();

struct Device {
  double overhead;   // seconds per micro-batch
  double perSample;  // seconds per sample
  int64_t cap;       // most samples per micro-batch
};

// This file's own evaluation of a curve: the fewest micro-batches of at most `cap` samples.
double curveSeconds(double overhead, double perSample, int64_t cap, int64_t samples) {
  if (samples <= 0) return 0.0;
  const int64_t microBatches = samples / cap + (samples % cap != 0);  // no overflow at kNoCap
  return double(microBatches) * overhead + perSample * double(samples);
}

// B / (least max_i T_i(b_i) over every split of B samples with b_i >= 0), by enumeration.
double bruteForceIdeal(const std::vector<Device>& devices, int64_t globalBatch) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int64_t> shares(devices.size(), 0);
  std::function<void(size_t, int64_t)> split = [&](size_t i, int64_t left) {
    if (i + 1 == devices.size()) {
      shares[i] = left;
      double step = 0.0;
      for (size_t r = 0; r < devices.size(); ++r)
        step = std::max(step, curveSeconds(devices[r].overhead, devices[r].perSample,
                                           devices[r].cap, shares[r]));
      best = std::min(best, step);
      return;
    }
    for (int64_t b = 0; b <= left; ++b) {
      shares[i] = b;
      split(i + 1, left - b);
    }
  };
  split(0, globalBatch);
  return double(globalBatch) / best;
}

std::vector<RankCaps> capsOf(const std::vector<Device>& devices) {
  std::vector<RankCaps> caps;
  for (const auto& d : devices) caps.push_back({d.cap});
  return caps;
}

// Feeds `steps` steps of noise-free micro-batch times of the true curves, each rank observed at
// the micro-batch sizes in `sizes` (cut to its cap).
void observeSteps(Balancer& balancer, const std::vector<Device>& devices,
                  const std::vector<int64_t>& sizes, int64_t firstStep, int steps) {
  for (int64_t s = firstStep; s < firstStep + steps; ++s) {
    for (size_t r = 0; r < devices.size(); ++r)
      for (int64_t m : sizes) {
        const int64_t size = std::min(m, devices[r].cap);
        balancer.observe(int(r), size, devices[r].overhead + devices[r].perSample * double(size));
      }
    balancer.endStep(s);
  }
}

TEST(BalancerIdeal, ZeroUntilEveryRankIsFitted) {
  BalancerOptions options;
  options.globalBatch = 12;
  Balancer balancer(options, {{kNoCap}, {kNoCap}});
  EXPECT_EQ(balancer.idealSamplesPerSecond(), 0.0);
  // Rank 1 never reports a time: its curve is unknown, so no prediction.
  for (int64_t s = 0; s < 8; ++s) {
    balancer.observe(0, 6, 0.006);
    balancer.endStep(s);
    EXPECT_EQ(balancer.idealSamplesPerSecond(), 0.0) << "step " << s;
  }
  balancer.observe(0, 6, 0.006);
  balancer.observe(1, 6, 0.018);
  balancer.endStep(8);
  EXPECT_GT(balancer.idealSamplesPerSecond(), 0.0);
}

// Proportional devices (no overhead, one micro-batch size, so the fit is exactly proportional):
// 1 ms and 2 ms per sample, B = 30. The best split is 20/10, a 20 ms step: 1500 samples/s, the
// sum of the devices' own rates (1000 + 500), since 30 divides evenly in the ratio 2:1.
TEST(BalancerIdeal, ProportionalDevicesReachTheSumOfTheirRates) {
  const std::vector<Device> devices = {{0.0, 0.001, kNoCap}, {0.0, 0.002, kNoCap}};
  BalancerOptions options;
  options.globalBatch = 30;
  Balancer balancer(options, capsOf(devices));
  observeSteps(balancer, devices, {15}, 0, 6);
  EXPECT_NEAR(balancer.idealSamplesPerSecond(), 1500.0, 1500.0 * 1e-9);
}

// The prediction is the best split under the balancer's fitted curves, whatever split the plan
// holds: random overheads, per-sample costs, caps and batch sizes, against enumeration over the
// curves read back from cost(i) and evaluated here.
TEST(BalancerIdeal, MatchesBruteForceOverTheFittedCurves) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<double> perSample(0.0005, 0.004);
  std::uniform_real_distribution<double> overhead(0.0, 0.01);
  std::uniform_int_distribution<int64_t> cap(2, 12);
  std::uniform_int_distribution<int64_t> batch(3, 24);
  std::uniform_int_distribution<int> ranks(2, 3);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<Device> truth(size_t(ranks(rng)));
    for (auto& d : truth) d = {overhead(rng), perSample(rng), trial % 2 ? cap(rng) : kNoCap};
    BalancerOptions options;
    options.mode = trial % 3 == 0 ? Mode::Equal : Mode::Dynamic;
    options.globalBatch = batch(rng);
    Balancer balancer(options, capsOf(truth));
    observeSteps(balancer, truth, {2, 5, 9}, 0, 10);

    std::vector<Device> fitted;
    for (int r = 0; r < balancer.ranks(); ++r) {
      ASSERT_TRUE(balancer.cost(r).known()) << "trial " << trial << " rank " << r;
      fitted.push_back(
          {balancer.cost(r).overhead, balancer.cost(r).perSample, truth[size_t(r)].cap});
    }
    const double expected = bruteForceIdeal(fitted, options.globalBatch);
    EXPECT_NEAR(balancer.idealSamplesPerSecond(), expected, expected * 1e-12)
        << "trial " << trial << " B=" << options.globalBatch;
    // Clean data at distinct sizes: the fitted curves follow the true ones closely, so the
    // prediction is close to the true best split too.
    const double trueIdeal = bruteForceIdeal(truth, options.globalBatch);
    EXPECT_NEAR(balancer.idealSamplesPerSecond(), trueIdeal, trueIdeal * 0.02)
        << "trial " << trial << " B=" << options.globalBatch;
  }
}

// An equal-mode balancer keeps the equal split, yet predicts the best split: with a 3x slower
// rank the equal split's step is far from it.
TEST(BalancerIdeal, EqualModePredictsTheBestSplitNotItsOwn) {
  const std::vector<Device> devices = {{0.0, 0.001, kNoCap}, {0.0, 0.003, kNoCap}};
  BalancerOptions options;
  options.mode = Mode::Equal;
  options.globalBatch = 40;
  Balancer balancer(options, capsOf(devices));
  observeSteps(balancer, devices, {20}, 0, 6);
  EXPECT_EQ(balancer.plan().ranks[0].batch, 20);
  // Best split 30/10: 30 ms on both ranks, 40 / 0.030 samples/s; the equal split takes 60 ms.
  EXPECT_NEAR(balancer.idealSamplesPerSecond(), 40.0 / 0.030, 40.0 / 0.030 * 1e-9);
}

}  // namespace
}  // namespace hetra::balance
