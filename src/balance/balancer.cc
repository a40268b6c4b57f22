#include "balance/balancer.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "balance/allocation.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/params.h"

namespace hetra::balance {
namespace {

constexpr const char* kSubsys = "balance";
constexpr int kStateFormat = 3;  // 3: left-out ranks and the communication (2026-12-06)
// observeCommunication keeps the last kCommunicationSteps steps; their median counts.
constexpr size_t kCommunicationSteps = 9;
// Fractions of the way from the plan to the candidate a move or a probe may go, farthest first.
constexpr double kFractions[] = {1.0, 0.5, 0.25};
// A move is judged over kDraws cost models drawn from the fitted ones' uncertainty: its sure gain
// is the kSureQuantile quantile of its gains over the draws.
constexpr int kDraws = 64;
constexpr double kSureQuantile = 0.05;
// A probe may lose at most kProbeCost of a step for sure; it is worth it only for a gain beyond
// kProbeSigmas of the timing noise of the slowest rank.
constexpr double kProbeCost = 0.02;
constexpr double kProbeSigmas = 1.7;

// The parameters' defaults are BalancerOptions' defaults, so the two cannot drift apart.
const BalancerOptions kDefaults;
const Param kModeParam(
    "HETRA_BALANCE_MODE", modeName(kDefaults.mode),
    "Load balancing: dynamic (profile, then adapt online), static (profile, then "
    "fixed) or equal (even split, as PyTorch DDP)");
const Param kThresholdParam(
    "HETRA_BALANCE_THRESHOLD", str(kDefaults.rebalanceThreshold),
    "Least predicted relative gain of a new split (beyond the timing noise) "
    "that makes the balancer change the split");
const Param kMinStepsParam("HETRA_BALANCE_MIN_STEPS", str(kDefaults.minStepsBetweenChanges),
                           "Least number of steps between two changes of the split");
const Param kPersistParam("HETRA_BALANCE_PERSIST_STEPS", str(kDefaults.persistSteps),
                          "Steps in a row a predicted gain must exceed the threshold before the "
                          "split changes");
const Param kProfileParam("HETRA_BALANCE_PROFILE_STEPS", str(kDefaults.profileSteps),
                          "Steps measured on the equal split before the first balancing decision");
const Param kStepCostsParam("HETRA_BALANCE_STEP_COSTS", kDefaults.stepCosts ? "1" : "0",
                            "Count each rank's per-step cost (its optimizer step) in the split; 0 "
                            "balances the micro-batches' compute alone (for comparison)");
const Param kShapeParam("HETRA_BALANCE_SHAPE", kDefaults.keepShape ? "1" : "0",
                        "Pull each rank's fitted fixed cost toward its measured shape (fixed cost "
                        "over per-sample cost); 0 pulls it toward 0 (for comparison)");

std::string percent(double fraction) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << 100.0 * fraction << "%";
  return os.str();
}

void validate(const BalancerOptions& o, const std::vector<RankCaps>& caps) {
  if (caps.empty()) throw ConfigError("balance: no ranks given (one RankCaps per rank is needed)");
  if (o.globalBatch < int64_t(caps.size()))
    throw ConfigError(str("balance: globalBatch=", o.globalBatch, " is smaller than the ",
                          caps.size(), " ranks; every rank needs at least one sample"));
  for (size_t i = 0; i < caps.size(); ++i)
    if (caps[i].maxMicroBatch < 1)
      throw ConfigError(str("balance: rank ", i, " maxMicroBatch=", caps[i].maxMicroBatch,
                            " is not allowed; it must be >= 1"));
  if (!std::isfinite(o.rebalanceThreshold) || o.rebalanceThreshold < 0.0)
    throw ConfigError(str("balance: rebalanceThreshold (HETRA_BALANCE_THRESHOLD)=",
                          o.rebalanceThreshold, " is not allowed; it must be a number >= 0"));
  if (o.minStepsBetweenChanges < 0)
    throw ConfigError(str("balance: minStepsBetweenChanges (HETRA_BALANCE_MIN_STEPS)=",
                          o.minStepsBetweenChanges, " is not allowed; it must be >= 0"));
  if (o.persistSteps < 1)
    throw ConfigError(str("balance: persistSteps (HETRA_BALANCE_PERSIST_STEPS)=", o.persistSteps,
                          " is not allowed; it must be >= 1"));
  if (o.leaveOut && o.sharesWithinCaps)
    throw ConfigError(
        "balance: leaveOut and sharesWithinCaps together are not supported (the loops that keep "
        "shares within the caps, ZeRO stages 2 and 3, need every rank)");
  if (o.profileSteps < 1)
    throw ConfigError(str("balance: profileSteps (HETRA_BALANCE_PROFILE_STEPS)=", o.profileSteps,
                          " is not allowed; it must be >= 1"));
}

int narrowInt(int64_t value, const char* what) {
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
    throw ConfigError(str("balance: ", what, "=", value, " is out of range"));
  return int(value);
}

// Two independent standard normals from a generator whose sequence the standard fixes
// (Box-Muller on 53-bit uniforms), so every rank draws the same numbers.
std::pair<double, double> normalPair(std::mt19937_64& rng) {
  const double u1 = (double(rng() >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = double(rng() >> 11) * 0x1.0p-53;
  const double radius = std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * M_PI * u2;
  return {radius * std::cos(angle), radius * std::sin(angle)};
}

// One cost model drawn from the fit's uncertainty: (a, c) + L z with L the Cholesky factor of
// their covariance.
CostModel drawn(const CostModel& fit, std::mt19937_64& rng) {
  const auto [z1, z2] = normalPair(rng);
  CostModel c = fit;
  const double l00 = std::sqrt(fit.overheadVariance);
  const double l10 = l00 > 0.0 ? fit.covariance / l00 : 0.0;
  const double l11 = std::sqrt(std::max(0.0, fit.perSampleVariance - l10 * l10));
  c.overhead = fit.overhead + l00 * z1;
  c.perSample = std::max(fit.perSample + l10 * z1 + l11 * z2, 1e-3 * fit.perSample);
  return c;
}

double stepSeconds(const std::vector<CostModel>& costs, const std::vector<int64_t>& caps,
                   const std::vector<int64_t>& shares) {
  double worst = 0.0;
  for (size_t i = 0; i < shares.size(); ++i)
    worst = std::max(worst, predictSeconds(costs[i], shares[i], caps[i]));
  return worst;
}

// The split `fraction` of the way from `from` to `to`, in whole samples with the same total
// (largest remainders first, ties to the lower rank).
std::vector<int64_t> partWay(const std::vector<int64_t>& from, const std::vector<int64_t>& to,
                             double fraction) {
  std::vector<int64_t> shares(from.size());
  std::vector<std::pair<double, size_t>> remainders;
  int64_t total = 0, left = 0;
  for (size_t i = 0; i < from.size(); ++i) {
    const double target = double(from[i]) + fraction * double(to[i] - from[i]);
    shares[i] = int64_t(std::floor(target));
    remainders.push_back({-(target - double(shares[i])), i});
    total += from[i];
    left -= shares[i];
  }
  left += total;
  std::sort(remainders.begin(), remainders.end());
  for (size_t j = 0; j < size_t(left); ++j) ++shares[remainders[j].second];
  return shares;
}

// The q-quantile of `values` (sorted in place), the lower of the two nearest on a tie.
double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return values[size_t(q * double(values.size() - 1))];
}

}  // namespace

constexpr NamedValue<Mode> kModeNames[] = {
    {Mode::Dynamic, "dynamic"}, {Mode::Static, "static"}, {Mode::Equal, "equal"}};
static_assert(coversEnum(kModeNames, Mode::Equal));

Mode parseMode(const std::string& name) {
  if (std::optional<Mode> mode = findName(name, kModeNames)) return *mode;
  throw ConfigError(str("balance: mode (HETRA_BALANCE_MODE)='", name,
                        "' is unknown; allowed: ", allowedNames(kModeNames)));
}

const char* modeName(Mode mode) {
  return nameOf(mode, kModeNames);
}

BalancerOptions BalancerOptions::fromParams(int64_t globalBatch) {
  BalancerOptions o;
  o.mode = parseMode(kModeParam.str());
  o.globalBatch = globalBatch;
  o.rebalanceThreshold = kThresholdParam.number();
  o.minStepsBetweenChanges = narrowInt(kMinStepsParam.integer(), "HETRA_BALANCE_MIN_STEPS");
  o.persistSteps = narrowInt(kPersistParam.integer(), "HETRA_BALANCE_PERSIST_STEPS");
  o.profileSteps = narrowInt(kProfileParam.integer(), "HETRA_BALANCE_PROFILE_STEPS");
  o.stepCosts = kStepCostsParam.flag();
  o.keepShape = kShapeParam.flag();
  return o;
}

std::string Plan::summary() const {
  std::ostringstream os;
  os << "v" << version << " [b/m/k:";
  for (const auto& r : ranks) {
    if (r.leftOut)
      os << " out";
    else
      os << " " << r.batch << "/" << r.microBatch << "/" << r.accumSteps;
  }
  os << "] predicted " << predictedStepSeconds << "s (" << reason << ")";
  return os.str();
}

std::vector<bool> Plan::leftOut() const {
  std::vector<bool> out;
  for (const auto& r : ranks) out.push_back(r.leftOut);
  return out;
}

Balancer::Balancer(BalancerOptions options, std::vector<RankCaps> caps)
    : options_(options),
      models_(caps.size(), ThroughputModel(options.keepShape)),
      pending_(caps.size()),
      pendingStepCosts_(caps.size(), -1.0),
      leftOut_(caps.size(), false) {
  validate(options_, caps);
  for (const auto& c : caps) caps_.push_back(std::min(c.maxMicroBatch, options_.globalBatch));
  const std::vector<int64_t> first = firstShares();
  plan_ = makePlan(first);
  plan_.reason = options_.mode == Mode::Equal ? "equal split (mode equal)"
                                              : "initial: equal split, nothing measured yet";
  if (first != equalShares(options_.globalBatch, caps_.size()))
    plan_.reason += ", within the micro-batch caps";
}

bool Balancer::withinCaps() const {
  return options_.sharesWithinCaps && capsHoldBatch(caps_, options_.globalBatch);
}

std::vector<int64_t> Balancer::firstShares() const {
  return withinCaps() ? equalSharesWithinCaps(options_.globalBatch, caps_)
                      : equalShares(options_.globalBatch, caps_.size());
}

std::vector<int64_t> Balancer::bestShares(const std::vector<CostModel>& costs) const {
  return optimalShares(costs, caps_, options_.globalBatch, !withinCaps());
}

bool Balancer::setMaxMicroBatch(int rank, int64_t maxMicroBatch) {
  HETRA_ENFORCE(rank >= 0 && rank < ranks(), "rank ", rank, " of ", ranks());
  HETRA_ENFORCE_GE(maxMicroBatch, 1, "rank ", rank, "'s micro-batch bound");
  const int64_t cap = std::min(maxMicroBatch, options_.globalBatch);
  if (caps_[size_t(rank)] == cap) return false;
  caps_[size_t(rank)] = cap;
  refreshPlan();
  if (withinCaps() && plan_.ranks[size_t(rank)].batch > cap) {
    // The share no longer fits one micro-batch: the split changes now, not at a decision.
    adopt(modelsKnown() ? bestShares(costs()) : firstShares(), lastStep_,
          str("rank ", rank, "'s micro-batch cap fell to ", cap, ", below its share"));
  }
  HETRA_INFO(kSubsys, "rank ", rank, ": micro-batches of at most ", cap,
             " samples (measured memory)");
  return true;
}

int64_t Balancer::maxMicroBatch(int rank) const {
  HETRA_ENFORCE(rank >= 0 && rank < ranks(), "rank ", rank, " of ", ranks());
  return caps_[size_t(rank)];
}

const CostModel& Balancer::cost(int rank) const {
  HETRA_ENFORCE(rank >= 0 && rank < ranks(), "rank ", rank, " of ", ranks());
  return models_[size_t(rank)].cost();
}

void Balancer::observe(int rank, int64_t microBatch, double seconds) {
  HETRA_ENFORCE(rank >= 0 && rank < ranks(), "rank ", rank, " of ", ranks());
  HETRA_ENFORCE(microBatch >= 1, "micro-batch of ", microBatch, " samples");
  HETRA_ENFORCE(std::isfinite(seconds) && seconds >= 0.0, "compute time ", seconds, "s");
  pending_[size_t(rank)].push_back({microBatch, seconds});
}

void Balancer::observeStepCost(int rank, double seconds) {
  HETRA_ENFORCE(rank >= 0 && rank < ranks(), "rank ", rank, " of ", ranks());
  HETRA_ENFORCE(std::isfinite(seconds) && seconds >= 0.0, "step cost ", seconds, "s");
  if (options_.stepCosts) pendingStepCosts_[size_t(rank)] = seconds;
}

void Balancer::observeCommunication(double seconds) {
  HETRA_ENFORCE(std::isfinite(seconds) && seconds >= 0.0, "communication ", seconds, "s");
  pendingCommunication_ = seconds;
}

double Balancer::communicationSeconds(int members) const {
  if (members <= 1 || communication_.empty()) return 0.0;
  return quantile(communication_, 0.5);
}

int Balancer::activeRanks() const {
  return int(std::count(leftOut_.begin(), leftOut_.end(), false));
}

bool Balancer::modelsKnown() const {
  return std::all_of(models_.begin(), models_.end(),
                     [](const ThroughputModel& m) { return m.cost().known(); });
}

std::vector<CostModel> Balancer::costs() const {
  std::vector<CostModel> out;
  for (size_t i = 0; i < models_.size(); ++i) {
    out.push_back(models_[i].cost());
    if (leftOut_[i]) {
      out.back() = CostModel{};
      out.back().perSample = std::numeric_limits<double>::infinity();
    }
  }
  return out;
}

double Balancer::idealSamplesPerSecond() const {
  if (!modelsKnown()) return 0.0;
  const Plan best = makePlan(bestShares(costs()));
  return best.predictedStepSeconds > 0.0 ? double(options_.globalBatch) / best.predictedStepSeconds
                                         : 0.0;
}

double Balancer::regret() const {
  const double ideal = idealSamplesPerSecond();
  if (ideal <= 0.0 || plan_.predictedStepSeconds <= 0.0) return 0.0;
  return std::max(0.0, 1.0 - double(options_.globalBatch) / ideal / plan_.predictedStepSeconds);
}

void Balancer::hintSpeedChange(int rank) {
  HETRA_ENFORCE(rank >= 0 && rank < ranks(), "rank ", rank, " of ", ranks());
  models_[size_t(rank)].forgetPoints();
  HETRA_INFO(kSubsys, "rank ", rank, ": speed change hinted; its model starts over");
}

std::vector<std::vector<CostModel>> Balancer::drawCosts(int64_t step) const {
  std::mt19937_64 rng(0x9e3779b97f4a7c15ULL ^ uint64_t(step));
  std::vector<std::vector<CostModel>> draws(kDraws);
  const std::vector<CostModel> fitted = costs();
  for (auto& drawnCosts : draws)
    for (const auto& c : fitted) drawnCosts.push_back(drawn(c, rng));
  return draws;
}

Plan Balancer::makePlan(const std::vector<int64_t>& shares) const {
  Plan p;
  for (size_t i = 0; i < shares.size(); ++i) {
    RankAssignment r;
    r.batch = shares[i];
    r.microBatch = microBatchSize(shares[i], caps_[i]);
    r.accumSteps = accumSteps(shares[i], caps_[i]);
    r.leftOut = leftOut_[i];
    const CostModel& cost = models_[i].cost();
    if (cost.known() && !r.leftOut) {
      r.predictedSeconds = cost.stepSeconds(r.batch, r.accumSteps);
      r.overheadSeconds = cost.overhead;
      r.perSampleSeconds = cost.perSample;
    }
    p.predictedStepSeconds = std::max(p.predictedStepSeconds, r.predictedSeconds);
    p.ranks.push_back(r);
  }
  return p;
}

void Balancer::refreshPlan() {
  std::vector<int64_t> shares;
  for (const auto& r : plan_.ranks) shares.push_back(r.batch);
  Plan refreshed = makePlan(shares);
  refreshed.version = plan_.version;
  refreshed.reason = std::move(plan_.reason);
  plan_ = std::move(refreshed);
}

void Balancer::adopt(const std::vector<int64_t>& shares, int64_t step, std::string reason,
                     int leaveOut) {
  if (leaveOut >= 0) {
    leftOut_[size_t(leaveOut)] = true;
    HETRA_INFO(kSubsys, "rank ", leaveOut, " is left out for the rest of the run");
  }
  const int64_t version = plan_.version + 1;
  plan_ = makePlan(shares);
  plan_.version = version;
  plan_.reason = std::move(reason);
  changeStep_ = step;
  streak_ = 0;
  HETRA_INFO(kSubsys, "plan ", plan_.summary());
}

bool Balancer::endStep(int64_t step) {
  HETRA_ENFORCE(step > lastStep_, "steps must increase: step ", step, " after ", lastStep_);
  lastStep_ = step;
  ++stepsSeen_;
  for (size_t i = 0; i < models_.size(); ++i) {
    models_[i].addStep(step, pending_[i]);
    pending_[i].clear();
    if (pendingStepCosts_[i] >= 0.0) models_[i].addStepCost(step, pendingStepCosts_[i]);
    pendingStepCosts_[i] = -1.0;
  }
  if (pendingCommunication_ >= 0.0) {
    communication_.push_back(pendingCommunication_);
    if (communication_.size() > kCommunicationSteps) communication_.erase(communication_.begin());
  }
  pendingCommunication_ = -1.0;

  refreshPlan();

  if (options_.mode == Mode::Equal || stepsSeen_ < options_.profileSteps) return false;
  if (options_.mode == Mode::Static && profiled_) return false;
  if (!modelsKnown()) {
    if (!warnedUnknown_)
      HETRA_WARN(kSubsys, "step ", step,
                 ": some ranks reported no compute time; keeping the split");
    warnedUnknown_ = true;
    return false;
  }

  const Decision next = decide(step);
  const char* kind = next.probe ? "probe" : profiled_ ? "rebalance" : "profiled";
  if (!profiled_) {
    profiled_ = true;
    changeStep_ = step;
    if (next.shares.empty()) return false;
    adopt(next.shares, step, kind + next.reason, next.leaveOut);
    return true;
  }
  streak_ = next.shares.empty() ? 0 : streak_ + 1;
  if (streak_ >= options_.persistSteps && step - changeStep_ >= options_.minStepsBetweenChanges) {
    adopt(next.shares, step, kind + next.reason, next.leaveOut);
    return true;
  }
  return false;
}

Balancer::Decision Balancer::decide(int64_t step) {
  std::vector<int64_t> planShares;
  for (const auto& r : plan_.ranks) planShares.push_back(r.batch);
  const std::vector<CostModel> fitted = costs();
  Decision out = leaveOutDecision(step, fitted);
  leaveOutStreak_ = out.leaveOut < 0 ? 0 : out.leaveOut == leaveOutRank_ ? leaveOutStreak_ + 1 : 1;
  leaveOutRank_ = out.leaveOut;
  if (profiled_ && leaveOutStreak_ >= options_.persistSteps) {
    lastGain_ = out.gain;
    lastSureGain_ = 0.0;
    return out;
  }
  const std::vector<int64_t> candidate = bestShares(fitted);
  const double current = plan_.predictedStepSeconds;
  lastGain_ = current > 0.0 ? 1.0 - stepSeconds(fitted, caps_, candidate) / current : 0.0;
  lastSureGain_ = 0.0;
  if (candidate == planShares) return remeasureIdleRank(step, planShares, fitted, current);

  // Each fraction's gain over the same draws: its sure gain, and its sure loss for a probe.
  const auto draws = drawCosts(step);
  struct Option {
    double fraction;
    std::vector<int64_t> shares;
    double gain, sureGain;
  };
  std::vector<Option> options;
  for (double fraction : kFractions) {
    std::vector<int64_t> shares = partWay(planShares, candidate, fraction);
    if (shares == planShares) continue;
    std::vector<double> gains;
    for (const auto& costs : draws) {
      const double before = stepSeconds(costs, caps_, planShares);
      gains.push_back(before > 0.0 ? 1.0 - stepSeconds(costs, caps_, shares) / before : 0.0);
    }
    const double gain = current > 0.0 ? 1.0 - stepSeconds(fitted, caps_, shares) / current : 0.0;
    options.push_back({fraction, std::move(shares), gain, quantile(gains, kSureQuantile)});
  }
  // The whole way (fraction 1) is the candidate itself, which differs from the plan.
  lastSureGain_ = options.front().sureGain;
  const auto decision = [&](const Option& o, bool probe) {
    return Decision{
        o.shares, probe,
        str(" at step ", step, ": predicted gain ", percent(o.gain), " (", percent(o.sureGain),
            " beyond timing noise), ", percent(o.fraction), " of the way to the best split (gain ",
            percent(lastGain_), "), step ", current, "s -> ", current * (1.0 - o.gain), "s")};
  };
  // Static mode decides once, with nothing to refine later: the whole way, on the predicted gain.
  if (options_.mode == Mode::Static)
    return lastGain_ > options_.rebalanceThreshold ? decision(options.front(), false) : Decision{};
  for (const Option& o : options)
    if (o.sureGain > options_.rebalanceThreshold) return decision(o, false);
  if (Decision remeasure = remeasureIdleRank(step, planShares, fitted, current);
      !remeasure.shares.empty())
    return remeasure;  // before a probe toward the candidate: that one would not measure the rank
  // A probe measures the curve between plan and candidate, which helps when the gain is unsure
  // through the extrapolation; a gain within the levels' own errors is what noise makes of a
  // converged split (the slowest of n noisy levels is off by about sqrt(2 ln n) of their error),
  // and probing it would only move the split around.
  double levelError = 0.0;
  for (const auto& c : fitted) levelError = std::max(levelError, c.relativeError);
  const double noiseGain =
      kProbeSigmas * levelError * std::sqrt(2.0 * std::log(std::max(2.0, double(ranks()))));
  if (lastGain_ <= std::max(noiseGain, 2.0 * options_.rebalanceThreshold)) return {};
  for (const Option& o : options)
    if (o.gain > 0.0 && o.sureGain >= -kProbeCost) return decision(o, true);
  return {};
}

Balancer::Decision Balancer::remeasureIdleRank(int64_t step, const std::vector<int64_t>& planShares,
                                               const std::vector<CostModel>& fitted,
                                               double current) const {
  const auto donor = std::max_element(planShares.begin(), planShares.end());
  if (current <= 0.0 || *donor < 2) return {};
  for (size_t i = 0; i < planShares.size(); ++i) {
    if (planShares[i] != 0 || leftOut_[i]) continue;
    // One sample holds for about minStepsBetweenChanges steps (then the split moves back if the
    // rank is still not worth it) at a predicted excess `excess` of the step: once in `interval`
    // steps keeps the average cost within kProbeCost.
    const double excess = std::max(0.0, predictSeconds(fitted[i], 1, caps_[i]) / current - 1.0);
    const double interval = std::max(double(options_.minStepsBetweenChanges), 1.0) *
                            std::max(excess, kProbeCost) / kProbeCost;
    const int64_t last = models_[i].lastObserved();  // the lowest int64_t: never observed
    if (last != std::numeric_limits<int64_t>::min() && double(step - last) < interval) continue;
    std::vector<int64_t> shares = planShares;
    --shares[size_t(donor - planShares.begin())];
    shares[i] = 1;
    return {std::move(shares), true,
            str(" at step ", step, ": rank ", i, " has had no samples since step ",
                models_[i].lastObserved(), "; one sample measures it again (predicted step +",
                percent(excess), ")")};
  }
  return {};
}

Balancer::Decision Balancer::leaveOutDecision(int64_t step,
                                              const std::vector<CostModel>& fitted) const {
  const int members = activeRanks();
  if (!options_.leaveOut || members <= 1) return {};
  const double with =
      stepSeconds(fitted, caps_, bestShares(fitted)) + communicationSeconds(members);
  // A decision that stays out for the rest of the run wants more than a rebalance: a gain beyond
  // the noise of the slowest of the levels, as a probe does, and twice the threshold.
  double levelError = 0.0;
  for (size_t i = 0; i < fitted.size(); ++i)
    if (!leftOut_[i]) levelError = std::max(levelError, fitted[i].relativeError);
  const double margin = std::max(
      kProbeSigmas * levelError * std::sqrt(2.0 * std::log(std::max(2.0, double(members)))),
      2.0 * options_.rebalanceThreshold);
  Decision best;
  double bestWithout = with;
  for (size_t i = 0; i < fitted.size(); ++i) {
    if (leftOut_[i]) continue;
    std::vector<CostModel> without = fitted;
    without[i] = CostModel{};
    without[i].perSample = std::numeric_limits<double>::infinity();
    const std::vector<int64_t> shares = bestShares(without);
    const double seconds = stepSeconds(without, caps_, shares) + communicationSeconds(members - 1);
    if (seconds >= bestWithout || 1.0 - seconds / with <= margin) continue;
    bestWithout = seconds;
    best.shares = shares;
    best.leaveOut = int(i);
    best.gain = 1.0 - seconds / with;
    best.reason =
        str(" at step ", step, ": rank ", i, " left out: no share pays for it (its step cost ",
            fitted[i].perStep, "s, ", fitted[i].perSample, "s per sample; communication ",
            communicationSeconds(members), "s); predicted step ", with, "s with it, ", seconds,
            "s without");
  }
  return best;
}

std::string Balancer::save() const {
  nlohmann::json j;
  j["format"] = kStateFormat;
  j["options"] = {{"mode", modeName(options_.mode)},
                  {"global_batch", options_.globalBatch},
                  {"rebalance_threshold", options_.rebalanceThreshold},
                  {"min_steps_between_changes", options_.minStepsBetweenChanges},
                  {"persist_steps", options_.persistSteps},
                  {"profile_steps", options_.profileSteps},
                  {"shares_within_caps", options_.sharesWithinCaps},
                  {"step_costs", options_.stepCosts},
                  {"keep_shape", options_.keepShape},
                  {"leave_out", options_.leaveOut}};
  j["caps"] = caps_;
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : plan_.ranks)
    ranks.push_back({r.batch, r.microBatch, r.accumSteps, r.predictedSeconds, r.overheadSeconds,
                     r.perSampleSeconds});
  j["plan"] = {{"ranks", ranks},
               {"predicted_step_seconds", plan_.predictedStepSeconds},
               {"version", plan_.version},
               {"reason", plan_.reason}};
  j["models"] = nlohmann::json::array();
  for (const auto& m : models_) j["models"].push_back(m.toJson());
  j["pending"] = pending_;
  j["pending_step_costs"] = pendingStepCosts_;
  j["steps_seen"] = stepsSeen_;
  j["last_step"] = lastStep_;
  j["change_step"] = changeStep_;
  j["streak"] = streak_;
  j["profiled"] = profiled_;
  j["warned_unknown"] = warnedUnknown_;
  j["last_gain"] = lastGain_;
  j["last_sure_gain"] = lastSureGain_;
  j["left_out"] = leftOut_;
  j["leave_out_streak"] = {leaveOutRank_, leaveOutStreak_};
  j["communication"] = communication_;
  j["pending_communication"] = pendingCommunication_;
  return j.dump();
}

