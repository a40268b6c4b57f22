// Tests of the load balancer on synthetic timing traces (seeded RNG). A simulated device has a true
// cost model t(m) = a + c*m per micro-batch; the balancer only sees the (noisy) measured times.
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "balance/allocation.h"
#include "balance/balancer.h"
#include "balance/throughput_model.h"
#include "common/errors.h"

namespace hetra::balance {
namespace {

constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max();

std::vector<RankCaps> capsOf(const std::vector<int64_t>& caps) {
  std::vector<RankCaps> out;
  for (int64_t c : caps) out.push_back({c});
  return out;
}

// The test's own reckoning of a rank's step time, independent of predictSeconds: the step cost,
// then `samples` as micro-batches of at most `cap` samples, each paying the overhead once plus
// its samples' cost.
double referenceSeconds(const CostModel& cost, int64_t samples, int64_t cap) {
  double seconds = cost.perStep;
  for (int64_t left = samples; left > 0; left -= std::min(left, cap))
    seconds += cost.overhead + cost.perSample * double(std::min(left, cap));
  return seconds;
}

double maxTime(const std::vector<CostModel>& costs, const std::vector<int64_t>& caps,
               const std::vector<int64_t>& shares) {
  double worst = 0.0;
  for (size_t i = 0; i < costs.size(); ++i)
    worst = std::max(worst, referenceSeconds(costs[i], shares[i], caps[i]));
  return worst;
}

// Equal up to the rounding of a different summation order.
void expectSameSeconds(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, want)) << what;
}

// Least max time over every split of `total` samples (b_i >= 0), by enumeration; `withinCaps`:
// only the splits with b_i <= cap_i.
double bruteForce(const std::vector<CostModel>& costs, const std::vector<int64_t>& caps,
                  int64_t total, bool withinCaps = false) {
  std::vector<int64_t> shares(costs.size(), 0);
  double best = std::numeric_limits<double>::infinity();
  std::function<void(size_t, int64_t)> rec = [&](size_t i, int64_t left) {
    if (i + 1 == costs.size()) {
      shares[i] = left;
      if (!withinCaps || left <= caps[i]) best = std::min(best, maxTime(costs, caps, shares));
      return;
    }
    for (int64_t b = 0; b <= (withinCaps ? std::min(left, caps[i]) : left); ++b) {
      shares[i] = b;
      rec(i + 1, left - b);
    }
  };
  rec(0, total);
  return best;
}

// --- Allocation ----------------------------------------------------------------------------

TEST(Allocation, MatchesBruteForceOnSmallProblems) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> overhead(0.0, 2.0), perSample(0.1, 3.0),
      stepCost(0.0, 12.0);
  std::uniform_int_distribution<int64_t> cap(1, 6);
  int zeroShares = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = 2 + size_t(trial % 2);
    std::vector<CostModel> costs(n);
    std::vector<int64_t> caps(n);
    for (size_t i = 0; i < n; ++i) {
      costs[i] = {trial % 5 == 0 ? 0.0 : overhead(rng), perSample(rng)};
      if (trial % 7 == 0 && i == 1) costs[i].perSample *= 40;  // a rank so slow it may get nothing
      // A step cost on some ranks (an update at the device's speed), on some as large as several
      // samples: it may be all a rank can afford.
      if (trial % 4 == 1) costs[i].perStep = stepCost(rng);
      caps[i] = trial % 3 == 0 ? 1000 : cap(rng);
    }
    const int64_t total = int64_t(n) + trial % 13;
    const auto shares = optimalShares(costs, caps, total);
    ASSERT_EQ(shares.size(), n);
    int64_t sum = 0;
    for (int64_t b : shares) sum += b;
    ASSERT_EQ(sum, total) << "trial " << trial;
    const double best = bruteForce(costs, caps, total);
    const double got = maxTime(costs, caps, shares);
    expectSameSeconds(got, best, str("trial ", trial));
    for (size_t i = 0; i < n; ++i) {
      ASSERT_GE(shares[i], 0);
      ASSERT_LE(microBatchSize(shares[i], caps[i]), caps[i]);
      // Zero only when one sample alone would be slower than the optimum.
      if (shares[i] == 0) {
        ++zeroShares;
        ASSERT_GT(referenceSeconds(costs[i], 1, caps[i]), best)
            << "trial " << trial << " rank " << i;
      }
    }
    ASSERT_EQ(optimalShares(costs, caps, total), shares) << "not deterministic";
  }
  EXPECT_GT(zeroShares, 0) << "the traces should include ranks not worth a sample";
}

