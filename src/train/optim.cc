// Vocabulary: see optim.h.
#include "train/optim.h"

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <cmath>
#include <filesystem>

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

// Names and shapes of a module's parameters and buffers, in registration order.
std::vector<std::pair<std::string, std::vector<int64_t>>> shapes(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& item : model.named_parameters())
    out.emplace_back(item.key(), item.value().sizes().vec());
  for (const auto& item : model.named_buffers())
    out.emplace_back(item.key(), item.value().sizes().vec());
  return out;
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
    return std::make_unique<torch::optim::SGD>(std::move(params), options);
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
    return std::make_unique<torch::optim::Adam>(std::move(params), options);
  }
  auto options =
      torch::optim::AdamWOptions(spec.lr).betas(betas).eps(spec.eps).weight_decay(spec.weightDecay);
  return std::make_unique<torch::optim::AdamW>(std::move(params), options);
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

void saveCheckpoint(const std::string& path, const torch::nn::Module& model,
                    const torch::optim::Optimizer& optimizer, const CheckpointInfo& info) {
  const std::string tmp = path + ".tmp";
  try {
    torch::serialize::OutputArchive root, modelArchive, optimArchive;
    model.save(modelArchive);
    optimizer.save(optimArchive);
    root.write("model", modelArchive);
    root.write("optimizer", optimArchive);
    // LibTorch's optimizer archive restores the state (moments, step counts) but not the options
    // of the parameter groups, so the learning rates, which a schedule changes, are kept here.
    std::vector<double> lrs;
    for (const auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
    root.write("lrs", torch::tensor(lrs, torch::kFloat64));
    root.write("step", c10::IValue(info.step));
    root.write("text", c10::IValue(info.text));
    root.save_to(tmp);
  } catch (const c10::Error& e) {
    throw IoError(str("cannot write checkpoint '", tmp, "': ", e.what_without_backtrace()));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    throw IoError(str("cannot rename checkpoint '", tmp, "' to '", path, "': ", ec.message()));
}

CheckpointInfo loadCheckpoint(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer) {
  if (!std::filesystem::exists(path)) throw IoError(str("checkpoint '", path, "' does not exist"));
  CheckpointInfo info;
  torch::serialize::InputArchive root, modelArchive, optimArchive;
  try {
    root.load_from(path);
  } catch (const c10::Error& e) {
    throw IoError(str("cannot read checkpoint '", path, "': ", e.what_without_backtrace()));
  }
  try {
    root.read("model", modelArchive);
    root.read("optimizer", optimArchive);
    c10::IValue step, text;
    root.read("step", step);
    root.read("text", text);
    torch::Tensor lrs;
    root.read("lrs", lrs);
    info.step = step.toInt();
    info.text = text.toStringRef();
    if (lrs.numel() != int64_t(optimizer.param_groups().size()))
      throw IoError(str("checkpoint '", path, "' has ", lrs.numel(),
                        " parameter groups, the optimizer ", optimizer.param_groups().size()));
    // Module::load replaces each tensor by the stored one without comparing shapes: compare here.
    const auto before = shapes(model);
    model.load(modelArchive);
    const auto after = shapes(model);
    for (size_t i = 0; i < before.size(); ++i)
      if (before[i].second != after[i].second)
        throw IoError(hetra::str("checkpoint '", path, "' does not fit this model: '",
                                 before[i].first, "' is ", c10::IntArrayRef(after[i].second),
                                 " in the checkpoint and ", c10::IntArrayRef(before[i].second),
                                 " in the model"));
    optimizer.load(optimArchive);
    for (size_t g = 0; g < optimizer.param_groups().size(); ++g)
      optimizer.param_groups()[g].options().set_lr(lrs[int64_t(g)].item<double>());
  } catch (const c10::Error& e) {
    throw IoError(str("checkpoint '", path,
                      "' does not fit this model and optimizer: ", e.what_without_backtrace()));
  }
  return info;
}

}  // namespace hetra::train
