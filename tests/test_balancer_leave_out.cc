// The balancer leaves out a device no share pays for (balance/balancer.h, "left out"): simulated
// devices with a per-sample cost and a step cost (the optimizer step, which a slow device pays
// in full whatever its share), timings with noise, and the communication the step does not hide.
// Each expectation is checked against the devices' true costs, computed here by brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include "balance/balancer.h"
#include "common/errors.h"

namespace hetra::balance {
namespace {

struct Device {
  double perSample;  // true seconds per sample
  double stepCost;   // true seconds of its optimizer step, whatever its share
};

// The devices' true step under `shares`, `leftOut` ranks costing nothing, plus `communication`
// when more than one rank is in.
double trueStep(const std::vector<Device>& devices, const std::vector<int64_t>& shares,
                const std::vector<bool>& leftOut, double communication) {
  double worst = 0.0;
  int members = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (leftOut[i]) continue;
    ++members;
    worst = std::max(worst, devices[i].stepCost + devices[i].perSample * double(shares[i]));
  }
  return worst + (members > 1 ? communication : 0.0);
}

// The best true step over every split of `total` between two devices, with both in.
double bestWithBoth(const std::vector<Device>& devices, int64_t total, double communication) {
  double best = std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b <= total; ++b)
    best = std::min(best, trueStep(devices, {total - b, b}, {false, false}, communication));
  return best;
}

class Simulation {
 public:
  Simulation(std::vector<Device> devices, double communication, uint32_t seed)
      : devices_(std::move(devices)), communication_(communication), rng_(seed) {}

  // One step of the balancer's plan: each rank in the group reports its micro-batches and its
  // step cost (a rank with no samples still pays it), with 3% noise; a left-out rank reports
  // nothing. Returns whether the plan changed.
  bool step(Balancer& balancer, int64_t step) {
    std::uniform_real_distribution<double> jitter(0.97, 1.03);
    const Plan& plan = balancer.plan();
    int members = 0;
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      if (plan.ranks[r].leftOut) continue;
      ++members;
      int64_t left = plan.ranks[r].batch;
      while (left > 0) {
        const int64_t m = std::min(left, plan.ranks[r].microBatch);
        balancer.observe(int(r), m, devices_[r].perSample * double(m) * jitter(rng_));
        left -= m;
      }
      balancer.observeStepCost(int(r), devices_[r].stepCost * jitter(rng_));
    }
    if (members > 1) balancer.observeCommunication(communication_ * jitter(rng_));
    return balancer.endStep(step);
  }

 private:
  std::vector<Device> devices_;
  double communication_;
  std::mt19937 rng_;
};

BalancerOptions leaving(int64_t globalBatch, bool leaveOut = true) {
  BalancerOptions o;
  o.globalBatch = globalBatch;
  o.leaveOut = leaveOut;
  return o;
}

std::vector<int64_t> sharesOf(const Plan& plan) {
  std::vector<int64_t> shares;
  for (const auto& r : plan.ranks) shares.push_back(r.batch);
  return shares;
}

// The MLP of `make demo` on a fast device (20 us a sample, a 0.6 ms optimizer step) beside one
// 30 times slower: the slow one's optimizer step alone (18 ms) outlasts the fast one's whole
// step over all 512 samples (10.8 ms), so no share pays for it.
const std::vector<Device> kFastAndCrawling = {{20e-6, 0.6e-3}, {600e-6, 18e-3}};