Balancer Balancer::load(const std::string& state) {
  try {
    const nlohmann::json j = nlohmann::json::parse(state);
    // Format 2 is format 3 without left-out ranks and communication (before 2026-12-06).
    const int format = j.at("format").get<int>();
    if (format != kStateFormat && format != 2)
      throw ConfigError(str("balance: saved state format=", j.at("format").dump(),
                            " is not supported; expected 2 or ", kStateFormat));
    const auto& o = j.at("options");
    BalancerOptions options;
    options.mode = parseMode(o.at("mode").get<std::string>());
    options.globalBatch = o.at("global_batch").get<int64_t>();
    options.rebalanceThreshold = o.at("rebalance_threshold").get<double>();
    options.minStepsBetweenChanges = o.at("min_steps_between_changes").get<int>();
    options.persistSteps = o.at("persist_steps").get<int>();
    options.profileSteps = o.at("profile_steps").get<int>();
    options.sharesWithinCaps = o.value("shares_within_caps", false);  // absent before 2026-12-03
    options.stepCosts = o.value("step_costs", true);                  // absent before 2026-12-05
    options.keepShape = o.value("keep_shape", true);                  // absent before 2026-12-06
    options.leaveOut = o.value("leave_out", false);                   // absent in format 2
    std::vector<RankCaps> caps;
    for (const auto& c : j.at("caps")) caps.push_back({c.get<int64_t>()});
    Balancer b(options, caps);
    const auto& models = j.at("models");
    const auto& pending = j.at("pending");
    const auto& ranks = j.at("plan").at("ranks");
    if (models.size() != caps.size() || pending.size() != caps.size() ||
        ranks.size() != caps.size())
      throw ConfigError(str("balance: saved state has ", caps.size(), " caps but ", models.size(),
                            " models, ", pending.size(), " pending lists and ", ranks.size(),
                            " plan ranks"));
    for (size_t i = 0; i < caps.size(); ++i) {
      b.models_[i] = ThroughputModel::fromJson(models[i]);
      b.pending_[i] = pending[i].get<std::vector<std::pair<int64_t, double>>>();
      if (j.contains("pending_step_costs"))  // absent before 2026-12-05
        b.pendingStepCosts_[i] = j.at("pending_step_costs").at(i).get<double>();
      const auto& r = ranks[i];
      b.plan_.ranks[i] = {r.at(0).get<int64_t>(), r.at(1).get<int64_t>(), r.at(2).get<int64_t>(),
                          r.at(3).get<double>(),  r.at(4).get<double>(),  r.at(5).get<double>()};
    }
    int64_t total = 0;
    for (const auto& r : b.plan_.ranks) total += r.batch;
    if (total != options.globalBatch)
      throw ConfigError(str("balance: saved plan covers ", total,
                            " samples, not globalBatch=", options.globalBatch));
    b.plan_.predictedStepSeconds = j.at("plan").at("predicted_step_seconds").get<double>();
    b.plan_.version = j.at("plan").at("version").get<int64_t>();
    b.plan_.reason = j.at("plan").at("reason").get<std::string>();
    b.stepsSeen_ = j.at("steps_seen").get<int64_t>();
    b.lastStep_ = j.at("last_step").get<int64_t>();
    b.changeStep_ = j.at("change_step").get<int64_t>();
    b.streak_ = j.at("streak").get<int>();
    b.profiled_ = j.at("profiled").get<bool>();
    b.warnedUnknown_ = j.at("warned_unknown").get<bool>();
    b.lastGain_ = j.at("last_gain").get<double>();
    b.lastSureGain_ = j.at("last_sure_gain").get<double>();
    if (format >= 3) {
      b.leftOut_ = j.at("left_out").get<std::vector<bool>>();
      if (b.leftOut_.size() != caps.size() || b.activeRanks() == 0)
        throw ConfigError(str("balance: saved state leaves out ", j.at("left_out").dump(), " of ",
                              caps.size(), " ranks"));
      b.communication_ = j.at("communication").get<std::vector<double>>();
      b.pendingCommunication_ = j.at("pending_communication").get<double>();
      b.leaveOutRank_ = j.at("leave_out_streak").at(0).get<int>();
      b.leaveOutStreak_ = j.at("leave_out_streak").at(1).get<int>();
      for (size_t i = 0; i < caps.size(); ++i) {
        b.plan_.ranks[i].leftOut = b.leftOut_[i];
        if (b.leftOut_[i] && b.plan_.ranks[i].batch != 0)
          throw ConfigError(str("balance: saved plan gives left-out rank ", i, " ",
                                b.plan_.ranks[i].batch, " samples"));
      }
    }
    return b;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(str("balance: saved state is not valid: ", e.what()));
  }
}

}  // namespace hetra::balance
