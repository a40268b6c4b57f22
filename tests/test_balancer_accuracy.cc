// How close the balancer's split comes to the best one, on synthetic devices whose true curves are
// known to this file only: linear, with fixed per-micro-batch costs, non-linear (per-sample cost
// falling with the micro-batch), with noise on every micro-batch and outlier steps, with memory
// caps. The reference optimum is an enumeration of every integer split over the true curves,
// independent of allocation.cc and of the balancer's models.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "balance/balancer.h"
#include "common/errors.h"

namespace hetra::balance {
namespace {

constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max();

// True time of one micro-batch of m samples: a + c*m + d*sqrt(m). d > 0 makes the per-sample cost
// fall with m (small micro-batches use a device poorly), a > 0 is a fixed cost per micro-batch.
struct Curve {
  double fixed = 0.0, perSample = 0.0, concave = 0.0;
  double seconds(int64_t m) const {
    return fixed + perSample * double(m) + concave * std::sqrt(double(m));
  }
};

struct Device {
  Curve curve;
  int64_t cap = kNoCap;
  // True seconds the device spends once per step whatever its share, before its micro-batches
  // (data parallelism's optimizer step, at the device's speed).
  double update = 0.0;
};

// b samples as the trainer runs them: ceil(b / cap) micro-batches as even as possible.
std::vector<int64_t> microBatches(int64_t b, int64_t cap) {
  std::vector<int64_t> sizes;
  if (b <= 0) return sizes;
  const int64_t k = b / cap + (b % cap != 0);
  for (int64_t j = 0; j < k; ++j) sizes.push_back(b / k + (j < b % k ? 1 : 0));
  return sizes;
}

double trueSeconds(const Device& d, int64_t b) {
  double total = d.update;
  for (int64_t m : microBatches(b, d.cap)) total += d.curve.seconds(m);
  return total;
}

double trueStep(const std::vector<Device>& devices, const std::vector<int64_t>& shares) {
  double worst = 0.0;
  for (size_t i = 0; i < devices.size(); ++i)
    worst = std::max(worst, trueSeconds(devices[i], shares[i]));
  return worst;
}

// The least true step over every split of B over three devices, by enumeration.
double bruteForceOptimum(const std::vector<Device>& devices, int64_t total) {
  EXPECT_EQ(devices.size(), 3u);
  double best = std::numeric_limits<double>::infinity();
  for (int64_t b0 = 0; b0 <= total; ++b0)
    for (int64_t b1 = 0; b0 + b1 <= total; ++b1)
      best = std::min(best, trueStep(devices, {b0, b1, total - b0 - b1}));
  return best;
}

std::vector<int64_t> sharesOf(const Plan& plan) {
  std::vector<int64_t> shares;
  for (const auto& r : plan.ranks) shares.push_back(r.batch);
  return shares;
}

// Runs the balancer's plans on the devices: every micro-batch's true time times uniform noise of
// +-noise; with probability outlierRate a rank's whole step is 3x slower (preempted), and with the
// same probability one micro-batch is 5x slower (a late sleep).
class Cluster {
 public:
  Cluster(std::vector<Device> devices, double noise, double outlierRate, uint32_t seed,
          bool reportUpdates = true)
      : devices_(std::move(devices)),
        noise_(noise),
        outlierRate_(outlierRate),
        reportUpdates_(reportUpdates),
        rng_(seed) {}

  std::vector<Device>& devices() { return devices_; }

  bool step(Balancer& balancer, int64_t step) {
    std::uniform_real_distribution<double> jitter(1.0 - noise_, 1.0 + noise_), unit(0.0, 1.0);
    const Plan& plan = balancer.plan();
    for (size_t r = 0; r < devices_.size(); ++r) {
      const double wholeStep = unit(rng_) < outlierRate_ ? 3.0 : 1.0;
      const auto sizes = microBatches(plan.ranks[r].batch, devices_[r].cap);
      const size_t late = unit(rng_) < outlierRate_ ? 0 : sizes.size();
      EXPECT_LE(plan.ranks[r].microBatch, devices_[r].cap) << plan.summary();
      for (size_t j = 0; j < sizes.size(); ++j)
        balancer.observe(int(r), sizes[j],
                         devices_[r].curve.seconds(sizes[j]) * jitter(rng_) * wholeStep *
                             (j == late ? 5.0 : 1.0));
      if (reportUpdates_ && devices_[r].update > 0.0)
        balancer.observeStepCost(int(r), devices_[r].update * jitter(rng_) * wholeStep);
    }
    return balancer.endStep(step);
  }

