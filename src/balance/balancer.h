// The load balancer: decides each rank's share of the global batch, its micro-batch size and its
// accumulation steps, from measured micro-batch compute times only. Pure logic: no processes, no
// clocks, no LibTorch. Deterministic: the same calls in the same order give the same plans, so
// every rank can run its own Balancer on the same (all-gathered) timings and reach the same
// decisions. Not thread-safe: one caller at a time.
//
// Vocabulary (share, cap, k, m and T_i(b) as in allocation.h; cost model and window as in
// throughput_model.h):
//   plan        per-rank (b_i, m_i, k_i) with predicted times, a version that increments on every
//               change of the split, and the reason for the last change.
//   candidate   the optimal plan under the current cost models.
//   gain        (T(plan) - T(candidate)) / T(plan), both predicted by the current models
//               (compute time and step costs: communication does not depend on the split).
//   draws       64 sets (kDraws) of cost models drawn from each rank's fit uncertainty (its
//               covariance), from a generator seeded by the step: the same on every rank. The
//               same draws price every split of a step, so splits near each other, predicted from
//               the same data, differ only by what the data say about the difference.
//   sure gain   the 5% quantile (kSureQuantile) of the gain over the draws: the part of the gain
//   that
//               the models' uncertainty (from the measured step noise) does not explain.
//   move        a split part of the way from the plan to the candidate (a fraction 1, 1/2 or 1/4
//               of every rank's change): the farthest whose sure gain exceeds the threshold. A
//               model is surest near where it was measured, so when the whole way is not sure,
//               half of it may be; the next steps measure there and refine.
//   probe       a fraction adopted although no move is sure, when the predicted gain is beyond
//               what the noise of converged models makes (kProbeSigmas * sqrt(2 ln ranks) times
//               the largest relative error of a rank's level: about how far the slowest of the
//               noisy levels is off) and twice the threshold: the gain is then unsure through the
//               extrapolation, which measuring between plan and candidate settles. The farthest
//               fraction predicted to gain whose sure loss (its sure gain, negated) is at most
//               kProbeCost: a probe costs at most that.
//   re-measure  a rank given no samples is never measured again, so its model could not see it
//               recover (a preempted burst read as a change of speed would hold it at 0 for
//               good). A probe of one sample (from the rank with the most) once its last
//               measurement is older than minStepsBetweenChanges * e / kProbeCost steps, e the
//               predicted excess of that step over the plan's (at least kProbeCost): the probe
//               holds about minStepsBetweenChanges steps, so on average it costs at most
//               kProbeCost. A rank one sample of which costs 50 steps is probed once in 7500.
//   regret      (T(plan) - T(best split)) / T(plan) under the current models: how far the split
//               in use is from the balancer's own ideal.
//   left out    a rank that no share pays for (BalancerOptions::leaveOut): the best split without
//               it, plus the communication the group still needs, is predicted faster than the best
//               split with it, plus the communication it joins; where its step cost alone (its
//               optimizer step on a slow device) is longer than the others' whole step, it always
//               is. The communication is the measured part of the step no compute hides
//               (observeCommunication); a group of one rank has none. Such a rank gets no samples,
//               takes no step and joins no gradient collective from the next step on, for the
//               rest of the run (a device that speeds up later is not taken back: restart the run
//               to re-measure it); its model is no longer part of any split. The caller keeps its
//               replica up to date where it is needed (train/trainer.cc). At most one rank leaves
//               per decision, the one whose leaving gains most, and never the last one; never at
//               the profiling decision (which splits the batch with every rank first), and only
//               once the same rank was the one to leave persistSteps decisions in a row.
//   profiling   the first profileSteps steps, run on the initial equal split to measure every rank.
//   streak      consecutive steps that wanted a move or a probe.
//
// Modes:
//   dynamic     at the end of profiling adopt the farthest sure move; later, adopt a move or a
//               probe when the streak reaches persistSteps and at least minStepsBetweenChanges
//               steps ran on the current plan. Never locked in: the models are refitted from every
//               step, and any sure gain above the threshold moves the split again.
//   static      one decision at the end of profiling, the whole way to the candidate if its
//               predicted gain exceeds the threshold (no later step refines it), then fixed.
//   equal       equal split forever (PyTorch DDP), remainder to the lowest ranks; micro-batches
//               still capped by memory.
//
// Why it does not oscillate: the split changes at most once every max(minStepsBetweenChanges,
// persistSteps) steps, and only on a gain beyond the models' uncertainty for persistSteps steps.
// Noise reaches the models only through a median per step and a decaying least-squares fit with
// outliers dropped. And a plan under which the measured times are equal is optimal under every
// model that fits those measurements, so once there, no gain is predicted. Measured
// (tests/test_balancer.cc, tests/test_balancer_accuracy.cc): with +-10% uniform noise at most two
// changes in 280 steps after convergence; with +-5% and outlier steps at most three in 240.
//
// Telemetry seam: a device's own signals (GPU clocks, throttling, utilisation: NVML or ROCm SMI)
// arrive through hintSpeedChange(rank), which makes that rank's model forget the points before
// the hint, so the next steps' times alone say its new speed. Emulated devices have no telemetry;
// their measured times alone count (ThroughputModel detects a change of speed from them).
//
// Use in the training loop (same calls on every rank, or on one rank with the plan broadcast):
//   Balancer balancer(options, caps);
//   each step s: run plan().ranks[rank] (k micro-batches of at most m samples, b in all);
//     all-gather every rank's micro-batch times; observe(r, m, seconds) for each; endStep(s).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "balance/throughput_model.h"

