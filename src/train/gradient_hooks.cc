#include "train/gradient_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

namespace hetra::train {

uintptr_t onGradientAccumulated(torch::autograd::Node& accumulator, std::function<void()> ready) {
  return accumulator.add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [ready = std::move(ready)](const torch::autograd::variable_list& outputs,
                                 const torch::autograd::variable_list&) {
        ready();
        return outputs;
      }));
}

}  // namespace hetra::train
