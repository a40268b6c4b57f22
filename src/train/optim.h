// Optimizers, learning-rate schedules and gradient clipping (checkpoints: train/checkpoint.h).
//
// Vocabulary:
//   step        0-based index of an optimizer step; lrAt(step) is the rate that step uses.
//   warm-up     steps [0, warmupSteps): the rate rises linearly, lr * (step + 1) / warmupSteps,
//               so the first step already moves and step warmupSteps - 1 uses the full rate.
//   cosine      after warm-up the rate is lr * (1 + cos(pi * p)) / 2 with
//               p = (step - warmupSteps) / (totalSteps - warmupSteps): it reaches 0 at step
//               totalSteps, one past the last step, so every step of the run still moves.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hetra::train {

struct OptimSpec {
  std::string name = "sgd";  // sgd | adam | adamw
  double lr = 0.1;
  double momentum = 0.0;     // sgd
  bool nesterov = false;     // sgd, needs momentum > 0
  double weightDecay = 0.0;  // sgd, adam: L2 added to the gradient; adamw: decoupled
  double beta1 = 0.9;        // adam, adamw
  double beta2 = 0.999;      // adam, adamw
  double eps = 1e-8;         // adam, adamw
};

// Throws ConfigError naming the option for a value the optimizer does not allow.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(std::vector<torch::Tensor> params,
                                                       const OptimSpec& spec);

struct LrScheduleSpec {
  std::string kind = "constant";  // constant | cosine
  double lr = 0.1;
  int64_t totalSteps = 0;  // cosine: steps of the run
  int64_t warmupSteps = 0;
};

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleSpec& spec);  // ConfigError for a bad spec
  double lrAt(int64_t step) const;

 private:
  LrScheduleSpec spec_;
};

// One parameter's optimizer state as plain tensors, to move the parameter to another rank (a
// pipeline moving blocks between stages): sgd its momentum buffer, adam and adamw their two
// moments (and amsgrad's maximum), each of the parameter's shape, with the steps taken. No
// tensors before the parameter's first step (or for sgd without momentum).
struct ParameterState {
  int64_t steps = 0;
  std::vector<torch::Tensor> tensors;
};

// What makeOptimizer's `optimizer` keeps for `param` (the state stays in the optimizer).
ParameterState parameterStateOf(torch::optim::Optimizer& optimizer, const torch::Tensor& param);
// Gives `param`, one of `optimizer`'s parameters, the state taken from another optimizer of the
// same kind (nothing for an empty one). ConfigError for tensors the optimizer's kind does not keep.
void setParameterState(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                       ParameterState state);

// Sets the learning rate of every parameter group.
void applyLr(torch::optim::Optimizer& optimizer, double lr);

// Scales all gradients so that their global L2 norm is at most maxNorm; returns the norm before
// scaling. Parameters without a gradient are skipped.
double clipGradNorm(const std::vector<torch::Tensor>& params, double maxNorm);

}  // namespace hetra::train