// Without accumulation (ZeRO stages 2 and 3) every share stays within its cap, at the least max
// time of the splits that do.
TEST(Allocation, WithoutAccumulationMatchesBruteForceWithinTheCaps) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<double> overhead(0.0, 2.0), perSample(0.1, 3.0);
  std::uniform_int_distribution<int64_t> cap(1, 7);
  int bound = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = 2 + size_t(trial % 2);
    std::vector<CostModel> costs(n);
    std::vector<int64_t> caps(n);
    int64_t room = 0;
    for (size_t i = 0; i < n; ++i) {
      costs[i] = {trial % 5 == 0 ? 0.0 : overhead(rng), perSample(rng)};
      if (i == 0) costs[i].perSample /= 10;  // a fast rank, which would take more than its cap
      room += caps[i] = cap(rng);
    }
    const int64_t total = 1 + trial % room;
    const auto shares = optimalShares(costs, caps, total, false);
    int64_t sum = 0;
    for (size_t i = 0; i < n; ++i) {
      sum += shares[i];
      ASSERT_LE(shares[i], caps[i]) << "trial " << trial << " rank " << i;
    }
    ASSERT_EQ(sum, total) << "trial " << trial;
    expectSameSeconds(maxTime(costs, caps, shares), bruteForce(costs, caps, total, true),
                      str("trial ", trial));
    if (bruteForce(costs, caps, total) < bruteForce(costs, caps, total, true)) ++bound;
  }
  EXPECT_GT(bound, 0) << "some traces should be ones where accumulating would be faster";
  EXPECT_THROW(optimalShares({{0, 1}, {0, 1}}, {2, 3}, 6, false), EnforceError);
}

TEST(Allocation, EqualSharesWithinCapsSpreadsWhatACappedRankCannotTake) {
  EXPECT_EQ(equalSharesWithinCaps(10, {2, 100, 3}), (std::vector<int64_t>{2, 5, 3}));
  EXPECT_EQ(equalSharesWithinCaps(11, {4, 4, 4}), (std::vector<int64_t>{4, 4, 3}));
  EXPECT_EQ(equalSharesWithinCaps(12, {1, 20, 20, 2}), (std::vector<int64_t>{1, 5, 4, 2}));
  EXPECT_EQ(equalSharesWithinCaps(9, {9, 9, 9}), equalShares(9, 3));
  EXPECT_THROW(equalSharesWithinCaps(10, {2, 3, 4}), EnforceError);
}

TEST(Allocation, TieAtTheOptimumStillGivesEveryRankASample) {
  // Rank 1's first sample ends exactly when rank 0's second does: both splits take 2 s, so prefer
  // the one that uses every rank.
  const std::vector<CostModel> costs{{0, 1.0}, {0, 2.0}};
  EXPECT_EQ(optimalShares(costs, {10, 10}, 2), (std::vector<int64_t>{1, 1}));
  // Here one sample on rank 1 (3 s) is slower than all on rank 0 (2 s): it gets none.
  EXPECT_EQ(optimalShares({{0, 1.0}, {0, 3.0}}, {10, 10}, 2), (std::vector<int64_t>{2, 0}));
  // Overhead makes the first micro-batch of a rank expensive: 3 ranks, 3 samples.
  EXPECT_EQ(optimalShares({{0, 1.0}, {0, 1.0}, {5.0, 1.0}}, {1, 1, 1}, 3),
            (std::vector<int64_t>{2, 1, 0}));
}

TEST(Allocation, LargeBatchMatchesOneSampleAtATimeGreedy) {
  // The reference hands out samples one at a time to the rank whose next sample ends soonest.
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> overhead(0.0, 0.01), perSample(0.0005, 0.004);
  std::uniform_int_distribution<int64_t> cap(3, 900);
  for (int trial = 0; trial < 6; ++trial) {
    const size_t n = 7;
    std::vector<CostModel> costs(n);
    std::vector<int64_t> caps(n);
    for (size_t i = 0; i < n; ++i) {
      costs[i] = {overhead(rng), perSample(rng)};
      caps[i] = cap(rng);
    }
    if (trial == 0)
      for (size_t i = 0; i < n; ++i) costs[i] = costs[0], caps[i] = caps[0];  // all ties
    const int64_t total = 10007;
    std::vector<int64_t> ref(n, 0);
    for (int64_t s = 0; s < total; ++s) {
      size_t best = 0;
      for (size_t i = 1; i < n; ++i)
        if (referenceSeconds(costs[i], ref[i] + 1, caps[i]) <
            referenceSeconds(costs[best], ref[best] + 1, caps[best]))
          best = i;
      ++ref[best];
    }
    const auto shares = optimalShares(costs, caps, total);
    expectSameSeconds(maxTime(costs, caps, shares), maxTime(costs, caps, ref),
                      str("trial ", trial));
    int64_t sum = 0;
    for (int64_t b : shares) sum += b;
    EXPECT_EQ(sum, total);
  }
}

TEST(Allocation, MicroBatchesAreEvenAndCapped) {
  for (int64_t cap = 1; cap <= 17; ++cap) {
    for (int64_t b = 1; b <= 200; ++b) {
      const int64_t k = accumSteps(b, cap), m = microBatchSize(b, cap);
      ASSERT_LE(m, cap);
      ASSERT_EQ(k, (b + cap - 1) / cap) << "fewest micro-batches";
      ASSERT_EQ((b + m - 1) / m, k) << "b=" << b << " cap=" << cap;
      ASSERT_GE(b - (k - 1) * m, 1) << "the last micro-batch is not empty";
      const CostModel cost{0.25, 0.125 + 0.01 * double(cap)};
      expectSameSeconds(predictSeconds(cost, b, cap), referenceSeconds(cost, b, cap),
                        str("b=", b, " cap=", cap));
    }
  }
  EXPECT_EQ(accumSteps(0, 4), 0);
  EXPECT_EQ(microBatchSize(0, 4), 0);
  EXPECT_EQ(microBatchSize(10, 4), 4);  // 4 + 4 + 2
  EXPECT_EQ(microBatchSize(9, 4), 3);   // 3 + 3 + 3, not 4 + 4 + 1
  EXPECT_EQ(equalShares(11, 3), (std::vector<int64_t>{4, 4, 3}));
}