 private:
  std::vector<Device> devices_;
  double noise_, outlierRate_;
  bool reportUpdates_;
  std::mt19937 rng_;
};

std::vector<RankCaps> capsOf(const std::vector<Device>& devices) {
  std::vector<RankCaps> caps;
  for (const auto& d : devices) caps.push_back({d.cap});
  return caps;
}

BalancerOptions options(int64_t total) {
  BalancerOptions o;
  o.globalBatch = total;
  return o;
}

// Three devices of random speeds (up to 5x apart); the curve's kind follows the seed: linear,
// fixed costs, non-linear at small micro-batches, and all of it with outlier steps and a cap.
struct Scenario {
  std::vector<Device> devices;
  double outlierRate = 0.0;
  std::string kind;
};

Scenario scenario(uint32_t seed) {
  std::mt19937 rng(seed * 7919u);
  std::uniform_real_distribution<double> speed(1.0, 5.0), share(0.1, 0.6);
  Scenario s;
  const int kind = int(seed % 4);
  s.kind = std::vector<std::string>{"linear", "fixed costs", "non-linear", "outliers+caps"}[kind];
  for (int r = 0; r < 3; ++r) {
    Device d;
    const double perSample = 1e-4 * speed(rng);  // seconds per sample at large micro-batches
    d.curve.perSample = perSample;
    if (kind >= 1) d.curve.fixed = share(rng) * perSample * 40;  // a share of a 40-sample batch
    if (kind >= 2) d.curve.concave = share(rng) * perSample * 12;
    if (kind == 3 && r == 0) d.cap = 24;
    s.devices.push_back(d);
  }
  s.outlierRate = kind == 3 ? 0.05 : 0.0;
  return s;
}

// --- The model of one device --------------------------------------------------------------

// The fit's uncertainty means what it says: over 200 seeds of +-5% uniform noise (a standard
// deviation of 5% / sqrt(3)) at two sizes, the true time at a size between them is within two
// standard errors of the prediction in at least 90% of the seeds, and the noise estimate is close
// to the noise.
TEST(ThroughputModelUncertainty, StandardErrorCoversTheTrueCurve) {
  const Curve truth{2e-3, 1e-4, 0.0};
  const double sigma = 0.05 / std::sqrt(3.0);
  int covered = 0;
  double noiseSum = 0.0;
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> jitter(0.95, 1.05);
    ThroughputModel model;
    for (int64_t step = 0; step < 30; ++step) {
      const int64_t m = step % 2 == 0 ? 32 : 48;
      model.addStep(step, {{m, truth.seconds(m) * jitter(rng)}});
    }
    const CostModel& c = model.cost();
    covered += std::abs(c.seconds(40, 1) - truth.seconds(40)) <= 2.0 * c.standardError(40, 1);
    noiseSum += c.noise;
  }
  EXPECT_GE(covered, 180);
  EXPECT_NEAR(noiseSum / 200 / sigma, 1.0, 0.3);
}

// Per-sample cost falling with the micro-batch (t = a + c m + d sqrt(m)): after steps at several
// sizes, the model is the curve's tangent where the rank runs now, exact in level there within
// 1.5% and in slope within 10%, wherever that is.
TEST(ThroughputModelUncertainty, FollowsANonLinearCurveWhereTheRankRuns) {
  const Curve truth{5e-4, 1e-4, 1.5e-3};
  for (int64_t now : {12, 40, 160}) {
    ThroughputModel model;
    const std::vector<int64_t> sizes = {8, 16, 32, 64, 128, 256};
    int64_t step = 0;
    for (; step < 24; ++step)
      model.addStep(step, {{sizes[size_t(step) % 6], truth.seconds(sizes[size_t(step) % 6])}});
    for (int k = 0; k < 6; ++k, ++step) model.addStep(step, {{now, truth.seconds(now)}});
    const CostModel& c = model.cost();
    EXPECT_NEAR(c.seconds(now, 1) / truth.seconds(now), 1.0, 0.015) << "at " << now;
    const double slope = truth.perSample + 0.5 * truth.concave / std::sqrt(double(now));
    EXPECT_NEAR(c.perSample / slope, 1.0, 0.1) << "at " << now;
  }
}

// A neighbour's burst of work slows a rank erratically for a few steps (1.5x, 3x, 1.8x): outliers,
// and the model stays; a device that became 2x slower (every step 2x, +-2%) is taken after
// kChangeSteps steps.
TEST(ThroughputModelUncertainty, ErraticSlowStepsAreNotAChangeOfSpeed) {
  for (bool erratic : {true, false}) {
    ThroughputModel model;
    int64_t step = 0;
    for (; step < 20; ++step) model.addStep(step, {{100, step % 2 ? 0.101 : 0.099}});
    const std::vector<double> factors =
        erratic ? std::vector<double>{1.5, 3.0, 1.8} : std::vector<double>{2.02, 1.98, 2.0};
    for (double factor : factors) model.addStep(step++, {{100, 0.1 * factor}});
    EXPECT_EQ(model.changes(), erratic ? 0 : 1);
    EXPECT_NEAR(model.cost().perSample, erratic ? 0.001 : 0.002, 5e-5)
        << (erratic ? "erratic" : "lasting");
  }
}

constexpr int64_t kBatch = 192;

struct SimulatedRun {
  Balancer balancer;
  int changes = 0;  // plan changes at or after step countFrom
};

// `steps` steps of the scenario, +-5% noise on every micro-batch and its outliers.
SimulatedRun run(const Scenario& s, uint32_t seed, int64_t steps, int64_t countFrom) {
  Cluster cluster(s.devices, 0.05, s.outlierRate, seed);
  SimulatedRun r{Balancer(options(kBatch), capsOf(s.devices))};
  for (int64_t step = 0; step < steps; ++step)
    r.changes += cluster.step(r.balancer, step) && step >= countFrom;
  return r;
}

// The tests' main claim: after 80 steps the split's true step time is within 2% of the optimum,
// for every one of 50 seeds (noise +-5% on every micro-batch).
TEST(BalancerAccuracy, WithinTwoPercentOfBruteForceOptimumForFiftySeeds) {
  double worst = 0.0;
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    const Scenario s = scenario(seed);
    const Balancer balancer = run(s, seed, 80, 80).balancer;
    const double optimum = bruteForceOptimum(s.devices, kBatch);
    const double ratio = trueStep(s.devices, sharesOf(balancer.plan())) / optimum;
    worst = std::max(worst, ratio);
    EXPECT_LE(ratio, 1.02) << "seed " << seed << " (" << s.kind
                           << "): " << balancer.plan().summary();
  }
  std::cout << "worst true step over the optimum, 50 seeds: " << worst << "\n";
}

