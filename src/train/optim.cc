// Vocabulary: see optim.h.
#include "train/optim.h"

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
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
