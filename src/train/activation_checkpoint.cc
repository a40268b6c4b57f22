#include "train/activation_checkpoint.h"

#include <torch/csrc/autograd/custom_function.h>

#include <mutex>

#include "common/errors.h"
#include "train/counting_allocator.h"

namespace hetra::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved input: the block and the generator state it ran with.
// Held in the context's saved data as a capsule, the one kind of IValue that holds an arbitrary
// C++ object without registering a TorchScript class.
struct Recompute : torch::CustomClassHolder {
  Block block;
  bool restoreRng = true;
  std::function<void()> beforeRecompute;
  std::function<void(std::vector<torch::Tensor>&)> takeGradients;
  torch::Tensor rngState;
};

at::Generator& cpuGenerator() {
  static at::Generator generator = at::detail::getDefaultCPUGenerator();
  return generator;
}

torch::Tensor generatorState() {
  std::lock_guard<std::mutex> lock(cpuGenerator().mutex());
  return cpuGenerator().get_state();
}

void setGeneratorState(const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(cpuGenerator().mutex());
  cpuGenerator().set_state(state);
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const Block* block,
                               const CheckpointOptions* options, const torch::Tensor& input,
                               at::TensorList parameters) {
    auto recompute = c10::make_intrusive<Recompute>();
    recompute->block = *block;
    recompute->restoreRng = options->preserveRngState;
    recompute->beforeRecompute = options->beforeRecompute;
    recompute->takeGradients = options->takeGradients;
    if (recompute->restoreRng) recompute->rngState = generatorState();
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    variable_list saved = {input};
    saved.insert(saved.end(), parameters.begin(), parameters.end());
    ctx->save_for_backward(saved);
    // Function::apply runs forward below the autograd dispatch: nothing inside is recorded.
    return (*block)(input);
  }

  static variable_list backward(AutogradContext* ctx, variable_list gradOutputs) {
    auto recompute =
        c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    torch::Tensor input = saved.at(0).detach().requires_grad_(saved[0].requires_grad());
    torch::Tensor output;
    if (recompute->beforeRecompute) recompute->beforeRecompute();
    {
      torch::AutoGradMode grad(true);
      torch::Tensor callerState;
      if (recompute->restoreRng) {
        callerState = generatorState();
        setGeneratorState(recompute->rngState);
      }
      output = recompute->block(input);
      if (recompute->restoreRng) setGeneratorState(callerState);
    }
    // The recompute's leaves: the detached input and the parameters (saved after the input).
    variable_list leaves;
    if (input.requires_grad()) leaves.push_back(input);
    leaves.insert(leaves.end(), saved.begin() + 1, saved.end());
    variable_list grads = torch::autograd::grad({output}, leaves, {gradOutputs.at(0)},
                                                /*retain_graph=*/false, /*create_graph=*/false,
                                                /*allow_unused=*/true);
    variable_list out = {torch::Tensor(), torch::Tensor()};  // block, options
    size_t next = 0;
    out.push_back(input.requires_grad() ? grads[next++] : torch::Tensor());
    if (recompute->takeGradients) {
      variable_list parameterGrads(grads.begin() + long(next), grads.end());
      recompute->takeGradients(parameterGrads);
      grads.resize(next);
      grads.insert(grads.end(), parameterGrads.begin(), parameterGrads.end());
    }
    // The parameters' gradients wait in the engine's buffers until their accumulators run, which
    // may be after other blocks' recomputes: they are gradients, not this block's activations.
    for (; next < grads.size(); ++next) {
      if (grads[next].defined()) recategorize(grads[next], device::MemoryCategory::kGradients);
      out.push_back(grads[next]);
    }
    return out;
  }
};

}  // namespace

torch::Tensor checkpoint(const Block& block, const torch::Tensor& input,
                         const std::vector<torch::Tensor>& parameters,
                         const CheckpointOptions& options) {
  std::vector<torch::Tensor> trainable;
  for (const auto& p : parameters)
    if (p.requires_grad()) trainable.push_back(p);
  if (!torch::GradMode::is_enabled() || (trainable.empty() && !input.requires_grad()))
    return block(input);
  return CheckpointFunction::apply(&block, &options, input, at::TensorList(trainable));
}

}  // namespace hetra::train