// --- Throughput model ----------------------------------------------------------------------

TEST(ThroughputModel, FitsOverheadAndPerSampleFromTwoSizes) {
  ThroughputModel model;
  for (int64_t step = 0; step < 10; ++step) {
    const int64_t m = step % 2 == 0 ? 40 : 80;
    model.addStep(step, {{m, 0.5 + 0.01 * double(m)}, {m, 0.5 + 0.01 * double(m)}});
  }
  // The prior a = 0 shrinks the overhead a little; predictions at the observed sizes stay close.
  EXPECT_NEAR(model.cost().overhead, 0.5, 0.05);
  EXPECT_NEAR(model.cost().perSample, 0.01, 0.001);
  EXPECT_NEAR(model.cost().seconds(40, 1), 0.9, 0.01);
  EXPECT_NEAR(model.cost().seconds(80, 1), 1.3, 0.01);
}

TEST(ThroughputModel, OneSizeFallsBackToProportional) {
  ThroughputModel model;
  for (int64_t step = 0; step < 5; ++step) model.addStep(step, {{64, 0.64}});
  EXPECT_NEAR(model.cost().overhead, 0.0, 1e-9);
  EXPECT_NEAR(model.cost().perSample, 0.01, 1e-9);
  EXPECT_EQ(model.shape(), 0.0) << "one size measures no shape";
}

// A device with a fixed cost of 40 samples' worth per micro-batch, measured at two sizes, becomes
// twice as slow: after the change only points at one size are left. The model is the new speed's
// line with the remembered shape (a = 40 c), not a line through the origin, which would predict
// twice the time at four times the size.
TEST(ThroughputModel, ShapeOutlivesAChangeOfSpeed) {
  auto truth = [](double speed, int64_t m) { return speed * (0.4 + 0.01 * double(m)); };
  ThroughputModel model;
  int64_t step = 0;
  for (; step < 20; ++step) {
    const int64_t m = step % 2 == 0 ? 20 : 60;
    model.addStep(step, {{m, truth(1.0, m) * (step % 4 < 2 ? 1.01 : 0.99)}});
  }
  EXPECT_NEAR(model.shape(), 40.0, 4.0);
  for (const int64_t end = step + 6; step < end; ++step)
    model.addStep(step, {{20, truth(2.0, 20)}});
  EXPECT_EQ(model.changes(), 1);
  EXPECT_EQ(model.points().front().microBatch, 20) << "the points before the change are gone";
  EXPECT_NEAR(model.cost().seconds(20, 1) / truth(2.0, 20), 1.0, 0.01);
  EXPECT_NEAR(model.cost().seconds(80, 1) / truth(2.0, 80), 1.0, 0.05);
  // Saved and loaded, and after forgetting every point, the shape stays.
  EXPECT_EQ(ThroughputModel::fromJson(model.toJson()).toJson(), model.toJson());
  const double shape = model.shape();
  model.forgetPoints();
  model.addStep(step, {{10, truth(1.0, 10)}});
  EXPECT_DOUBLE_EQ(model.shape(), shape);
  EXPECT_NEAR(model.cost().seconds(80, 1) / truth(1.0, 80), 1.0, 0.05);
}

TEST(ThroughputModel, IgnoresASpikeAndSwitchesAfterALevelChange) {
  ThroughputModel model;
  int64_t step = 0;
  for (; step < 8; ++step) model.addStep(step, {{100, 1.0}});
  model.addStep(step++, {{100, 5.0}});  // one 5x spike
  EXPECT_NEAR(model.cost().perSample, 0.01, 1e-9);
  // Within one step, a slow micro-batch among several does not count either (median per step).
  model.addStep(step++, {{100, 1.0}, {100, 5.0}, {100, 1.0}});
  EXPECT_NEAR(model.cost().perSample, 0.01, 1e-9);
  // A lasting 3x slowdown takes over within a few steps, without drifting through the average.
  int switched = -1;
  for (int k = 0; k < 10; ++k) {
    model.addStep(step++, {{100, 3.0}});
    if (switched < 0 && std::abs(model.cost().perSample - 0.03) < 1e-6) switched = k + 1;
  }
  EXPECT_GE(switched, 2);
  EXPECT_LE(switched, 5);
}

// The step cost is the median of the last steps' measurements: a slow update (the first step's,
// which allocates the optimizer's state) does not count; a change of speed that the micro-batches
// show takes the older step costs away with the older points; a saved model keeps them.
TEST(ThroughputModel, StepCostIsTheRecentMedianAndFollowsAChangeOfSpeed) {
  ThroughputModel model;
  int64_t step = 0;
  model.addStep(step, {{100, 1.0}});
  model.addStepCost(step++, 0.9);  // the first update: 9x
  for (; step < 7; ++step) {
    model.addStep(step, {{100, 1.0}});
    model.addStepCost(step, std::vector<double>{0.1, 0.09, 0.11}[size_t(step % 3)]);
  }
  EXPECT_DOUBLE_EQ(model.cost().perStep, 0.1);
  EXPECT_DOUBLE_EQ(model.cost().stepSeconds(100, 1), 0.1 + model.cost().seconds(100, 1));
  EXPECT_DOUBLE_EQ(model.cost().stepSeconds(0, 0), 0.1) << "paid whatever the share";
  const ThroughputModel saved = ThroughputModel::fromJson(model.toJson());
  EXPECT_DOUBLE_EQ(saved.cost().perStep, 0.1);
  EXPECT_EQ(saved.toJson(), model.toJson());
  // The device becomes 3x slower: compute and update alike. Once the change is detected the
  // step cost is the new speed's alone, not the median of old and new.
  for (; step < 7 + 3; ++step) {
    model.addStep(step, {{100, 3.0}});
    model.addStepCost(step, 0.3);
  }
  EXPECT_EQ(model.changes(), 1);
  EXPECT_DOUBLE_EQ(model.cost().perStep, 0.3);
  model.forgetPoints();
  EXPECT_EQ(model.cost().perStep, 0.0);
}

