#include "balance/balancer.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
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
constexpr int kStateFormat = 1;
// A change must pay off even when the current plan is predicted one standard error faster and the
// candidate one standard error slower than their nominal predictions: noise alone rarely does that.
constexpr double kConfidence = 1.0;

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
  if (o.profileSteps < 1)
    throw ConfigError(str("balance: profileSteps (HETRA_BALANCE_PROFILE_STEPS)=", o.profileSteps,
                          " is not allowed; it must be >= 1"));
}

int narrowInt(int64_t value, const char* what) {
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
    throw ConfigError(str("balance: ", what, "=", value, " is out of range"));
  return int(value);
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
  return o;
}

std::string Plan::summary() const {
  std::ostringstream os;
  os << "v" << version << " [b/m/k:";
  for (const auto& r : ranks) os << " " << r.batch << "/" << r.microBatch << "/" << r.accumSteps;
  os << "] predicted " << predictedStepSeconds << "s (" << reason << ")";
  return os.str();
}

Balancer::Balancer(BalancerOptions options, std::vector<RankCaps> caps)
    : options_(options), models_(caps.size()), pending_(caps.size()) {
  validate(options_, caps);
  for (const auto& c : caps) caps_.push_back(std::min(c.maxMicroBatch, options_.globalBatch));
  plan_ = makePlan(equalShares(options_.globalBatch, caps_.size()));
  plan_.reason = options_.mode == Mode::Equal ? "equal split (mode equal)"
                                              : "initial: equal split, nothing measured yet";
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

bool Balancer::modelsKnown() const {
  return std::all_of(models_.begin(), models_.end(),
                     [](const ThroughputModel& m) { return m.cost().known(); });
}

std::vector<CostModel> Balancer::costs() const {
  std::vector<CostModel> out;
  for (const auto& m : models_) out.push_back(m.cost());
  return out;
}

double Balancer::idealSamplesPerSecond() const {
  if (!modelsKnown()) return 0.0;
  const Plan best = makePlan(optimalShares(costs(), caps_, options_.globalBatch));
  return best.predictedStepSeconds > 0.0 ? double(options_.globalBatch) / best.predictedStepSeconds
                                         : 0.0;
}

Plan Balancer::makePlan(const std::vector<int64_t>& shares) const {
  Plan p;
  for (size_t i = 0; i < shares.size(); ++i) {
    RankAssignment r;
    r.batch = shares[i];
    r.microBatch = microBatchSize(shares[i], caps_[i]);
    r.accumSteps = accumSteps(shares[i], caps_[i]);
    const CostModel& cost = models_[i].cost();
    if (cost.known()) {
      r.predictedSeconds = cost.seconds(r.batch, r.accumSteps);
      r.overheadSeconds = cost.overhead;
      r.perSampleSeconds = cost.perSample;
    }
    p.predictedStepSeconds = std::max(p.predictedStepSeconds, r.predictedSeconds);
    p.ranks.push_back(r);
  }
  return p;
}

void Balancer::adopt(const std::vector<int64_t>& shares, int64_t step, std::string reason) {
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
  }

  // Refresh the predictions of the current split (not a change: version and reason stay).
  std::vector<int64_t> shares;
  for (const auto& r : plan_.ranks) shares.push_back(r.batch);
  {
    Plan refreshed = makePlan(shares);
    refreshed.version = plan_.version;
    refreshed.reason = std::move(plan_.reason);
    plan_ = std::move(refreshed);
  }

  if (options_.mode == Mode::Equal || stepsSeen_ < options_.profileSteps) return false;
  if (options_.mode == Mode::Static && profiled_) return false;
  if (!modelsKnown()) {
    if (!warnedUnknown_)
      HETRA_WARN(kSubsys, "step ", step,
                 ": some ranks reported no compute time; keeping the split");
    warnedUnknown_ = true;
    return false;
  }

  const std::vector<int64_t> candidateShares = optimalShares(costs(), caps_, options_.globalBatch);
  const Plan candidate = makePlan(candidateShares);
  const double current = plan_.predictedStepSeconds;
  lastGain_ = current > 0.0 ? (current - candidate.predictedStepSeconds) / current : 0.0;
  double currentLow = 0.0, candidateHigh = 0.0;
  for (size_t i = 0; i < models_.size(); ++i) {
    const double error = kConfidence * models_[i].cost().relativeError;
    currentLow = std::max(currentLow, plan_.ranks[i].predictedSeconds * (1.0 - error));
    candidateHigh = std::max(candidateHigh, candidate.ranks[i].predictedSeconds * (1.0 + error));
  }
  const double sureGain = currentLow > 0.0 ? (currentLow - candidateHigh) / currentLow : 0.0;
  const bool worthIt = sureGain > options_.rebalanceThreshold;
  const auto describe = [&](const char* what) {
    return str(what, " at step ", step, ": predicted gain ", percent(lastGain_), " (",
               percent(sureGain), " beyond timing noise), step ", current, "s -> ",
               candidate.predictedStepSeconds, "s");
  };

  if (!profiled_) {
    profiled_ = true;
    if (worthIt) {
      adopt(candidateShares, step, describe("profiled"));
      return true;
    }
    changeStep_ = step;
    return false;
  }
  streak_ = worthIt ? streak_ + 1 : 0;
  if (streak_ >= options_.persistSteps && step - changeStep_ >= options_.minStepsBetweenChanges) {
    adopt(candidateShares, step, describe("rebalance"));
    return true;
  }
  return false;
}

std::string Balancer::save() const {
  nlohmann::json j;
  j["format"] = kStateFormat;
  j["options"] = {{"mode", modeName(options_.mode)},
                  {"global_batch", options_.globalBatch},
                  {"rebalance_threshold", options_.rebalanceThreshold},
                  {"min_steps_between_changes", options_.minStepsBetweenChanges},
                  {"persist_steps", options_.persistSteps},
                  {"profile_steps", options_.profileSteps}};
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
  j["steps_seen"] = stepsSeen_;
  j["last_step"] = lastStep_;
  j["change_step"] = changeStep_;
  j["streak"] = streak_;
  j["profiled"] = profiled_;
  j["warned_unknown"] = warnedUnknown_;
  j["last_gain"] = lastGain_;
  return j.dump();
}

Balancer Balancer::load(const std::string& state) {
  try {
    const nlohmann::json j = nlohmann::json::parse(state);
    if (j.at("format").get<int>() != kStateFormat)
      throw ConfigError(str("balance: saved state format=", j.at("format").dump(),
                            " is not supported; expected ", kStateFormat));
    const auto& o = j.at("options");
    BalancerOptions options;
    options.mode = parseMode(o.at("mode").get<std::string>());
    options.globalBatch = o.at("global_batch").get<int64_t>();
    options.rebalanceThreshold = o.at("rebalance_threshold").get<double>();
    options.minStepsBetweenChanges = o.at("min_steps_between_changes").get<int>();
    options.persistSteps = o.at("persist_steps").get<int>();
    options.profileSteps = o.at("profile_steps").get<int>();
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
    return b;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(str("balance: saved state is not valid: ", e.what()));
  }
}

}  // namespace hetra::balance
