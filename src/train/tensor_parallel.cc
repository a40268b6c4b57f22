#include "train/tensor_parallel.h"

#include <torch/autograd.h>

#include <cmath>
#include <map>
#include <utility>

#include "balance/tensor_split.h"
#include "common/errors.h"
#include "device/compute_scope.h"
#include "device/memory_accounting.h"

namespace hetra::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The sum over the group of every rank's `x`, in a new tensor.
torch::Tensor allreduceSum(const torch::Tensor& x, comm::Communicator& group) {
  torch::Tensor sum = x.contiguous().clone();
  // An emulated device's work since the segment began (or since the last allreduce) is stretched
  // now, before it communicates (docs/benchmarks.md: "a tensor-parallel block between its
  // allreduces" is a compute segment).
  device::settleOpenSegment();
  device::ComputePause waiting;
  group
      .allreduce(sum.data_ptr<float>(), sum.data_ptr<float>(), size_t(sum.numel()), DType::F32,
                 comm::ReduceOp::Sum)
      ->wait();
  return sum;
}

// The group rides in the context as an address: it outlives every graph its model builds.
int64_t addressOf(comm::Communicator& group) {
  return int64_t(reinterpret_cast<intptr_t>(&group));
}
comm::Communicator& groupAt(AutogradContext* ctx) {
  return *reinterpret_cast<comm::Communicator*>(intptr_t(ctx->saved_data["group"].toInt()));
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {allreduceSum(grads[0], groupAt(ctx)), torch::Tensor()};
  }
};

struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return allreduceSum(x, groupAt(ctx));
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One pre-LayerNorm layer with this rank's heads and hidden units (models.cc's Block, split).
class TensorParallelLayer : public torch::nn::Module {
 public:
  TensorParallelLayer(const ModelSpec& spec, int64_t heads, int64_t hidden,
                      comm::Communicator& group)
      : heads_(heads), headDim_(spec.dim / spec.heads), group_(group) {
    const int64_t d = spec.dim, width = heads * headDim_;
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv_ = register_module("qkv", torch::nn::Linear(d, 3 * width));
    proj_ = register_module("proj", torch::nn::Linear(width, d));  // its bias is added once
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc1_ = register_module("fc1", torch::nn::Linear(d, hidden));
    fc2_ = register_module("fc2", torch::nn::Linear(hidden, d));
  }

  torch::Tensor forward(torch::Tensor x) {  // [N, T, D], the same on every rank
    x = x + attention(copyToTensorGroup(ln1_->forward(x), group_));
    const auto h = torch::gelu(fc1_->forward(copyToTensorGroup(ln2_->forward(x), group_)));
    return x + reduceFromTensorGroup(torch::linear(h, fc2_->weight), group_) + fc2_->bias;
  }

 private:
  torch::Tensor attention(const torch::Tensor& x) {
    const int64_t n = x.size(0), t = x.size(1);
    // [N, T, 3, heads, dh] -> [3, N, heads, T, dh]: this rank's heads only.
    auto qkv = qkv_->forward(x).view({n, t, 3, heads_, headDim_}).permute({2, 0, 3, 1, 4});
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(headDim_)));
    auto out = torch::matmul(torch::softmax(scores, -1), v);  // [N, heads, T, dh]
    const auto partial =
        torch::linear(out.transpose(1, 2).reshape({n, t, heads_ * headDim_}), proj_->weight);
    return reduceFromTensorGroup(partial, group_) + proj_->bias;
  }

  int64_t heads_, headDim_;
  comm::Communicator& group_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
};

int64_t sum(const std::vector<int64_t>& v, size_t count) {
  int64_t s = 0;
  for (size_t i = 0; i < count; ++i) s += v[i];
  return s;
}

}  // namespace

torch::Tensor copyToTensorGroup(const torch::Tensor& x, comm::Communicator& group) {
  return CopyToGroup::apply(x, addressOf(group));
}

torch::Tensor reduceFromTensorGroup(const torch::Tensor& x, comm::Communicator& group) {
  return ReduceFromGroup::apply(x, addressOf(group));
}

TensorSplit tensorSplitFor(const ModelSpec& spec, const std::vector<double>& speeds, bool even) {
  if (spec.name != "transformer")
    throw ConfigError(
        str("parallel.tensor splits the transformer's heads and MLP units; model.name = \"",
            spec.name, "\" has neither (use data or pipeline parallelism)"));
  if (spec.causal) throw ConfigError("parallel.tensor does not split a causal transformer yet");
  if (spec.heads < int64_t(speeds.size()))
    throw ConfigError(str("model.heads = ", spec.heads, " cannot give each of the ", speeds.size(),
                          " tensor-parallel devices a head"));
  const int64_t hidden = spec.mlpRatio * spec.dim;
  if (even) {
    if (spec.heads % int64_t(speeds.size()) != 0)
      throw ConfigError(str("an even tensor split needs model.heads = ", spec.heads,
                            " divisible by the ", speeds.size(), " devices"));
    return {balance::splitUnitsEvenly(spec.heads, speeds.size()),
            balance::splitUnitsEvenly(hidden, speeds.size())};
  }
  return {balance::splitUnitsBySpeed(spec.heads, speeds),
          balance::splitUnitsBySpeed(hidden, speeds)};
}

