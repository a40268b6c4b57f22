// Vocabulary: see periodic_sync.h.
#include "train/periodic_sync.h"

#include <cmath>

#include "common/errors.h"
#include "common/logging.h"
#include "train/data_parallel.h"
#include "train/fused_optim.h"

namespace hetra::train {
namespace {

// The scalars of a round, all-reduced exactly before the vector: they make the weights.
enum RoundScalar { kWeight, kWeightedSteps, kWeightedAdamStep, kRoundScalars };

// Copies `tensors` one after the other into `flat` from element `at`; returns the end.
int64_t pack(const std::vector<torch::Tensor>& tensors, torch::Tensor& flat, int64_t at,
             double scale) {
  for (const auto& t : tensors) {
    torch::Tensor slice = flat.narrow(0, at, t.numel());
    torch::mul_out(slice, t.reshape({-1}), scale);
    at += t.numel();
  }
  return at;
}

int64_t unpack(const torch::Tensor& flat, int64_t at, std::vector<torch::Tensor>& tensors) {
  for (auto& t : tensors) {
    t.copy_(flat.narrow(0, at, t.numel()).view_as(t));
    at += t.numel();
  }
  return at;
}

// Adam's and AdamW's moments of `p`, its state created as their first step would.
template <class State>
State& adamState(torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  auto& slot = paramStateSlot(optimizer, p);
  if (!slot) slot = freshAdamState<State>(p);
  return static_cast<State&>(*slot);
}

template <class Options>
void refuseAmsgrad(torch::optim::Optimizer& optimizer) {
  for (const auto& group : optimizer.param_groups())
    if (static_cast<const Options&>(group.options()).amsgrad())
      throw ConfigError(
          "periodic averaging (train.sync_every > 1) does not average AMSGrad's "
          "maximum moments");
}

}  // namespace

SyncMode parseSyncMode(const std::string& text) {
  if (text == "steps") return SyncMode::kSteps;
  if (text == "time") return SyncMode::kTime;
  throw ConfigError(
      str("train.sync_mode = \"", text, "\" is not allowed; use \"steps\" or \"time\""));
}

PeriodicSyncOptions periodicSyncOptionsOf(const RunConfig& config, int64_t totalSteps,
                                          const DataParallelOptions& gradients) {
  PeriodicSyncOptions o;
  o.every = config.train.syncEvery;
  o.mode = parseSyncMode(config.train.syncMode);
  o.roundSeconds = config.train.syncSeconds;
  o.warmupSteps = config.train.syncWarmupSteps;
  o.totalSteps = totalSteps;
  o.evalEvery = config.train.evalEvery;
  o.checkpointEvery = config.train.checkpointEvery;
  o.compression = gradients.compression;
  o.errorFeedback = gradients.errorFeedback;
  return o;
}

PeriodicSync::PeriodicSync(std::shared_ptr<torch::nn::Module> model,
                           torch::optim::Optimizer& optimizer,
                           std::shared_ptr<comm::Communicator> comm, PeriodicSyncOptions options)
    : model_(std::move(model)),
      optimizer_(optimizer),
      comm_(std::move(comm)),
      options_(std::move(options)) {
  HETRA_ENFORCE_GE(options_.every, 1, "train.sync_every");
  if (options_.mode == SyncMode::kTime) {
    options_.normalizeBySteps = true;
    if (!(options_.roundSeconds > 0))
      throw ConfigError(str("train.sync_seconds = ", options_.roundSeconds,
                            " is not allowed with train.sync_mode = \"time\"; it must be > 0"));
  }
  for (const auto& p : model_->parameters()) {
    HETRA_ENFORCE(p.scalar_type() == torch::kFloat32 && p.is_contiguous(),
                  "periodic averaging supports contiguous float32 parameters");
    params_.push_back(p);
    paramElements_ += p.numel();
  }
  for (const auto& b : model_->buffers())
    if (b.scalar_type() == torch::kFloat32) buffers_.push_back(b);
  int64_t bufferElements = 0;
  for (const auto& b : buffers_) bufferElements += b.numel();
  int64_t optimized = 0;
  for (const auto& group : optimizer_.param_groups())
    for (const auto& p : group.params()) optimized += p.numel();
  HETRA_ENFORCE_EQ(optimized, paramElements_, "the optimizer must hold the model's parameters");
  if (dynamic_cast<torch::optim::Adam*>(&optimizer_))
    refuseAmsgrad<torch::optim::AdamOptions>(optimizer_);
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer_))
    refuseAmsgrad<torch::optim::AdamWOptions>(optimizer_);
  vectorElements_ = paramElements_ + bufferElements + stateElements();
  anchor_ = torch::zeros({paramElements_}, torch::kFloat32);
  vector_ = torch::zeros({vectorElements_}, torch::kFloat32);
}

int64_t PeriodicSync::stateElements() const {
  if (auto* sgd = dynamic_cast<const torch::optim::SGD*>(&optimizer_)) {
    for (const auto& group : sgd->param_groups())
      if (static_cast<const torch::optim::SGDOptions&>(group.options()).momentum() == 0)
        return 0;  // one group in every hetra optimizer: no momentum, no state
    return paramElements_;
  }
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer_) ||
      dynamic_cast<const torch::optim::AdamW*>(&optimizer_))
    return 2 * paramElements_;
  throw ConfigError(
      "periodic averaging (train.sync_every > 1) supports the optimizers sgd, adam "
      "and adamw");
}

