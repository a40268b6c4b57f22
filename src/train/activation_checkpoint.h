// Activation checkpointing (docs/memory.md): a block's forward runs without recording its
// activations, and backward recomputes them just before it needs them, so a model of B blocks
// holds B block inputs and one block's activations instead of B blocks' activations, at the cost
// of a second forward of each block.
//
// LibTorch 1.13 has no C++ checkpoint API (pytorch#52744); this is a torch::autograd::Function.
// The block's parameters are inputs of that function, so their gradients reach their
// accumulators as a plain block's do (DataParallel's hooks fire for them as usual). The default
// CPU generator's state is saved before the forward and restored for the recompute, so dropout
// draws the same mask both times; the caller's generator state is put back afterwards.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace hetra::train {

// A block: a function of one tensor, using the parameters given beside it.
using Block = std::function<torch::Tensor(const torch::Tensor&)>;

struct CheckpointOptions {
  // Restore the RNG state for the recompute. Off only to show why it must be on: a block that
  // draws random numbers (dropout) would recompute different activations from those the forward
  // used, and its gradients would be wrong.
  bool preserveRngState = true;
  // Around backward's recompute of the block (ZeRO-3 gathers the block's parameters before it and
  // frees them after, train/zero_parallel.h). takeGradients receives the gradients of the
  // trainable parameters, in order, before they go to their accumulators; it may take them
  // (leave a tensor undefined and that parameter's accumulator receives nothing).
  std::function<void()> beforeRecompute;
  std::function<void(std::vector<torch::Tensor>& gradients)> takeGradients;
};

// `block(input)`, checkpointed. `parameters` are every tensor the block reads that needs a
// gradient (a module's parameters()); those that do not require one are skipped. Without grad
// mode, or when neither the input nor a parameter requires a gradient, it is block(input).
torch::Tensor checkpoint(const Block& block, const torch::Tensor& input,
                         const std::vector<torch::Tensor>& parameters,
                         const CheckpointOptions& options = {});

// A module's forward, checkpointed: checkpoint(forward, input, module.parameters()).
template <typename ModuleHolder>
torch::Tensor checkpoint(ModuleHolder& module, const torch::Tensor& input,
                         const CheckpointOptions& options = {}) {
  return checkpoint([&module](const torch::Tensor& x) { return module->forward(x); }, input,
                    module->parameters(), options);
}

}  // namespace hetra::train