TEST(ThroughputModel, StepCostMustBeAFiniteNonNegativeTimeOfALaterStep) {
  ThroughputModel model;
  model.addStepCost(3, 0.1);
  EXPECT_THROW(model.addStepCost(3, 0.1), EnforceError);
  EXPECT_THROW(model.addStepCost(4, -0.1), EnforceError);
  EXPECT_THROW(model.addStepCost(5, std::nan("")), EnforceError);
}

// --- Simulated training runs -----------------------------------------------------------------

struct Device {
  double overhead;   // true seconds per micro-batch
  double perSample;  // true seconds per sample
};

class Simulation {
 public:
  Simulation(std::vector<Device> devices, double noise, uint32_t seed)
      : devices_(std::move(devices)), noise_(noise), rng_(seed) {}

  std::vector<Device>& devices() { return devices_; }

  // Runs one step of `plan` (k-1 micro-batches of m samples, then the rest) and feeds the balancer.
  // `spikeRank` gets one micro-batch (or all of them, `wholeStep`) `spike` times slower. Returns
  // whether the plan changed.
  bool step(Balancer& balancer, int64_t step, int spikeRank = -1, double spike = 1.0,
            bool wholeStep = false) {
    std::uniform_real_distribution<double> jitter(1.0 - noise_, 1.0 + noise_);
    const Plan& plan = balancer.plan();
    int64_t total = 0;
    for (const auto& r : plan.ranks) total += r.batch;
    EXPECT_EQ(total, balancer.options().globalBatch) << plan.summary();
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      int64_t left = plan.ranks[r].batch;
      bool spiked = false;
      while (left > 0) {
        const int64_t m = std::min(left, plan.ranks[r].microBatch);
        double t = (devices_[r].overhead + devices_[r].perSample * double(m)) * jitter(rng_);
        if (int(r) == spikeRank && (!spiked || wholeStep)) t *= spike, spiked = true;
        balancer.observe(int(r), m, t);
        left -= m;
      }
    }
    return balancer.endStep(step);
  }

  // True compute time of the plan's slowest rank.
  double trueStepSeconds(const Plan& plan, const std::vector<int64_t>& caps) const {
    double worst = 0.0;
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      const auto& a = plan.ranks[r];
      EXPECT_LE(a.microBatch, caps[r]);
      worst = std::max(worst, double(a.accumSteps) * devices_[r].overhead +
                                  devices_[r].perSample * double(a.batch));
    }
    return worst;
  }

  // Best achievable step time with the true costs (allocation is checked against brute force
  // above).
  double optimumSeconds(const std::vector<int64_t>& caps, int64_t total) const {
    std::vector<CostModel> costs;
    for (const auto& d : devices_) costs.push_back({d.overhead, d.perSample});
    return maxTime(costs, caps, optimalShares(costs, caps, total));
  }

 private:
  std::vector<Device> devices_;
  double noise_;
  std::mt19937 rng_;
};

BalancerOptions options(int64_t globalBatch, Mode mode = Mode::Dynamic) {
  BalancerOptions o;
  o.mode = mode;
  o.globalBatch = globalBatch;
  return o;
}

int64_t sumShares(const Plan& plan) {
  int64_t sum = 0;
  for (const auto& r : plan.ranks) sum += r.batch;
  return sum;
}

TEST(Balancer, InitialPlanIsEqualWithCappedMicroBatches) {
  Balancer b(options(11), capsOf({2, kNoCap, 3}));
  const Plan& p = b.plan();
  ASSERT_EQ(p.ranks.size(), 3u);
  EXPECT_EQ(p.version, 0);
  EXPECT_NE(p.reason.find("initial"), std::string::npos) << p.reason;
  EXPECT_EQ(p.ranks[0].batch, 4);
  EXPECT_EQ(p.ranks[0].microBatch, 2);
  EXPECT_EQ(p.ranks[0].accumSteps, 2);
  EXPECT_EQ(p.ranks[1].batch, 4);
  EXPECT_EQ(p.ranks[1].microBatch, 4);
  EXPECT_EQ(p.ranks[1].accumSteps, 1);
  EXPECT_EQ(p.ranks[2].batch, 3);
  EXPECT_EQ(p.ranks[2].accumSteps, 1);
}