PeriodicSync::OptimizerState PeriodicSync::optimizerState() {
  OptimizerState state;
  if (stateElements() == 0) return state;
  auto collect = [&](auto tag) {
    using State = decltype(tag);
    for (const auto& group : optimizer_.param_groups())
      for (const auto& p : group.params()) {
        State& s = adamState<State>(optimizer_, p);
        if (state.setStep.empty()) state.step = s.step();
        state.tensors.push_back(s.exp_avg());
        state.tensors.push_back(s.exp_avg_sq());
        state.setStep.push_back([&s](int64_t step) { s.step(step); });
      }
  };
  if (dynamic_cast<torch::optim::Adam*>(&optimizer_)) {
    collect(torch::optim::AdamParamState{});
  } else if (dynamic_cast<torch::optim::AdamW*>(&optimizer_)) {
    collect(torch::optim::AdamWParamState{});
  } else {
    for (const auto& group : optimizer_.param_groups())
      for (const auto& p : group.params()) {
        auto& slot = paramStateSlot(optimizer_, p);
        if (!slot) {
          // A zero buffer steps as LibTorch's first step does (it copies the update, dampening 0).
          auto fresh = std::make_unique<torch::optim::SGDParamState>();
          fresh->momentum_buffer(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          slot = std::move(fresh);
        }
        state.tensors.push_back(static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer());
      }
  }
  return state;
}

bool PeriodicSync::localAt(int64_t step) const {
  return step >= options_.warmupSteps;
}

bool PeriodicSync::endsRound(int64_t step) const {
  if (!localAt(step)) return false;
  const int64_t after = step + 1;
  auto multiple = [after](int64_t every) { return every > 0 && after % every == 0; };
  return multiple(options_.every) || after >= options_.totalSteps || multiple(options_.evalEvery) ||
         multiple(options_.checkpointEvery);
}

void PeriodicSync::beginRound() {
  torch::NoGradGuard noGrad;
  pack(params_, anchor_, 0, 1.0);
  roundStart_ = Clock::now();
  localSteps_ = samples_ = 0;
  inRound_ = true;
}

bool PeriodicSync::takesStep(int64_t step) {
  HETRA_ENFORCE(localAt(step), "step ", step, " is synchronous");
  if (!inRound_) {
    beginRound();
    return true;
  }
  // Time mode: a rank that spent the budget skips the rest of the round; the first step always
  // runs, so tau_i >= 1.
  return options_.mode == SyncMode::kSteps || secondsSince(roundStart_) < options_.roundSeconds;
}

void PeriodicSync::tookStep(int64_t samples) {
  HETRA_ENFORCE(inRound_, "tookStep outside a round");
  ++localSteps_;
  samples_ += samples;
}

double PeriodicSync::average() {
  HETRA_ENFORCE(inRound_ && localSteps_ > 0, "average() needs a round with local steps");
  torch::NoGradGuard noGrad;
  const auto start = Clock::now();
  OptimizerState state = optimizerState();
  const double rawWeight = options_.uniform ? 1.0 : double(samples_);
  double scalars[kRoundScalars] = {rawWeight, rawWeight * double(localSteps_),
                                   rawWeight * double(state.step)};
  comm_->allreduce(scalars, scalars, kRoundScalars, DType::F64, comm::ReduceOp::Sum)->wait();
  const double totalWeight = scalars[kWeight];
  HETRA_ENFORCE(totalWeight > 0, "a round without samples on any rank");
  const double weight = rawWeight / totalWeight;
  const double tauEffective = scalars[kWeightedSteps] / totalWeight;
  const double deltaScale = options_.normalizeBySteps ? weight / double(localSteps_) : weight;
  // vector = [p_i (x - anchor) / a_i | p_i buffers | p_i state]: the sum is minus the update.
  int64_t at = pack(params_, vector_, 0, deltaScale);
  vector_.narrow(0, 0, paramElements_).sub_(anchor_, deltaScale);
  at = pack(buffers_, vector_, at, weight);
  at = pack(state.tensors, vector_, at, weight);
  HETRA_ENFORCE_EQ(at, vectorElements_, "the averaged vector's layout");
  const size_t count = size_t(vectorElements_);
  comm::OpPolicy policy;
  policy.compression = options_.compression;
  if (options_.errorFeedback) policy = withErrorFeedback(*comm_, policy, count, residual_);
  comm_
      ->allreduce(vector_.data_ptr(), vector_.data_ptr(), count, DType::F32, comm::ReduceOp::Sum,
                  policy)
      ->wait();
  // x = anchor + tau_eff * sum (FedNova) or anchor + sum (plain), written into the parameters.
  const double updateScale = options_.normalizeBySteps ? tauEffective : 1.0;
  auto update = vector_.narrow(0, 0, paramElements_);
  update.mul_(updateScale).add_(anchor_);
  at = unpack(vector_, 0, params_);
  at = unpack(vector_, at, buffers_);
  unpack(vector_, at, state.tensors);
  const auto commonStep = int64_t(std::llround(scalars[kWeightedAdamStep] / totalWeight));
  for (auto& set : state.setStep) set(commonStep);
  lastLocalSteps_ = localSteps_;
  lastWeight_ = weight;
  inRound_ = false;
  HETRA_DEBUG("train", "averaged after ", localSteps_, " local steps, weight ", weight,
              ", tau_eff ", tauEffective);
  return secondsSince(start);
}

torch::Tensor PeriodicSync::residuals() const {
  if (!residual_.defined()) return torch::zeros({vectorElements_}, torch::kFloat32);
  return residual_.clone();
}

void PeriodicSync::loadResiduals(const torch::Tensor& flat) {
  if (!flat.defined()) {
    residual_ = torch::Tensor();
    return;
  }
  HETRA_ENFORCE(
      flat.scalar_type() == torch::kFloat32 && flat.dim() == 1 && flat.numel() == vectorElements_,
      "periodic averaging's error feedback: ", flat.numel(),
      " values saved, this model "
      "and optimizer average ",
      vectorElements_);
  residual_ = flat.clone();
}

}  // namespace hetra::train