// Profiling measures rank 0 at half its speed (a warm-up: caches, allocator, a neighbour), so the
// first split starves it; the measurements after that correct the split within 20 steps.
TEST(BalancerAccuracy, BadFirstFitIsCorrectedWithinTwentySteps) {
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    Scenario s = scenario(seed);
    Cluster cluster(s.devices, 0.05, 0.0, seed);
    const Curve real = s.devices[0].curve;
    cluster.devices()[0].curve.perSample *= 2.0;
    cluster.devices()[0].curve.fixed *= 2.0;
    cluster.devices()[0].curve.concave *= 2.0;
    Balancer balancer(options(kBatch), capsOf(s.devices));
    const int64_t profile = balancer.options().profileSteps;
    int64_t step = 0;
    for (; step < profile; ++step) cluster.step(balancer, step);
    cluster.devices()[0].curve = real;
    const double optimum = bruteForceOptimum(cluster.devices(), kBatch);
    EXPECT_GT(trueStep(cluster.devices(), sharesOf(balancer.plan())) / optimum, 1.05)
        << "seed " << seed << ": the first fit should be bad";
    int64_t correctedAt = -1;
    for (; step < profile + 60; ++step) {
      cluster.step(balancer, step);
      const double ratio = trueStep(cluster.devices(), sharesOf(balancer.plan())) / optimum;
      if (correctedAt < 0 && ratio <= 1.03) correctedAt = step - profile + 1;
    }
    EXPECT_GE(correctedAt, 1) << "seed " << seed << ": " << balancer.plan().summary();
    EXPECT_LE(correctedAt, 20) << "seed " << seed << ": " << balancer.plan().summary();
    EXPECT_LE(trueStep(cluster.devices(), sharesOf(balancer.plan())) / optimum, 1.02)
        << "seed " << seed << ": " << balancer.plan().summary();
  }
}