namespace hetra::balance {

enum class Mode { Dynamic, Static, Equal };

// "dynamic", "static", "equal"; anything else is a ConfigError naming the value and what is
// allowed.
Mode parseMode(const std::string& name);
const char* modeName(Mode mode);

struct BalancerOptions {
  Mode mode = Mode::Dynamic;
  int64_t globalBatch = 0;           // B: samples per step over all ranks
  double rebalanceThreshold = 0.01;  // least sure gain (beyond timing noise) worth a change
  int minStepsBetweenChanges = 3;
  int persistSteps = 2;  // steps in a row the gain must exceed the threshold (dynamic mode)
  int profileSteps = 5;  // steps measured on the equal split before the first decision
  // Keep every share within its rank's micro-batch cap, one micro-batch each, whenever the caps
  // hold the global batch: for ZeRO stages 2 and 3, where a rank that accumulates holds the whole
  // gradient, which its cap need not hold (docs/zero.md). Where they do not, ranks accumulate.
  bool sharesWithinCaps = false;
  // Count the ranks' step costs (observeStepCost); off, they are ignored: the split then equalises
  // the micro-batches' compute alone, as before 2026-12-05 (kept to measure the difference).
  bool stepCosts = true;
  // Pull each rank's overhead toward its measured shape (throughput_model.h, "shape"); off, toward
  // 0, as before 2026-12-06 (kept to measure the difference).
  bool keepShape = true;
  // Leave out a rank whose share cannot pay for what it costs (see "left out"): for training
  // loops that can run without it (data parallelism); off, every rank keeps a share.
  bool leaveOut = false;

  // Defaults overridden by HETRA_BALANCE_MODE, _THRESHOLD, _MIN_STEPS, _PERSIST_STEPS,
  // _PROFILE_STEPS, _STEP_COSTS, _SHAPE (leaveOut is the caller's: it says whether it can).
  static BalancerOptions fromParams(int64_t globalBatch);
};

struct RankCaps {
  // Most samples one micro-batch may hold on this rank (its memory); the default means no limit.
  int64_t maxMicroBatch = std::numeric_limits<int64_t>::max();
};

struct RankAssignment {
  int64_t batch = 0;       // b_i: this rank's share of the step's samples
  int64_t microBatch = 0;  // m_i: at most this many samples per micro-batch
  int64_t accumSteps = 0;  // k_i = ceil(b_i / m_i) micro-batches; the last may be smaller than m_i
  double predictedSeconds = 0.0;  // step cost + compute time, by the current model (0: unknown)
  double overheadSeconds = 0.0;   // the model behind the prediction: a_i per micro-batch ...
  double perSampleSeconds = 0.0;  // ... and c_i per sample
  bool leftOut = false;           // no samples, no step, no gradient collective (see "left out")
};

struct Plan {
  std::vector<RankAssignment> ranks;
  double predictedStepSeconds = 0.0;  // max over ranks of predictedSeconds
  int64_t version = 0;                // 0 for the initial plan, +1 on every change of the split
  std::string reason;  // why the split is what it is, e.g. "rebalance at step 103: ..."

  // One line for logs: "v2 [b/m/k: 73/73/1 146/146/1 293/293/1] predicted 0.293s (reason)"; a
  // left-out rank reads "out".
  std::string summary() const;
  // Whether each rank is left out.
  std::vector<bool> leftOut() const;
};

class Balancer {
 public:
  // Throws ConfigError for an impossible setting (naming the option and its value).
  Balancer(BalancerOptions options, std::vector<RankCaps> caps);

  // The current plan. Its predicted times are refreshed with the models at every endStep; its
  // version and reason change only with the split.
  const Plan& plan() const { return plan_; }
  const BalancerOptions& options() const { return options_; }
  int ranks() const { return int(caps_.size()); }

  // One micro-batch of `microBatch` samples took `seconds` of compute (forward + backward) on
  // `rank`.
  void observe(int rank, int64_t microBatch, double seconds);
  // The step's step cost on `rank` (throughput_model.h, "step cost"): seconds it spent outside its
  // micro-batches that every share pays alike, e.g. its optimizer step. Optional: a rank never
  // observed so has a step cost of 0.
  void observeStepCost(int rank, double seconds);
  // The step's communication that no compute hid (e.g. the gradient collectives' tail after the
  // last rank's backward), with the ranks not left out. Optional: without it leaving a rank out
  // saves only its compute and step cost.
  void observeCommunication(double seconds);
  // Call once all ranks' observations of `step` are in (steps increase). Returns true if the plan
  // changed; the new plan applies from the next step on.
  bool endStep(int64_t step);