TEST(BalancerLeaveOut, ADeviceWhoseStepCostOutlastsTheOthersWholeStepIsLeftOut) {
  const int64_t total = 512;
  Simulation sim(kFastAndCrawling, 0.5e-3, 1);
  Balancer b(leaving(total), std::vector<RankCaps>(2));
  int64_t leftAt = -1;
  for (int64_t step = 0; step < 40; ++step) {
    sim.step(b, step);
    if (leftAt < 0 && b.plan().ranks[1].leftOut) leftAt = step;
  }
  const Plan& p = b.plan();
  ASSERT_TRUE(p.ranks[1].leftOut) << p.summary();
  // Not at the profiling decision (the end of step 4), which splits with every rank; once the same
  // rank was the one to leave for persistSteps decisions and the split held minStepsBetweenChanges.
  EXPECT_GT(leftAt, 4);
  EXPECT_LE(leftAt, 4 + 6);
  EXPECT_FALSE(p.ranks[0].leftOut);
  EXPECT_EQ(sharesOf(p), (std::vector<int64_t>{512, 0}));
  EXPECT_EQ(p.leftOut(), (std::vector<bool>{false, true}));
  EXPECT_NE(p.summary().find(" out]"), std::string::npos) << p.summary();
  EXPECT_NE(p.reason.find("rank 1 left out"), std::string::npos) << p.reason;
  // The fast device alone beats the best split with both, by the devices' true costs.
  const double alone = trueStep(kFastAndCrawling, {512, 0}, {false, true}, 0.5e-3);
  EXPECT_LT(alone, bestWithBoth(kFastAndCrawling, total, 0.5e-3));
  EXPECT_NEAR(p.predictedStepSeconds, alone, 0.05 * alone) << p.summary();
}

// Without the option (ZeRO, pipelines, periodic averaging: loops that need every rank) the same
// device keeps its place in the group; the split gives it what the step cost leaves, nothing here.
TEST(BalancerLeaveOut, WithoutTheOptionEveryRankStays) {
  Simulation sim(kFastAndCrawling, 0.5e-3, 1);
  Balancer b(leaving(512, false), std::vector<RankCaps>(2));
  for (int64_t step = 0; step < 40; ++step) sim.step(b, step);
  EXPECT_EQ(b.plan().leftOut(), (std::vector<bool>{false, false})) << b.plan().summary();
  EXPECT_EQ(b.plan().reason.find("left out"), std::string::npos) << b.plan().reason;
}

// A device that adds more than it costs stays: {1, 2, 4} speeds with step costs in proportion and
// a communication of 5% of the step; the split converges within 3% of the true best one.
TEST(BalancerLeaveOut, DevicesThatAddMoreThanTheyCostStay) {
  const std::vector<Device> devices = {{20e-6, 0.6e-3}, {40e-6, 1.2e-3}, {80e-6, 2.4e-3}};
  const int64_t total = 512;
  Simulation sim(devices, 0.3e-3, 2);
  Balancer b(leaving(total), std::vector<RankCaps>(3));
  for (int64_t step = 0; step < 60; ++step) sim.step(b, step);
  const Plan& p = b.plan();
  EXPECT_EQ(p.leftOut(), (std::vector<bool>(3, false))) << p.summary();
  double best = std::numeric_limits<double>::infinity();
  for (int64_t b1 = 0; b1 <= total; ++b1)
    for (int64_t b2 = 0; b1 + b2 <= total; ++b2)
      best = std::min(best,
                      trueStep(devices, {total - b1 - b2, b1, b2}, {false, false, false}, 0.3e-3));
  EXPECT_LE(trueStep(devices, sharesOf(p), p.leftOut(), 0.3e-3), 1.03 * best) << p.summary();
}

// The communication decides where compute alone would keep a device: a device 6 times slower
// (3.6 ms optimizer step) gains the fast one 9.6% of its compute, less than a 2 ms communication
// costs the pair; with no communication to pay it stays.
TEST(BalancerLeaveOut, TheCommunicationAPairPaysCanOutweighWhatTheSlowerDeviceAdds) {
  const std::vector<Device> devices = {{20e-6, 0.6e-3}, {120e-6, 3.6e-3}};
  const int64_t total = 512;
  const double alone = trueStep(devices, {total, 0}, {false, true}, 0.0);
  ASSERT_LT(bestWithBoth(devices, total, 0.0), 0.95 * alone);  // the pair's compute is faster
  ASSERT_GT(bestWithBoth(devices, total, 2e-3), alone);        // not once it communicates

  Simulation talking(devices, 2e-3, 3);
  Balancer out(leaving(total), std::vector<RankCaps>(2));
  for (int64_t step = 0; step < 40; ++step) talking.step(out, step);
  EXPECT_EQ(out.plan().leftOut(), (std::vector<bool>{false, true})) << out.plan().summary();

  Simulation silent(devices, 0.0, 3);
  Balancer stays(leaving(total), std::vector<RankCaps>(2));
  for (int64_t step = 0; step < 40; ++step) silent.step(stays, step);
  EXPECT_EQ(stays.plan().leftOut(), (std::vector<bool>{false, false})) << stays.plan().summary();
  EXPECT_GT(stays.plan().ranks[1].batch, 0) << stays.plan().summary();
}