// The slowest device becomes twice as fast at step 60 (and another one 1.5x slower at step 140):
// from 12 steps after each change on, the split is within 5% of the new optimum, and within 2.5%
// at the end of each phase: a sure gain must exceed the threshold beyond +-5% noise, so a split
// a sample or two from the best one stays (over 60 seeds the worst phase end reads 1.025, the
// mean 1.006; 1.029 and 1.007 before the model kept a device's shape over a change of speed).
TEST(BalancerAccuracy, TracksACurveThatChangesMidRun) {
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    const Scenario s = scenario(seed);
    Cluster cluster(s.devices, 0.05, 0.0, seed);
    Balancer balancer(options(kBatch), capsOf(s.devices));
    size_t slowest = 0;
    for (size_t r = 1; r < 3; ++r)
      if (s.devices[r].curve.perSample > s.devices[slowest].curve.perSample) slowest = r;
    auto scale = [&](size_t r, double factor) {
      Curve& c = cluster.devices()[r].curve;
      c.fixed *= factor, c.perSample *= factor, c.concave *= factor;
    };
    double optimum = bruteForceOptimum(cluster.devices(), kBatch);
    for (int64_t step = 0; step < 220; ++step) {
      if (step == 60) scale(slowest, 0.5);
      if (step == 140) scale((slowest + 1) % 3, 1.5);
      if (step == 60 || step == 140) optimum = bruteForceOptimum(cluster.devices(), kBatch);
      cluster.step(balancer, step);
      const double ratio = trueStep(cluster.devices(), sharesOf(balancer.plan())) / optimum;
      const int64_t since = step < 60 ? step : step < 140 ? step - 60 : step - 140;
      if (step >= 60 && since >= 12) {
        EXPECT_LE(ratio, 1.05) << "seed " << seed << " step " << step << ": "
                               << balancer.plan().summary();
      }
      if (step == 139 || step == 219) {
        EXPECT_LE(ratio, 1.025) << "seed " << seed << " step " << step << ": "
                                << balancer.plan().summary();
      }
    }
  }
}

// Stationary curves: after convergence (step 60) the split changes at most 3 times in 240 steps
// of any run and at most 20 times over 40 runs, with +-5% noise and outliers.
TEST(BalancerAccuracy, NoOscillationOnStationaryCurves) {
  int all = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    const Scenario s = scenario(seed);
    const SimulatedRun r = run(s, seed, 300, 60);
    EXPECT_LE(r.changes, 3) << "seed " << seed << " (" << s.kind
                            << "): " << r.balancer.plan().summary();
    all += r.changes;
  }
  EXPECT_LE(all, 20);
  std::cout << "plan changes after convergence over 40 runs: " << all << "\n";
}

