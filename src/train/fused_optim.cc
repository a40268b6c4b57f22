#include "train/fused_optim.h"

#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>

namespace hetra::train {
namespace {

// LibTorch 1.x keys an optimizer's state by the printed address of the parameter's TensorImpl,
// 2.x by the address itself; the map's key type says which.
template <class StateMap>
typename StateMap::key_type stateKey(const torch::Tensor& p) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << static_cast<const void*>(p.unsafeGetTensorImpl());
    return os.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

bool fusable(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat32 &&
         t.is_contiguous() && t.layout() == torch::kStrided;
}

// True when every parameter with a gradient can take the one-pass update.
bool allFusable(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  for (const auto& group : groups)
    for (const auto& p : group.params()) {
      const auto& g = p.grad();
      if (!g.defined()) continue;
      if (!fusable(p) || !fusable(g) || g.numel() != p.numel()) return false;
    }
  return true;
}

torch::Tensor evaluate(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enableGrad(true);
  return closure();
}

// State is the optimizer's own state class (Adam and AdamW each have one; LibTorch casts to it
// when it saves or loads a checkpoint).
template <class Options, class State, bool kDecoupled, class Map>
void adamStep(std::vector<torch::optim::OptimizerParamGroup>& groups, Map& state) {
  for (auto& group : groups) {
    auto& options = static_cast<Options&>(group.options());
    const double beta1 = std::get<0>(options.betas()), beta2 = std::get<1>(options.betas());
    const double decay = options.weight_decay(), lr = options.lr();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state[stateKey<Map>(p)];
      if (!slot) slot = freshAdamState<State>(p);
      auto& s = static_cast<State&>(*slot);
      s.step(s.step() + 1);
      torch::Tensor& m = s.exp_avg();  // dependent type: name the tensors before data_ptr<float>
      torch::Tensor& v = s.exp_avg_sq();
      AdamUpdate update;
      update.lr = lr;
      update.weightDecay = decay;
      update.beta1 = beta1;
      update.beta2 = beta2;
      update.eps = options.eps();
      update.step = s.step();
      update.decoupled = kDecoupled;
      adamUpdate(p.data_ptr<float>(), p.grad().data_ptr<float>(), m.data_ptr<float>(),
                 v.data_ptr<float>(), p.numel(), update);
    }
  }
}

// Adam's or AdamW's step: the one-pass loop, or LibTorch's own operations (`fallback`) for
// AMSGrad and for parameters the loop cannot take.
template <class Options, class State, bool kDecoupled, class Map, class Fallback>
torch::Tensor adamStepOrFallback(std::vector<torch::optim::OptimizerParamGroup>& groups, Map& state,
                                 torch::optim::Optimizer::LossClosure closure, Fallback fallback) {
  for (const auto& group : groups)
    if (static_cast<const Options&>(group.options()).amsgrad()) return fallback(std::move(closure));
  if (!allFusable(groups)) return fallback(std::move(closure));
  torch::NoGradGuard noGrad;
  torch::Tensor loss = evaluate(closure);
  adamStep<Options, State, kDecoupled>(groups, state);
  return loss;
}

}  // namespace

torch::Tensor FusedSgd::step(LossClosure closure) {
  if (!allFusable(param_groups_)) return torch::optim::SGD::step(std::move(closure));
  torch::NoGradGuard noGrad;
  torch::Tensor loss = evaluate(closure);
  using Map = std::remove_reference_t<decltype(state_)>;
  for (auto& group : param_groups_) {
    auto& options = static_cast<torch::optim::SGDOptions&>(group.options());
    const double momentum = options.momentum(), decay = options.weight_decay();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      float* buffer = nullptr;
      bool first = false;
      if (momentum != 0) {
        auto& slot = state_[stateKey<Map>(p)];
        if (!slot) {
          auto fresh = std::make_unique<torch::optim::SGDParamState>();
          fresh->momentum_buffer(torch::empty_like(p, torch::MemoryFormat::Preserve));
          slot = std::move(fresh);
          first = true;
        }
        buffer =
            static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer().data_ptr<float>();
      }
      SgdUpdate update;
      update.lr = options.lr();
      update.weightDecay = decay;
      update.momentum = momentum;
      update.dampening = options.dampening();
      update.nesterov = options.nesterov();
      update.firstStep = first;
      sgdUpdate(p.data_ptr<float>(), p.grad().data_ptr<float>(), buffer, p.numel(), update);
    }
  }
  return loss;
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  return adamStepOrFallback<torch::optim::AdamOptions, torch::optim::AdamParamState, false>(
      param_groups_, state_, std::move(closure),
      [this](LossClosure c) { return torch::optim::Adam::step(std::move(c)); });
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  return adamStepOrFallback<torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>(
      param_groups_, state_, std::move(closure),
      [this](LossClosure c) { return torch::optim::AdamW::step(std::move(c)); });
}

std::unique_ptr<torch::optim::OptimizerParamState>& paramStateSlot(
    torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  auto& state = optimizer.state();
  return state[stateKey<std::remove_reference_t<decltype(state)>>(p)];
}

}  // namespace hetra::train