TensorParallelTransformer::TensorParallelTransformer(const ModelSpec& spec, TensorSplit split,
                                                     std::shared_ptr<comm::Communicator> group)
    : spec_(spec), split_(std::move(split)), group_(std::move(group)) {
  const size_t ranks = size_t(group_->size()), rank = size_t(group_->rank());
  if (spec_.name != "transformer")
    throw ConfigError("TensorParallelTransformer splits the transformer only");
  if (split_.heads.size() != ranks || split_.hidden.size() != ranks)
    throw ConfigError(str("a tensor split of ", split_.heads.size(), " heads and ",
                          split_.hidden.size(), " hidden parts for a group of ", ranks));
  if (sum(split_.heads, ranks) != spec_.heads ||
      sum(split_.hidden, ranks) != spec_.mlpRatio * spec_.dim)
    throw ConfigError(str("the tensor split holds ", sum(split_.heads, ranks), " heads and ",
                          sum(split_.hidden, ranks), " hidden units; the model has ", spec_.heads,
                          " and ", spec_.mlpRatio * spec_.dim));
  for (size_t r = 0; r < ranks; ++r)
    if (split_.heads[r] < 1 || split_.hidden[r] < 1)
      throw ConfigError(str("tensor-parallel rank ", r, " holds ", split_.heads[r], " heads and ",
                            split_.hidden[r],
                            " hidden units; every rank needs at least one of each"));
  headBegin_ = sum(split_.heads, rank);
  hiddenBegin_ = sum(split_.hidden, rank);

  const int64_t tokenFeatures = [&] {
    int64_t f = 1;
    for (int64_t d : spec_.sampleShape) f *= d;
    return f / spec_.seqLen;
  }();
  auto embed = register_module("embed", torch::nn::Linear(tokenFeatures, spec_.dim));
  auto pos = register_parameter("pos", torch::empty({spec_.seqLen, spec_.dim}));
  auto embedParameters = embed->parameters();
  embedParameters.push_back(pos);
  const int64_t seqLen = spec_.seqLen;
  addBlock("embed", embedParameters, [embed, pos, seqLen, tokenFeatures](const torch::Tensor& x) {
    return embed->forward(x.reshape({x.size(0), seqLen, tokenFeatures})) + pos;
  });
  for (int64_t i = 0; i < spec_.layers; ++i) {
    const std::string name = "block" + std::to_string(i);
    auto layer =
        register_module(name, std::make_shared<TensorParallelLayer>(spec_, split_.heads[rank],
                                                                    split_.hidden[rank], *group_));
    addBlock(name, layer->parameters(),
             [layer](const torch::Tensor& x) { return layer->forward(x); });
  }
  auto ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({spec_.dim})));
  auto head = register_module("head", torch::nn::Linear(spec_.dim, spec_.classes));
  auto headParameters = ln->parameters();
  for (const auto& p : head->parameters()) headParameters.push_back(p);
  addBlock("head", headParameters,
           [ln, head](const torch::Tensor& x) { return head->forward(ln->forward(x).mean(1)); });

  // The whole model's initial values, cut: built in host memory, outside the device's cap.
  std::map<std::string, torch::Tensor> whole;
  {
    device::MemoryScope host(device::MemoryCategory::kHostData);
    for (const auto& item : makeModel(spec_)->named_parameters())
      whole.emplace(item.key(), item.value().detach());
  }
  torch::NoGradGuard noGrad;
  size_t matched = 0;
  for (auto& item : named_parameters()) {
    const auto found = whole.find(item.key());
    HETRA_ENFORCE(found != whole.end(), "tensor-parallel parameter ", item.key(),
                  " is not one of the transformer's");
    item.value().copy_(sliceOf(item.key(), found->second));
    ++matched;
  }
  HETRA_ENFORCE_EQ(matched, whole.size(), "every parameter of the transformer has its slice");
}

torch::Tensor TensorParallelTransformer::prologue(torch::Tensor x) {
  HETRA_ENFORCE(x.dim() == int64_t(spec_.sampleShape.size()) + 1, "model input ", x.sizes(),
                " is not a batch of samples of ", spec_.sampleShape.size(), " dimensions");
  return x;
}

torch::Tensor TensorParallelTransformer::sliceOf(const std::string& name,
                                                 const torch::Tensor& whole) const {
  const int64_t rank = group_->rank(), dh = spec_.dim / spec_.heads;
  const int64_t heads = split_.heads[size_t(rank)], hidden = split_.hidden[size_t(rank)];
  if (endsWith(name, ".qkv.weight") || endsWith(name, ".qkv.bias")) {
    // Rows w * D + h * dh + j (w: q, k, v; h: head): this rank's heads of each of the three.
    std::vector<torch::Tensor> parts;
    for (int64_t w = 0; w < 3; ++w)
      parts.push_back(whole.narrow(0, w * spec_.dim + headBegin_ * dh, heads * dh));
    return torch::cat(parts, 0);
  }
  if (endsWith(name, ".proj.weight")) return whole.narrow(1, headBegin_ * dh, heads * dh);
  if (endsWith(name, ".fc1.weight") || endsWith(name, ".fc1.bias"))
    return whole.narrow(0, hiddenBegin_, hidden);
  if (endsWith(name, ".fc2.weight")) return whole.narrow(1, hiddenBegin_, hidden);
  return whole;  // replicated
}

}  // namespace hetra::train