// Data parallelism on devices 1, 2 and 4 times slower than the fastest: each updates the same
// parameters after the all-reduce at its own speed (the update costs the fastest 8 samples'
// compute), so the slowest starts its micro-batches latest. With the update measured as a step
// cost the split is within 2% of the brute-force optimum that counts it, over 20 seeds; fed the
// micro-batch times alone (the equal ends of compute the balancer aimed at before 2026-12-05)
// the same runs are further off than that.
TEST(BalancerAccuracy, SlowUpdatesAreStepCostsThatMoveSamplesAway) {
  double worstWith = 0.0, worstWithout = 0.0;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> spread(0.9, 1.1);
    std::vector<Device> devices;
    for (double slowdown : {1.0, 2.0, 4.0}) {
      Device d;
      d.curve.perSample = 1e-4 * slowdown * spread(rng);
      d.curve.fixed = 2e-4 * slowdown * spread(rng);
      d.update = 8e-4 * slowdown * spread(rng);
      devices.push_back(d);
    }
    const double optimum = bruteForceOptimum(devices, kBatch);
    for (bool reported : {true, false}) {
      Cluster cluster(devices, 0.05, 0.0, seed, reported);
      Balancer balancer(options(kBatch), capsOf(devices));
      for (int64_t step = 0; step < 80; ++step) cluster.step(balancer, step);
      const double ratio = trueStep(devices, sharesOf(balancer.plan())) / optimum;
      (reported ? worstWith : worstWithout) = std::max(reported ? worstWith : worstWithout, ratio);
      if (reported) {
        EXPECT_LE(ratio, 1.02) << "seed " << seed << ": " << balancer.plan().summary();
      }
    }
  }
  EXPECT_GT(worstWithout, 1.04) << "the scenario should need the step cost";
  std::cout << "worst true step over the optimum, 20 seeds: " << worstWith
            << " with the update as a step cost, " << worstWithout << " without\n";
}

// Devices 1, 2 and 4 times slower than the fastest, each with a fixed cost of 32 samples' worth
// per micro-batch and an update of 24 samples' worth (as hetra.torch's Python calls are on an
// emulated device), 512 samples a step. At step 60 a neighbour's burst makes the slowest device
// 3x slower for 4 steps, which its model reads as a change of speed: it drops to a small share and
// the points before the burst are gone. Measured at that small share alone, the fixed cost is
// not to be taken for a per-sample cost (the model keeps the device's shape): from 60 steps after
// the burst on, the split is within 3% of the brute-force optimum, in every one of 10 seeds
// (before 2026-12-06 the slowest device stayed at 5-6 samples for good: 1.06 of the optimum).
TEST(BalancerAccuracy, RankDroppedToASmallShareByABurstComesBack) {
  constexpr int64_t kTotal = 512;
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    std::vector<Device> devices;
    for (double slowdown : {1.0, 2.0, 4.0}) {
      Device d;
      d.curve.perSample = 2.5e-5 * slowdown;
      d.curve.fixed = 32 * d.curve.perSample;
      d.update = 24 * d.curve.perSample;
      devices.push_back(d);
    }
    const double optimum = bruteForceOptimum(devices, kTotal);
    Cluster cluster(devices, 0.08, 0.0, seed);
    Balancer balancer(options(kTotal), capsOf(devices));
    int64_t smallest = kTotal, worstAfter = 0;
    double worst = 0.0;
    for (int64_t step = 0; step < 160; ++step) {
      const bool burst = step >= 60 && step < 64;
      Device& slowest = cluster.devices()[2];
      slowest = devices[2];
      if (burst) slowest.curve.perSample *= 3, slowest.curve.fixed *= 3, slowest.update *= 3;
      cluster.step(balancer, step);
      if (step >= 64) smallest = std::min(smallest, balancer.plan().ranks[2].batch);
      if (step >= 64 + 60) {
        const double ratio = trueStep(devices, sharesOf(balancer.plan())) / optimum;
        if (ratio > worst) worst = ratio, worstAfter = step;
      }
    }
    EXPECT_LT(smallest, 30) << "seed " << seed << ": the burst should have moved samples away";
    EXPECT_LE(worst, 1.03) << "seed " << seed << " at step " << worstAfter << ": "
                           << balancer.plan().summary();
  }
}