// A measured memory bound (balance/memory_caps.h) changes a rank's micro-batches, not the split;
// the bound survives save/load, and a bound that is already in force changes nothing.
TEST(Balancer, NewMemoryBoundKeepsTheSplitAndCutsTheMicroBatches) {
  Balancer b(options(11), capsOf({2, kNoCap, 3}));
  EXPECT_TRUE(b.setMaxMicroBatch(1, 3));
  const Plan& p = b.plan();
  EXPECT_EQ(p.version, 0);
  EXPECT_EQ(p.ranks[1].batch, 4);
  EXPECT_EQ(p.ranks[1].microBatch, 2);  // 4 samples under a bound of 3: two micro-batches of 2
  EXPECT_EQ(p.ranks[1].accumSteps, 2);
  EXPECT_EQ(p.ranks[0].microBatch, 2);  // the others as they were
  EXPECT_EQ(p.ranks[2].accumSteps, 1);
  EXPECT_EQ(b.maxMicroBatch(1), 3);
  EXPECT_FALSE(b.setMaxMicroBatch(1, 3));
  EXPECT_TRUE(b.setMaxMicroBatch(0, 100));  // a looser bound, clamped to the global batch
  EXPECT_EQ(b.maxMicroBatch(0), 11);
  EXPECT_EQ(b.plan().ranks[0].accumSteps, 1);
  EXPECT_EQ(Balancer::load(b.save()).maxMicroBatch(1), 3);
  EXPECT_THROW(b.setMaxMicroBatch(1, 0), EnforceError);
}

TEST(Balancer, ConvergesToProportionalSplit) {
  // Speeds 1:2:4 (per-sample cost 4:2:1 ms), no per-micro-batch overhead: the ideal split is
  // proportional to speed, and ideal step time is B / sum(speeds).
  const int64_t total = 512;
  const std::vector<int64_t> caps(3, total);
  Simulation sim({{0, 4e-3}, {0, 2e-3}, {0, 1e-3}}, 0.02, 1);
  Balancer b(options(total), capsOf({kNoCap, kNoCap, kNoCap}));
  const double ideal = double(total) / (1 / 4e-3 + 1 / 2e-3 + 1 / 1e-3);
  int64_t convergedAt = -1;
  for (int64_t step = 0; step < 15; ++step) {
    sim.step(b, step);
    ASSERT_EQ(sumShares(b.plan()), total);
    if (convergedAt < 0 && ideal / sim.trueStepSeconds(b.plan(), caps) >= 0.97) convergedAt = step;
  }
  ASSERT_GE(convergedAt, 0) << b.plan().summary();
  EXPECT_LE(convergedAt, 5) << "converged after step " << convergedAt;
  const Plan& p = b.plan();
  EXPECT_GE(ideal / sim.trueStepSeconds(p, caps), 0.97) << p.summary();
  EXPECT_GE(ideal / p.predictedStepSeconds, 0.97) << p.summary();
  EXPECT_NEAR(double(p.ranks[0].batch), 512.0 / 7, 6) << p.summary();
  EXPECT_NEAR(double(p.ranks[2].batch), 512.0 * 4 / 7, 6) << p.summary();
  EXPECT_NE(p.reason.find("gain"), std::string::npos) << p.reason;
  EXPECT_GE(p.version, 1);
}

TEST(Balancer, SmallCapOnAFastRankMeansAccumulationNotASmallerShare) {
  // Rank 0 is 4x faster but holds only 16 samples per micro-batch; a micro-batch costs it 0.05 ms
  // of overhead (3% of a full one), so accumulating pays.
  const int64_t total = 200;
  const std::vector<int64_t> caps{16, total};
  Simulation sim({{5e-5, 1e-4}, {0, 4e-4}}, 0.02, 2);
  Balancer b(options(total), capsOf({16, kNoCap}));
  for (int64_t step = 0; step < 30; ++step) sim.step(b, step);
  const Plan& p = b.plan();
  EXPECT_GE(p.ranks[0].batch, 150) << p.summary();
  EXPECT_GT(p.ranks[0].accumSteps, 1) << p.summary();
  EXPECT_LE(p.ranks[0].microBatch, 16) << p.summary();
  EXPECT_GE(sim.optimumSeconds(caps, total) / sim.trueStepSeconds(p, caps), 0.95) << p.summary();
}

// With sharesWithinCaps (ZeRO stages 2 and 3) the same fast small rank runs one micro-batch: its
// share stays at its cap from the first plan on, and the split is the best of those within caps.
TEST(Balancer, SharesWithinCapsKeepEveryRankToOneMicroBatch) {
  const int64_t total = 200;
  const std::vector<int64_t> caps{16, total};
  Simulation sim({{5e-5, 1e-4}, {0, 4e-4}}, 0.02, 2);
  BalancerOptions o = options(total);
  o.sharesWithinCaps = true;
  Balancer b(o, capsOf({16, kNoCap}));
  EXPECT_EQ(b.plan().ranks[0].batch, 16) << b.plan().summary();  // not the equal 100
  EXPECT_EQ(b.plan().ranks[1].batch, 184) << b.plan().summary();
  for (int64_t step = 0; step < 30; ++step) {
    sim.step(b, step);
    for (const auto& r : b.plan().ranks) ASSERT_EQ(r.accumSteps, 1) << b.plan().summary();
  }
  std::vector<CostModel> costs{{5e-5, 1e-4}, {0, 4e-4}};
  const double best = bruteForce(costs, caps, total, true);
  EXPECT_GE(best / sim.trueStepSeconds(b.plan(), caps), 0.95) << b.plan().summary();
  EXPECT_TRUE(Balancer::load(b.save()).options().sharesWithinCaps);

  // Once the caps cannot hold the batch the rule is off: the rank accumulates, the split stays.
  const int64_t before = b.plan().version;
  EXPECT_TRUE(b.setMaxMicroBatch(1, 150));
  EXPECT_EQ(b.plan().version, before);
  EXPECT_EQ(b.plan().ranks[1].accumSteps, 2) << b.plan().summary();
}

