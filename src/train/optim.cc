// Vocabulary: see optim.h.
#include "train/optim.h"

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include "train/fused_optim.h"

#include <cmath>

#include "common/errors.h"

namespace hetra::train {
namespace {

void requireAtLeast(double value, double least, const char* key) {
  if (!(value >= least))  // also rejects NaN
    throw ConfigError(str("train.", key, " = ", value, " is not allowed; it must be >= ", least));
}

void requireBelowOne(double value, const char* key) {
  if (!(value >= 0.0 && value < 1.0))
    throw ConfigError(str("train.", key, " = ", value, " is not allowed; it must be in [0, 1)"));
}

}  // namespace

namespace {

// LibTorch's key of a parameter's state (the optimizers' own: its TensorImpl's address).
std::string stateKey(const torch::Tensor& param) {
  return c10::guts::to_string(param.unsafeGetTensorImpl());
}

template <class AdamState>
ParameterState adamStateOf(const AdamState& state) {
  ParameterState out;
  out.steps = state.step();
  out.tensors = {state.exp_avg(), state.exp_avg_sq()};
  if (state.max_exp_avg_sq().defined()) out.tensors.push_back(state.max_exp_avg_sq());
  return out;
}

template <class AdamState>
std::unique_ptr<AdamState> adamStateFrom(ParameterState state) {
  if (state.tensors.size() < 2 || state.tensors.size() > 3)
    throw ConfigError(str("an adam state of ", state.tensors.size(), " tensors (2 or 3 expected)"));
  auto out = std::make_unique<AdamState>();
  out->step(state.steps);
  out->exp_avg(state.tensors[0]);
  out->exp_avg_sq(state.tensors[1]);
  if (state.tensors.size() == 3) out->max_exp_avg_sq(state.tensors[2]);
  return out;
}

}  // namespace

ParameterState parameterStateOf(torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  auto& states = optimizer.state();
  const auto found = states.find(stateKey(param));
  if (found == states.end()) return {};
  const torch::optim::OptimizerParamState* state = found->second.get();
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
    ParameterState out;
    if (sgd->momentum_buffer().defined()) out.tensors = {sgd->momentum_buffer()};
    return out;
  }
  if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state))
    return adamStateOf(*adam);
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state))
    return adamStateOf(*adamw);
  throw ConfigError("an optimizer state of a kind other than sgd, adam and adamw");
}

void setParameterState(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                       ParameterState state) {
  if (state.tensors.empty() && state.steps == 0) return;
  std::unique_ptr<torch::optim::OptimizerParamState> made;
  if (dynamic_cast<torch::optim::SGD*>(&optimizer)) {
    if (state.tensors.size() != 1)
      throw ConfigError(str("an sgd state of ", state.tensors.size(), " tensors (1 expected)"));
    auto sgd = std::make_unique<torch::optim::SGDParamState>();
    sgd->momentum_buffer(state.tensors[0]);
    made = std::move(sgd);
  } else if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
    made = adamStateFrom<torch::optim::AdamWParamState>(std::move(state));
  } else if (dynamic_cast<torch::optim::Adam*>(&optimizer)) {
    made = adamStateFrom<torch::optim::AdamParamState>(std::move(state));
  } else {
    throw ConfigError("an optimizer other than sgd, adam and adamw keeps no movable state");
  }
  optimizer.state()[stateKey(param)] = std::move(made);
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(std::vector<torch::Tensor> params,
                                                       const OptimSpec& spec) {
  requireAtLeast(spec.lr, 0.0, "lr");
  requireAtLeast(spec.weightDecay, 0.0, "weight_decay");
  if (spec.name == "sgd") {
    requireAtLeast(spec.momentum, 0.0, "momentum");
    if (spec.nesterov && spec.momentum <= 0.0)
      throw ConfigError(
          str("train.nesterov = true needs train.momentum > 0 (it is ", spec.momentum, ")"));
    auto options = torch::optim::SGDOptions(spec.lr)
                       .momentum(spec.momentum)
                       .nesterov(spec.nesterov)
                       .weight_decay(spec.weightDecay);
    return std::make_unique<FusedSgd>(std::move(params), options);
  }
  if (spec.name != "adam" && spec.name != "adamw")
    throw ConfigError(str("train.optimizer = \"", spec.name,
                          "\" is not an optimizer; allowed: sgd, adam, adamw"));
  requireBelowOne(spec.beta1, "betas[0]");
  requireBelowOne(spec.beta2, "betas[1]");
  requireAtLeast(spec.eps, 0.0, "eps");
  const auto betas = std::make_tuple(spec.beta1, spec.beta2);
  if (spec.name == "adam") {
    auto options = torch::optim::AdamOptions(spec.lr).betas(betas).eps(spec.eps).weight_decay(
        spec.weightDecay);
    return std::make_unique<FusedAdam>(std::move(params), options);
  }
  auto options =
      torch::optim::AdamWOptions(spec.lr).betas(betas).eps(spec.eps).weight_decay(spec.weightDecay);
  return std::make_unique<FusedAdamW>(std::move(params), options);
}

LrSchedule::LrSchedule(const LrScheduleSpec& spec) : spec_(spec) {
  requireAtLeast(spec.lr, 0.0, "lr");
  if (spec.warmupSteps < 0)
    throw ConfigError(
        str("train.warmup_steps = ", spec.warmupSteps, " is not allowed; it must be >= 0"));
  if (spec.kind == "cosine") {
    if (spec.totalSteps <= spec.warmupSteps)
      throw ConfigError(str("train.lr_schedule = \"cosine\" needs more steps (", spec.totalSteps,
                            ") than train.warmup_steps (", spec.warmupSteps, ")"));
  } else if (spec.kind != "constant") {
    throw ConfigError(str("train.lr_schedule = \"", spec.kind,
                          "\" is not a schedule; allowed: constant, cosine"));
  }
}

double LrSchedule::lrAt(int64_t step) const {
  HETRA_ENFORCE_GE(step, 0, "steps count from 0");
  if (step < spec_.warmupSteps) return spec_.lr * double(step + 1) / double(spec_.warmupSteps);
  if (spec_.kind == "constant") return spec_.lr;
  if (step >= spec_.totalSteps) return 0.0;
  const double p = double(step - spec_.warmupSteps) / double(spec_.totalSteps - spec_.warmupSteps);
  return spec_.lr * 0.5 * (1.0 + std::cos(M_PI * p));
}

void applyLr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

double clipGradNorm(const std::vector<torch::Tensor>& params, double maxNorm) {
  HETRA_ENFORCE(maxNorm > 0.0, "the gradient clipping norm must be positive, not ", maxNorm);
  return torch::nn::utils::clip_grad_norm_(params, maxNorm);
}

}  // namespace hetra::train