// Of three devices the crawling one leaves and the two others share the batch by their speeds;
// the rank left out is never given a sample again (no re-measuring probe).
TEST(BalancerLeaveOut, TheOthersShareTheBatchAndTheLeftOutRankGetsNoProbe) {
  const std::vector<Device> devices = {{600e-6, 18e-3}, {40e-6, 1.2e-3}, {20e-6, 0.6e-3}};
  const int64_t total = 512;
  Simulation sim(devices, 0.3e-3, 4);
  Balancer b(leaving(total), std::vector<RankCaps>(3));
  for (int64_t step = 0; step < 3000; ++step) {
    sim.step(b, step);
    if (step >= 20) {
      ASSERT_TRUE(b.plan().ranks[0].leftOut) << "step " << step << ": " << b.plan().summary();
      ASSERT_EQ(b.plan().ranks[0].batch, 0) << "step " << step << ": " << b.plan().summary();
    }
  }
  const Plan& p = b.plan();
  EXPECT_FALSE(p.ranks[1].leftOut || p.ranks[2].leftOut) << p.summary();
  // The two others' split within 2% of their true best one.
  double best = std::numeric_limits<double>::infinity();
  for (int64_t b1 = 0; b1 <= total; ++b1)
    best = std::min(best, trueStep(devices, {0, b1, total - b1}, {true, false, false}, 0.3e-3));
  EXPECT_LE(trueStep(devices, sharesOf(p), p.leftOut(), 0.3e-3), 1.02 * best) << p.summary();
}

// A saved balancer (checkpoints) keeps its left-out ranks and its measured communication: the
// loaded one makes the same decisions; a state from before left-out ranks (format 2) loads with
// every rank in.
TEST(BalancerLeaveOut, SaveAndLoadKeepTheLeftOutRanks) {
  Simulation sim(kFastAndCrawling, 0.5e-3, 6);
  Balancer b(leaving(512), std::vector<RankCaps>(2));
  for (int64_t step = 0; step < 30; ++step) sim.step(b, step);
  ASSERT_TRUE(b.plan().ranks[1].leftOut);
  Balancer loaded = Balancer::load(b.save());
  EXPECT_EQ(loaded.plan().leftOut(), b.plan().leftOut());
  EXPECT_EQ(loaded.save(), b.save());
  Simulation again(kFastAndCrawling, 0.5e-3, 7), same(kFastAndCrawling, 0.5e-3, 7);
  for (int64_t step = 30; step < 60; ++step) {
    again.step(b, step);
    same.step(loaded, step);
  }
  EXPECT_EQ(loaded.save(), b.save());

  // Format 2 had no left-out ranks: what it says of them is not read.
  std::string old = b.save();
  old.replace(old.find("\"format\":3"), 10, "\"format\":2");
  EXPECT_EQ(Balancer::load(old).plan().leftOut(), (std::vector<bool>{false, false}));
  // Every rank out, or a left-out rank with samples, is not a state the balancer makes.
  std::string bad = b.save();
  bad.replace(bad.find("\"left_out\":[false,true]"), 23, "\"left_out\":[true,true]");
  EXPECT_THROW(Balancer::load(bad), ConfigError);
  std::string busy = b.save();
  busy.replace(busy.find("\"left_out\":[false,true]"), 23, "\"left_out\":[true,false]");
  EXPECT_THROW(Balancer::load(busy), ConfigError);
}

TEST(BalancerLeaveOut, NotWithSharesWithinCaps) {
  BalancerOptions o = leaving(64);
  o.sharesWithinCaps = true;
  EXPECT_THROW(Balancer(o, std::vector<RankCaps>(2)), ConfigError);
}

TEST(BalancerLeaveOut, CommunicationMustBeAFiniteNonNegativeTime) {
  Balancer b(leaving(64), std::vector<RankCaps>(2));
  EXPECT_THROW(b.observeCommunication(-1e-3), EnforceError);
  EXPECT_THROW(b.observeCommunication(std::numeric_limits<double>::infinity()), EnforceError);
}

}  // namespace
}  // namespace hetra::balance