// A measured bound below a rank's share moves the surplus at once, to the ranks with room.
TEST(Balancer, SharesWithinCapsFollowALowerMeasuredBound) {
  BalancerOptions o = options(30);
  o.sharesWithinCaps = true;
  Balancer b(o, capsOf({20, 20, 20}));
  EXPECT_EQ(b.plan().ranks[0].batch, 10);
  EXPECT_TRUE(b.setMaxMicroBatch(0, 4));
  EXPECT_EQ(b.plan().version, 1);
  std::vector<int64_t> shares;
  for (const auto& r : b.plan().ranks) shares.push_back(r.batch);
  EXPECT_EQ(shares, (std::vector<int64_t>{4, 13, 13})) << b.plan().summary();
  EXPECT_NE(b.plan().reason.find("below its share"), std::string::npos) << b.plan().reason;
}

// Caps that cannot hold the batch leave the rule off: ranks accumulate as without it.
TEST(Balancer, SharesWithinCapsNeedCapsThatHoldTheBatch) {
  BalancerOptions o = options(30);
  o.sharesWithinCaps = true;
  Balancer b(o, capsOf({5, 5, 5}));
  EXPECT_EQ(b.plan().ranks[0].batch, 10);
  EXPECT_EQ(b.plan().ranks[0].accumSteps, 2);
  Balancer c(o, capsOf({5, 20, 20}));
  EXPECT_EQ(c.plan().ranks[0].batch, 5);
  EXPECT_EQ(c.plan().ranks[1].batch + c.plan().ranks[2].batch, 25);
  EXPECT_NE(c.plan().reason.find("within the micro-batch caps"), std::string::npos);
}

TEST(Balancer, RankNotWorthASampleGetsNone) {
  // One sample on rank 1 takes longer than the whole batch on rank 0.
  const int64_t total = 20;
  Simulation sim({{0, 1e-3}, {0, 1.0}}, 0.0, 3);
  Balancer b(options(total), capsOf({kNoCap, kNoCap}));
  for (int64_t step = 0; step < 6; ++step) sim.step(b, step);
  EXPECT_EQ(b.plan().ranks[1].batch, 0) << b.plan().summary();
  EXPECT_EQ(b.plan().ranks[1].accumSteps, 0);
  EXPECT_EQ(b.plan().ranks[0].batch, total);
}

TEST(Balancer, AdaptsAfterARankBecomesThreeTimesSlower) {
  const int64_t total = 512;
  const std::vector<int64_t> caps{64, 96, total};
  Simulation sim({{2e-4, 1e-3}, {2e-4, 1e-3}, {2e-4, 2e-3}}, 0.05, 4);
  Balancer b(options(total), capsOf({64, 96, kNoCap}));
  int64_t step = 0;
  for (; step < 100; ++step) sim.step(b, step);
  EXPECT_GE(sim.optimumSeconds(caps, total) / sim.trueStepSeconds(b.plan(), caps), 0.95)
      << b.plan().summary();
  sim.devices()[1].perSample *= 3;
  sim.devices()[1].overhead *= 3;
  const double optimum = sim.optimumSeconds(caps, total);
  int64_t recoveredAt = -1;
  for (; step < 140; ++step) {
    sim.step(b, step);
    const double efficiency = optimum / sim.trueStepSeconds(b.plan(), caps);
    if (recoveredAt < 0 && efficiency >= 0.9) recoveredAt = step;
    if (step >= 120) {
      EXPECT_GE(efficiency, 0.9) << "step " << step << " " << b.plan().summary();
    }
  }
  EXPECT_GE(recoveredAt, 100);
  EXPECT_LE(recoveredAt, 115) << b.plan().summary();
  EXPECT_NE(b.plan().reason.find("rebalance"), std::string::npos) << b.plan().reason;
}