  // A new memory bound for `rank`'s micro-batches (measured, balance/memory_caps.h): the plan keeps
  // its split and takes the rank's new micro-batch and accumulation steps from the next plan() on.
  // Returns whether the bound changed. Deterministic as the rest: call it on every rank alike.
  bool setMaxMicroBatch(int rank, int64_t maxMicroBatch);
  int64_t maxMicroBatch(int rank) const;

  // The rank's current cost model (unknown until it was observed).
  const CostModel& cost(int rank) const;
  // Gain of the candidate over the plan at the last endStep (0 before any decision).
  double lastGain() const { return lastGain_; }
  // Sure gain of the candidate at the last endStep (0 before any decision).
  double lastSureGain() const { return lastSureGain_; }
  // The regret of the current plan under the current models, in [0, 1); 0 until every rank's
  // model is fitted.
  double regret() const;
  // A device's telemetry says rank's speed changed now (see "Telemetry seam"): its model forgets
  // the points measured before, from the next endStep on.
  void hintSpeedChange(int rank);
  // The balancer's own prediction of the best synchronous step: under the current models T_i(b)
  // (with the memory caps), min over splits sum b_i = B of max_i T_i(b_i), with no communication,
  // as samples per second B / that step. The "balancer-optimal ideal" of docs/benchmarks.md as
  // the balancer sees it, whatever the mode and the current plan. 0 until every rank's model is
  // fitted.
  double idealSamplesPerSecond() const;

  // Exact state (options, caps, models, plan, pending observations, policy counters) as JSON text;
  // load() of it makes the same future decisions as this balancer.
  std::string save() const;
  static Balancer load(const std::string& state);

 private:
  bool modelsKnown() const;
  // Whether shares stay within the caps now (the option, and the caps hold the batch).
  bool withinCaps() const;
  std::vector<int64_t> firstShares() const;
  std::vector<int64_t> bestShares(const std::vector<CostModel>& costs) const;
  // Each rank's fitted model; a left-out rank's is absent: no step cost, and no sample fits it.
  std::vector<CostModel> costs() const;
  Plan makePlan(const std::vector<int64_t>& shares) const;
  // The current split planned again with the current caps and models: its micro-batches and
  // predictions (not a change of the split: version and reason stay).
  void refreshPlan();
  void adopt(const std::vector<int64_t>& shares, int64_t step, std::string reason,
             int leaveOut = -1);
  std::vector<std::vector<CostModel>> drawCosts(int64_t step) const;
  struct Decision {
    std::vector<int64_t> shares;  // empty: keep the plan
    bool probe = false;
    std::string reason;  // " at step ...: predicted gain ..."
    int leaveOut = -1;   // the rank the decision leaves out, or -1
    double gain = 0.0;   // leaving out: its predicted gain
  };
  // The rank whose leaving out gains most, if that gain is sure (see "left out").
  Decision leaveOutDecision(int64_t step, const std::vector<CostModel>& fitted) const;
  // The measured communication of a group of `members` ranks (the last steps' median; 0 for one).
  double communicationSeconds(int members) const;
  int activeRanks() const;
  // What the dynamic policy would adopt at `step`; sets lastGain_ and lastSureGain_.
  Decision decide(int64_t step);
  // A probe of one sample on a rank that has had none for long enough (see "re-measure").
  Decision remeasureIdleRank(int64_t step, const std::vector<int64_t>& planShares,
                             const std::vector<CostModel>& fitted, double current) const;

  BalancerOptions options_;
  std::vector<int64_t> caps_;  // clamped to globalBatch
  std::vector<ThroughputModel> models_;
  std::vector<std::vector<std::pair<int64_t, double>>> pending_;  // this step's observations
  std::vector<double> pendingStepCosts_;  // this step's step costs, -1 where none
  std::vector<bool> leftOut_;             // see "left out"
  std::vector<double> communication_;     // the last steps' observeCommunication, oldest first
  double pendingCommunication_ = -1.0;    // this step's, -1 where none
  Plan plan_;
  int64_t stepsSeen_ = 0;
  int64_t lastStep_ = std::numeric_limits<int64_t>::min();
  int64_t changeStep_ = std::numeric_limits<int64_t>::min();
  int streak_ = 0;
  int leaveOutRank_ = -1;   // the rank the last decisions would leave out, -1 for none
  int leaveOutStreak_ = 0;  // decisions in a row that would leave leaveOutRank_ out
  bool profiled_ = false;
  bool warnedUnknown_ = false;
  double lastGain_ = 0.0;
  double lastSureGain_ = 0.0;
};

}  // namespace hetra::balance