// A rank whose one sample costs more than the step gets none, and is then never measured; every
// minStepsBetweenChanges * e / kProbeCost steps (e: one sample's predicted excess over the step)
// it gets one sample again, so a device that got faster is found. Here one sample makes the step
// 1.5x (a probe once in 75 steps); at step 100 the device becomes as fast as the others. Over the
// first 100 steps the probes cost at most 3% of the step on average; by step 250 the split is
// within 2% of the new optimum.
TEST(BalancerAccuracy, RankWithoutSamplesIsMeasuredAgainAtABoundedCost) {
  double worstExcess = 0.0;
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    std::vector<Device> devices(3);
    for (auto& d : devices) d.curve.perSample = 1e-4;
    Device& slow = devices[2];
    slow.curve.fixed = 1.5 * 1e-4 * kBatch / 2;  // one sample: 1.5x the others' step
    const std::vector<Device> fast = {devices[0], devices[1], devices[0]};
    Cluster cluster(devices, 0.03, 0.0, seed);
    Balancer balancer(options(kBatch), capsOf(devices));
    const double slowOptimum = bruteForceOptimum(devices, kBatch);
    double excess = 0.0;
    int64_t probes = 0;
    for (int64_t step = 0; step < 250; ++step) {
      if (step == 100) cluster.devices() = fast;
      cluster.step(balancer, step);
      if (step >= 20 && step < 100) {
        excess += trueStep(devices, sharesOf(balancer.plan())) / slowOptimum - 1.0;
        probes += balancer.plan().ranks[2].batch == 1;
      }
    }
    EXPECT_GE(probes, 1) << "seed " << seed << ": the rank was never measured again";
    EXPECT_LE(excess / 80.0, 0.03) << "seed " << seed;
    worstExcess = std::max(worstExcess, excess / 80.0);
    EXPECT_LE(trueStep(fast, sharesOf(balancer.plan())) / bruteForceOptimum(fast, kBatch), 1.02)
        << "seed " << seed << ": " << balancer.plan().summary();
  }
  std::cout << "worst mean cost of the probes over 80 steps: " << worstExcess << " of the step\n";
}

// The balancer's regret is 1 - (its best split's predicted step) / (its plan's predicted step),
// with both predictions recomputed here from the fitted cost models by enumeration.
TEST(BalancerAccuracy, RegretIsTheDistanceToTheBalancersOwnIdeal) {
  const Scenario s = scenario(6);
  Cluster cluster(s.devices, 0.05, 0.0, 6);
  BalancerOptions o = options(kBatch);
  o.mode = Mode::Equal;  // the equal split stays, far from the ideal
  Balancer balancer(o, capsOf(s.devices));
  EXPECT_EQ(balancer.regret(), 0.0) << "nothing measured yet";
  for (int64_t step = 0; step < 10; ++step) cluster.step(balancer, step);
  std::vector<Device> fitted;
  for (int r = 0; r < 3; ++r)
    fitted.push_back(
        {{balancer.cost(r).overhead, balancer.cost(r).perSample, 0.0}, s.devices[size_t(r)].cap});
  const double planned = trueStep(fitted, sharesOf(balancer.plan()));
  const double best = bruteForceOptimum(fitted, kBatch);
  EXPECT_NEAR(balancer.regret(), 1.0 - best / planned, 1e-9);
  EXPECT_NEAR(balancer.idealSamplesPerSecond(), double(kBatch) / best, 1e-6 * kBatch / best);
  EXPECT_GT(balancer.regret(), 0.1);
}

// The telemetry seam: a hinted change of speed makes the rank's model start over, so one step
// at the new speed is its model; without the hint the model waits for kChangeSteps steps.
TEST(BalancerAccuracy, HintedSpeedChangeIsTakenAtOnce) {
  for (bool hinted : {false, true}) {
    Balancer balancer(options(60), {{kNoCap}, {kNoCap}});
    int64_t step = 0;
    for (; step < 20; ++step) {
      balancer.observe(0, 30, 0.030);
      balancer.observe(1, 30, 0.060);
      balancer.endStep(step);
    }
    if (hinted) balancer.hintSpeedChange(1);
    const int64_t b = balancer.plan().ranks[1].batch;
    balancer.observe(0, balancer.plan().ranks[0].batch, 0.001 * double(60 - b));
    balancer.observe(1, b, 0.001 * double(b));  // rank 1 now as fast as rank 0
    balancer.endStep(step);
    const double expected = hinted ? 0.001 : 0.002;
    EXPECT_NEAR(balancer.cost(1).perSample, expected, 1e-4) << (hinted ? "hinted" : "not hinted");
  }
  Balancer balancer(options(60), {{kNoCap}, {kNoCap}});
  EXPECT_THROW(balancer.hintSpeedChange(2), EnforceError);
}

}  // namespace
}  // namespace hetra::balance