// Stated bound: with +-10% uniform noise on every micro-batch, after convergence (step 20) the
// split changes at most twice in 280 steps of any run, at most 12 times over all 24 runs (3
// clusters x 8 seeds; a balancer without the noise margin and persistence makes dozens; the
// balancer refines down to a 1% sure gain and probes, where it used to stop at 5%: it made 6), and
// a plan never costs more than 10% against the true optimum.
TEST(Balancer, DoesNotOscillateUnderTenPercentNoise) {
  struct Case {
    std::vector<Device> devices;
    std::vector<int64_t> caps;
    int64_t total;
  };
  const std::vector<Case> cases{
      {{{0, 4e-3}, {0, 2e-3}, {0, 1e-3}}, {512, 512, 512}, 512},
      {{{1e-4, 1e-3}, {3e-4, 1.5e-3}, {0, 3e-3}, {1e-4, 1e-3}, {2e-4, 7e-4}},
       {32, 200, 999, 999, 24},
       999},
      {{{1e-3, 1e-3}, {0, 1e-3}, {5e-3, 1e-3}, {0, 2e-3}, {0, 1e-3}, {0, 1e-3}, {0, 1e-3}},
       {16, 1000, 1000, 1000, 8, 1000, 1000},
       1000},
  };
  int allChanges = 0;
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    for (size_t c = 0; c < cases.size(); ++c) {
      std::vector<int64_t> caps;
      for (int64_t cap : cases[c].caps) caps.push_back(std::min(cap, cases[c].total));
      Simulation sim(cases[c].devices, 0.10, seed);
      Balancer b(options(cases[c].total), capsOf(cases[c].caps));
      const double optimum = sim.optimumSeconds(caps, cases[c].total);
      int changes = 0;
      for (int64_t step = 0; step < 300; ++step) {
        const bool changed = sim.step(b, step);
        if (step >= 20) {
          changes += changed;
          ASSERT_GE(optimum / sim.trueStepSeconds(b.plan(), caps), 0.9)
              << "case " << c << " seed " << seed << " step " << step << " " << b.plan().summary();
        }
      }
      EXPECT_LE(changes, 2) << "case " << c << " seed " << seed << ": " << b.plan().summary();
      allChanges += changes;
    }
  }
  EXPECT_LE(allChanges, 12);
  std::cout << "plan changes after convergence over 24 noisy runs: " << allChanges << "\n";
}

TEST(Balancer, SingleSpikeDoesNotRebalance) {
  // Rank 0 runs several micro-batches per step (cap 40), the others one.
  const int64_t total = 300;
  for (bool wholeStep : {false, true}) {
    for (int spikeRank = 0; spikeRank < 3; ++spikeRank) {
      Simulation sim({{1e-4, 1e-3}, {1e-4, 2e-3}, {1e-4, 3e-3}}, 0.05, 10 + uint32_t(spikeRank));
      Balancer b(options(total), capsOf({40, kNoCap, kNoCap}));
      int64_t step = 0;
      for (; step < 40; ++step) sim.step(b, step);
      const int64_t version = b.plan().version;
      const double predicted = b.cost(spikeRank).perSample;
      sim.step(b, step++, spikeRank, 5.0, wholeStep);
      EXPECT_NEAR(b.cost(spikeRank).perSample / predicted, 1.0, 0.05)
          << "the spike was not ignored";
      for (; step < 60; ++step)
        ASSERT_FALSE(sim.step(b, step)) << "rank " << spikeRank << ": " << b.plan().summary();
      EXPECT_EQ(b.plan().version, version);
    }
  }
}

TEST(Balancer, ModesEqualStaticDynamic) {
  const int64_t total = 301;
  auto run = [&](Mode mode) {
    Simulation sim({{0, 1e-3}, {0, 4e-3}, {0, 2e-3}}, 0.05, 7);
    Balancer b(options(total, mode), capsOf({kNoCap, 50, kNoCap}));
    std::vector<Plan> plans;
    for (int64_t step = 0; step < 60; ++step) {
      if (step == 30) sim.devices()[0].perSample *= 4;  // the fast rank becomes the slowest
      sim.step(b, step);
      plans.push_back(b.plan());
    }
    return plans;
  };
  const auto equal = run(Mode::Equal);
  for (const auto& p : equal) {
    EXPECT_EQ(p.version, 0);
    EXPECT_EQ(p.ranks[0].batch, 101);
    EXPECT_EQ(p.ranks[1].batch, 100);
    EXPECT_EQ(p.ranks[1].microBatch, 50);
    EXPECT_EQ(p.ranks[1].accumSteps, 2);
  }
  EXPECT_GT(equal.back().predictedStepSeconds, 0.0) << "predictions are refreshed in every mode";
  const size_t profile = size_t(BalancerOptions{}.profileSteps);
  const auto fixed = run(Mode::Static);
  EXPECT_EQ(fixed[profile - 2].version, 0) << "no decision during profiling";
  EXPECT_EQ(fixed[profile - 1].version, 1) << "decided at the end of profiling";
  EXPECT_EQ(fixed.back().version, 1) << "static never changes again";
  const auto dynamic = run(Mode::Dynamic);
  EXPECT_EQ(dynamic[profile - 1].version, 1);
  EXPECT_GT(dynamic.back().version, dynamic[29].version) << "dynamic adapts";
  EXPECT_LT(dynamic.back().ranks[0].batch, dynamic[29].ranks[0].batch / 2);
}

TEST(Balancer, SameInputsSamePlans) {
  auto run = [] {
    Simulation sim({{1e-4, 1e-3}, {0, 3e-3}, {2e-4, 2e-3}}, 0.1, 9);
    Balancer b(options(777), capsOf({50, 300, kNoCap}));
    std::vector<std::string> log;
    for (int64_t step = 0; step < 80; ++step) {
      if (step == 40) sim.devices()[2].perSample /= 2;
      sim.step(b, step);
      log.push_back(b.plan().summary());
    }
    return log;
  };
  EXPECT_EQ(run(), run());
}

