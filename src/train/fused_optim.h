// SGD, Adam and AdamW whose step makes one pass over each parameter's memory.
//
// LibTorch's optimizers run each update as a chain of tensor operations (for Nesterov SGD: scale
// the momentum buffer, add the gradient, add again into a new tensor, add into the parameter),
// each a separate pass over memory, some allocating. In the demo's training loop (a 670K-parameter
// MLP, one core per rank) that step takes 0.42-0.46 ms, the one-pass loop 0.20-0.26 ms, all of it
// on the critical path of every rank (docs/benchmarks.md). These classes keep LibTorch's options,
// state layout and checkpoint format (they are the same classes to the rest of LibTorch: a
// checkpoint written by one loads into the other) and compute the same update, element by element
// in one loop; the results agree with LibTorch's to float rounding (tests/test_optim.cc).
//
// Parameters that are not contiguous float32 CPU tensors with a gradient of the same kind are
// updated by the LibTorch operations of the base class instead, so any model still trains.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "train/one_pass_update.h"

namespace hetra::train {

class FusedSgd : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// Adam's or AdamW's state (State: their own class) of `p` before its first step: step 0, zero
// moments.
template <class State>
std::unique_ptr<State> freshAdamState(const torch::Tensor& p) {
  auto fresh = std::make_unique<State>();
  fresh->step(0);
  fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  return fresh;
}

// The state slot of parameter `p` in `optimizer`'s own map (empty before its first step), keyed
// as this LibTorch version keys it.
std::unique_ptr<torch::optim::OptimizerParamState>& paramStateSlot(
    torch::optim::Optimizer& optimizer, const torch::Tensor& p);

}  // namespace hetra::train