TEST(Balancer, SaveLoadGivesIdenticalFuturePlans) {
  const int64_t total = 513;
  Simulation sim({{1e-4, 1e-3}, {0, 3e-3}, {2e-4, 2e-3}}, 0.1, 21);
  Balancer a(options(total), capsOf({64, kNoCap, 100}));
  int64_t step = 0;
  for (; step < 37; ++step) sim.step(a, step);
  a.observe(0, 5, 0.01);  // a pending observation travels too
  Balancer b = Balancer::load(a.save());
  EXPECT_EQ(b.save(), a.save());
  EXPECT_EQ(b.plan().summary(), a.plan().summary());
  b.observe(1, 1, 0.5);
  a.observe(1, 1, 0.5);
  // Feed both the identical future trace, including a change of speed.
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> jitter(0.9, 1.1);
  const std::vector<Device> devices{{1e-4, 1e-3}, {0, 3e-3}, {2e-4, 2e-3}};
  int changes = 0;
  for (; step < 120; ++step) {
    for (int r = 0; r < 3; ++r) {
      const double slow = (r == 1 && step >= 60) ? 0.25 : 1.0;
      int64_t left = a.plan().ranks[size_t(r)].batch;
      ASSERT_EQ(left, b.plan().ranks[size_t(r)].batch);
      while (left > 0) {
        const int64_t m = std::min(left, a.plan().ranks[size_t(r)].microBatch);
        const double t = slow *
                         (devices[size_t(r)].overhead + devices[size_t(r)].perSample * double(m)) *
                         jitter(rng);
        a.observe(r, m, t);
        b.observe(r, m, t);
        left -= m;
      }
    }
    const bool changedA = a.endStep(step), changedB = b.endStep(step);
    ASSERT_EQ(changedA, changedB) << "step " << step;
    changes += changedA;
    ASSERT_EQ(a.plan().summary(), b.plan().summary()) << "step " << step;
    ASSERT_EQ(a.lastGain(), b.lastGain());
  }
  EXPECT_GE(changes, 1) << "the trace should exercise a rebalance";
  EXPECT_EQ(a.save(), b.save());
}

void expectConfigError(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no ConfigError; expected one mentioning " << needle;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Balancer, BadSettingsAreConfigErrors) {
  expectConfigError([] { Balancer(options(2), capsOf({8, 8, 8})); }, "globalBatch=2");
  expectConfigError([] { Balancer(options(0), capsOf({8})); }, "globalBatch=0");
  expectConfigError([] { Balancer(options(10), capsOf({})); }, "no ranks");
  expectConfigError([] { Balancer(options(10), capsOf({8, 0})); }, "rank 1 maxMicroBatch=0");
  expectConfigError([] { Balancer(options(10), capsOf({-3})); }, "maxMicroBatch=-3");
  expectConfigError([] { parseMode("fastest"); }, "mode (HETRA_BALANCE_MODE)='fastest'");
  expectConfigError(
      [] {
        auto o = options(10);
        o.rebalanceThreshold = -0.1;
        Balancer(o, capsOf({8}));
      },
      "rebalanceThreshold");
  expectConfigError(
      [] {
        auto o = options(10);
        o.profileSteps = 0;
        Balancer(o, capsOf({8}));
      },
      "profileSteps (HETRA_BALANCE_PROFILE_STEPS)=0");
  expectConfigError(
      [] {
        auto o = options(10);
        o.persistSteps = 0;
        Balancer(o, capsOf({8}));
      },
      "persistSteps");
  expectConfigError(
      [] {
        auto o = options(10);
        o.minStepsBetweenChanges = -1;
        Balancer(o, capsOf({8}));
      },
      "minStepsBetweenChanges");
  expectConfigError([] { Balancer::load("{not json"); }, "saved state");
  expectConfigError([] { Balancer::load("{\"format\": 1}"); }, "saved state");
  EXPECT_EQ(parseMode("static"), Mode::Static);
  EXPECT_EQ(parseMode(modeName(Mode::Equal)), Mode::Equal);
}

TEST(Balancer, OptionsFromParams) {
  ::setenv("HETRA_BALANCE_MODE", "static", 1);
  ::setenv("HETRA_BALANCE_PROFILE_STEPS", "7", 1);
  const BalancerOptions o = BalancerOptions::fromParams(96);
  EXPECT_EQ(o.mode, Mode::Static);
  EXPECT_EQ(o.profileSteps, 7);
  EXPECT_EQ(o.globalBatch, 96);
  EXPECT_EQ(o.rebalanceThreshold, BalancerOptions{}.rebalanceThreshold);
  ::setenv("HETRA_BALANCE_MODE", "greedy", 1);
  expectConfigError([] { BalancerOptions::fromParams(96); }, "'greedy'");
  ::unsetenv("HETRA_BALANCE_MODE");
  ::unsetenv("HETRA_BALANCE_PROFILE_STEPS");
  EXPECT_EQ(BalancerOptions::fromParams(96).mode, Mode::Dynamic);
}

TEST(Balancer, MisuseIsAnEnforceError) {
  Balancer b(options(10), capsOf({8, 8}));
  EXPECT_THROW(b.observe(2, 4, 0.1), EnforceError);
  EXPECT_THROW(b.observe(0, 0, 0.1), EnforceError);
  EXPECT_THROW(b.observe(0, 4, std::nan("")), EnforceError);
  EXPECT_THROW(b.observe(0, 4, -1.0), EnforceError);
  b.endStep(5);
  EXPECT_THROW(b.endStep(5), EnforceError);
}

}  // namespace
}  // namespace hetra::balance
