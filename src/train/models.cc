// Vocabulary: see models.h. Below, per sample: F = elements of a sample, T = seqLen tokens, D =
// dim, H = heads, M = mlpRatio * D; a *block* is one conv block (cnn) or one transformer layer.
#include "train/models.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/errors.h"
#include "train/activation_checkpoint.h"

namespace hetra::train {
namespace {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (int64_t d : shape) p *= d;
  return p;
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void requirePositive(int64_t value, const char* field) {
  if (value < 1)
    throw ConfigError(str("model.", field, " = ", value, " is not allowed; it must be >= 1"));
}

// Fills parameters from a generator of our own: std::uniform_real_distribution's algorithm is not
// fixed by the standard and LibTorch's generator may change between versions, this does not.
class Init {
 public:
  explicit Init(uint64_t seed) : rng_(seed * 0x9e3779b97f4a7c15ull + 0x6a09e667f3bcc909ull) {}

  void uniform(const torch::Tensor& t, double bound) {
    std::vector<float> values(size_t(t.numel()));
    for (float& v : values) v = float((2.0 * unit() - 1.0) * bound);
    torch::NoGradGuard noGrad;
    t.copy_(torch::from_blob(values.data(), t.sizes(), torch::kFloat32));
  }
  void fill(const torch::Tensor& t, double value) {
    torch::NoGradGuard noGrad;
    t.fill_(value);
  }
  // LibTorch's default bound for Linear and Conv: 1/sqrt(fan_in), weights and biases alike.
  void linear(const torch::nn::Linear& l) {
    const double bound = 1.0 / std::sqrt(double(l->options.in_features()));
    uniform(l->weight, bound);
    uniform(l->bias, bound);
  }
  void conv(const torch::nn::Conv2d& c) {
    const double bound = 1.0 / std::sqrt(double(c->weight[0].numel()));
    uniform(c->weight, bound);
    uniform(c->bias, bound);
  }
  void layerNorm(const torch::nn::LayerNorm& n) {
    fill(n->weight, 1.0);
    fill(n->bias, 0.0);
  }

 private:
  double unit() { return double(rng_() >> 11) * 0x1.0p-53; }  // [0, 1), 53 random bits
  std::mt19937_64 rng_;
};

// A wrong input shape is a bug in the caller: name both shapes rather than fail inside a matmul.
void checkInput(const torch::Tensor& x, const std::vector<int64_t>& sampleShape) {
  bool ok = x.dim() == int64_t(sampleShape.size()) + 1;
  for (size_t i = 0; ok && i < sampleShape.size(); ++i)
    ok = x.size(int64_t(i) + 1) == sampleShape[i];
  HETRA_ENFORCE(ok, "model input ", x.sizes(), " is not [N, ", shapeText(sampleShape).substr(1));
}

// ---- mlp ----------------------------------------------------------------------------------------

// Blocks: fc0, fc1, ... (linear + ReLU), out.
class Mlp : public BlockModel {
 public:
  Mlp(const ModelSpec& spec, Init& init) : sampleShape_(spec.sampleShape) {
    int64_t in = product(spec.sampleShape);
    for (size_t i = 0; i < spec.hidden.size(); ++i) {
      const std::string name = "fc" + std::to_string(i);
      auto layer = register_module(name, torch::nn::Linear(in, spec.hidden[i]));
      init.linear(layer);
      addBlock(name, layer->parameters(),
               [layer](const torch::Tensor& x) { return torch::relu(layer->forward(x)); });
      in = spec.hidden[i];
    }
    auto out = register_module("out", torch::nn::Linear(in, spec.classes));
    init.linear(out);
    addBlock("out", out->parameters(), [out](const torch::Tensor& x) { return out->forward(x); });
  }

 private:
  torch::Tensor prologue(torch::Tensor x) override {
    checkInput(x, sampleShape_);
    return x.flatten(1);
  }
  std::vector<int64_t> sampleShape_;
};

// ---- cnn ----------------------------------------------------------------------------------------

// Blocks: conv0, conv1, ... (conv + ReLU + max-pool), fc (flatten, linear + ReLU; when
// cnn_hidden > 0), out (flattening too when there is no fc).
class Cnn : public BlockModel {
 public:
  Cnn(const ModelSpec& spec, Init& init) : sampleShape_(spec.sampleShape) {
    int64_t in = spec.sampleShape[0];
    for (size_t i = 0; i < spec.channels.size(); ++i) {
      const std::string name = "conv" + std::to_string(i);
      auto options = torch::nn::Conv2dOptions(in, spec.channels[i], 3).padding(1);
      auto conv = register_module(name, torch::nn::Conv2d(options));
      init.conv(conv);
      addBlock(name, conv->parameters(), [conv](const torch::Tensor& x) {
        return torch::max_pool2d(torch::relu(conv->forward(x)), 2);
      });
      in = spec.channels[i];
    }
    // Each block halves H and W (floor), as max_pool2d(2) does.
    const size_t blocks = spec.channels.size();
    int64_t features = in * (spec.sampleShape[1] >> blocks) * (spec.sampleShape[2] >> blocks);
    if (spec.cnnHidden > 0) {
      auto fc = register_module("fc", torch::nn::Linear(features, spec.cnnHidden));
      init.linear(fc);
      addBlock("fc", fc->parameters(),
               [fc](const torch::Tensor& x) { return torch::relu(fc->forward(x.flatten(1))); });
      features = spec.cnnHidden;
    }
    auto out = register_module("out", torch::nn::Linear(features, spec.classes));
    init.linear(out);
    addBlock("out", out->parameters(),
             [out](const torch::Tensor& x) { return out->forward(x.flatten(1)); });
  }

 private:
  torch::Tensor prologue(torch::Tensor x) override {
    checkInput(x, sampleShape_);
    return x;
  }
  std::vector<int64_t> sampleShape_;
};

// ---- transformer --------------------------------------------------------------------------------

// One pre-LayerNorm layer: x + attention(ln1(x)), then + mlp(ln2(x)). Attention is written with
// plain tensor ops (no fused kernel), so every backend computes the same thing.
class Block : public torch::nn::Module {
 public:
  Block(const ModelSpec& spec, Init& init) : heads_(spec.heads), causal_(spec.causal) {
    const int64_t d = spec.dim;
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv_ = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj_ = register_module("proj", torch::nn::Linear(d, d));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc1_ = register_module("fc1", torch::nn::Linear(d, spec.mlpRatio * d));
    fc2_ = register_module("fc2", torch::nn::Linear(spec.mlpRatio * d, d));
    init.layerNorm(ln1_);
    init.linear(qkv_);
    init.linear(proj_);
    init.layerNorm(ln2_);
    init.linear(fc1_);
    init.linear(fc2_);
  }

  torch::Tensor forward(torch::Tensor x) {  // [N, T, D]
    x = x + attention(ln1_->forward(x));
    return x + fc2_->forward(torch::gelu(fc1_->forward(ln2_->forward(x))));
  }

 private:
  torch::Tensor attention(const torch::Tensor& x) {
    const int64_t n = x.size(0), t = x.size(1), d = x.size(2), dh = d / heads_;
    // [N, T, 3, H, dh] -> [3, N, H, T, dh]
    auto qkv = qkv_->forward(x).view({n, t, 3, heads_, dh}).permute({2, 0, 3, 1, 4});
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    auto scores =
        torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(dh)));  // [N,H,T,T]
    if (causal_) {
      // Built per call rather than kept as a buffer, so it is no part of the model's state.
      auto future = torch::ones({t, t}, x.options().dtype(torch::kBool)).triu(1);
      scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
    }
    auto out = torch::matmul(torch::softmax(scores, -1), v);  // [N, H, T, dh]
    return proj_->forward(out.transpose(1, 2).reshape({n, t, d}));
  }

  int64_t heads_;
  bool causal_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
};

// Blocks: embed (tokens, linear embedding + positions), block0, block1, ... (the layers), head
// (final LayerNorm, mean-pool over tokens, linear).
class Transformer : public BlockModel {
 public:
  Transformer(const ModelSpec& spec, Init& init)
      : sampleShape_(spec.sampleShape),
        seqLen_(spec.seqLen),
        tokenFeatures_(product(spec.sampleShape) / spec.seqLen) {
    auto embed = register_module("embed", torch::nn::Linear(tokenFeatures_, spec.dim));
    init.linear(embed);
    auto pos = register_parameter("pos", torch::empty({spec.seqLen, spec.dim}));
    init.uniform(pos, 0.02 * std::sqrt(3.0));  // standard deviation 0.02, as GPT-2's embeddings
    auto embedParameters = embed->parameters();
    embedParameters.push_back(pos);
    addBlock("embed", embedParameters, [embed, pos, this](const torch::Tensor& x) {
      return embed->forward(x.reshape({x.size(0), seqLen_, tokenFeatures_})) + pos;
    });
    for (int64_t i = 0; i < spec.layers; ++i) {
      const std::string name = "block" + std::to_string(i);
      auto block = register_module(name, std::make_shared<Block>(spec, init));
      addBlock(name, block->parameters(),
               [block](const torch::Tensor& x) { return block->forward(x); });
    }
    auto ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({spec.dim})));
    init.layerNorm(ln);
    auto head = register_module("head", torch::nn::Linear(spec.dim, spec.classes));
    init.linear(head);
    auto headParameters = ln->parameters();
    for (const auto& p : head->parameters()) headParameters.push_back(p);
    addBlock("head", headParameters, [ln, head](const torch::Tensor& x) {
      return head->forward(ln->forward(x).mean(1));  // mean-pool over tokens
    });
  }

 private:
  torch::Tensor prologue(torch::Tensor x) override {
    checkInput(x, sampleShape_);
    return x;
  }
  std::vector<int64_t> sampleShape_;
  int64_t seqLen_, tokenFeatures_;
};

// ---- Validation ---------------------------------------------------------------------------------

void validate(const ModelSpec& spec) {
  if (spec.sampleShape.empty())
    throw ConfigError("the dataset's sample shape is empty; a model needs at least one feature");
  for (int64_t d : spec.sampleShape)
    if (d < 1)
      throw ConfigError(
          str("sample shape ", shapeText(spec.sampleShape), " has an empty dimension"));
  requirePositive(spec.classes, "classes");
  if (spec.name == "mlp") {
    for (int64_t h : spec.hidden) requirePositive(h, "hidden[i]");
  } else if (spec.name == "cnn") {
    if (spec.sampleShape.size() != 3)
      throw ConfigError(
          str("model.name = \"cnn\" needs image samples [channels, height, width]; the ",
              "dataset's samples are ", shapeText(spec.sampleShape), " (use mlp or transformer)"));
    if (spec.channels.empty())
      throw ConfigError("model.channels is empty; cnn needs at least one conv block");
    for (int64_t c : spec.channels) requirePositive(c, "channels[i]");
    const int64_t side = std::min(spec.sampleShape[1], spec.sampleShape[2]);
    if (spec.channels.size() >= 63 || (side >> spec.channels.size()) < 1)
      throw ConfigError(str("model.channels has ", spec.channels.size(),
                            " blocks; each halves the ", shapeText(spec.sampleShape),
                            " image, which allows at most ", int64_t(std::log2(double(side)))));
    if (spec.cnnHidden < 0)
      throw ConfigError(str("model.cnn_hidden = ", spec.cnnHidden, " must be >= 0"));
  } else if (spec.name == "transformer") {
    requirePositive(spec.layers, "layers");
    requirePositive(spec.heads, "heads");
    requirePositive(spec.dim, "dim");
    requirePositive(spec.seqLen, "seq_len");
    requirePositive(spec.mlpRatio, "mlp_ratio");
    if (spec.dim % spec.heads != 0)
      throw ConfigError(
          str("model.heads = ", spec.heads, " does not divide model.dim = ", spec.dim));
    const int64_t f = product(spec.sampleShape);
    if (f % spec.seqLen != 0)
      throw ConfigError(str("model.seq_len = ", spec.seqLen, " does not divide the ", f,
                            " features of a sample ", shapeText(spec.sampleShape)));
  } else {
    throw ConfigError(
        str("model.name = \"", spec.name, "\" is not a model; allowed: mlp, cnn, transformer"));
  }
}

std::shared_ptr<BlockModel> makeBlocks(const ModelSpec& spec) {
  Init init(spec.seed);
  if (spec.name == "mlp") return std::make_shared<Mlp>(spec, init);
  if (spec.name == "cnn") return std::make_shared<Cnn>(spec, init);
  return std::make_shared<Transformer>(spec, init);
}

}  // namespace

torch::Tensor BlockModel::forward(torch::Tensor x) {
  return forwardBlocks(std::move(x), 0, blocks_.size());
}

torch::Tensor BlockModel::forwardBlocks(torch::Tensor x, size_t first, size_t last) {
  HETRA_ENFORCE(first <= last && last <= blocks_.size(), "blocks [", first, ", ", last,
                ") of a model of ", blocks_.size());
  if (first == 0) x = prologue(std::move(x));
  for (size_t i = first; i < last; ++i) {
    const auto& block = blocks_[i];
    if (hooks_) {
      hooks_->beforeBlock(i);
      x = checkpoint(block.run, x, block.parameters, hookedOptions_[i]);
      hooks_->afterBlock(i);
    } else {
      x = checkpointing_ ? checkpoint(block.run, x, block.parameters) : block.run(x);
    }
  }
  return x;
}

void BlockModel::setBlockHooks(BlockHooks* hooks) {
  hooks_ = hooks;
  hookedOptions_.assign(blocks_.size(), CheckpointOptions{});
  if (!hooks) return;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    hookedOptions_[i].beforeRecompute = [hooks, i] { hooks->recomputing(i); };
    hookedOptions_[i].takeGradients = [hooks, i](std::vector<torch::Tensor>& gradients) {
      hooks->takeGradients(i, gradients);
    };
  }
}

std::vector<std::string> BlockModel::blockNames() const {
  std::vector<std::string> names;
  for (const auto& block : blocks_) names.push_back(block.name);
  return names;
}

void BlockModel::addBlock(const std::string& name, std::vector<torch::Tensor> parameters,
                          std::function<torch::Tensor(const torch::Tensor&)> run) {
  blocks_.push_back({name, std::move(parameters), std::move(run)});
}

std::shared_ptr<Model> makeModel(const ModelSpec& spec) {
  validate(spec);
  auto model = makeBlocks(spec);
  model->setCheckpointing(spec.checkpointBlocks);
  return model;
}

int64_t parameterCount(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

// The estimate counts float32 values per sample kept alive between forward and backward (A): every
// layer output, pre- and post-activation both (whether autograd keeps both depends on the op), the
// input, the logits and their softmax; plus, for convolutions, the im2col buffer of the largest
// block (LibTorch's CPU convolution unfolds its input). Backward then holds gradients of
// activations, counted as A once more, an upper bound (autograd frees each after use).
// bytesPerSample = 2 * A * 4. Fixed: parameters x 5 copies (value, gradient, two Adam moments,
// DataParallel's gradient buckets).
MemoryFootprint estimateFootprint(const ModelSpec& spec) {
  validate(spec);
  constexpr int64_t kFixedCopies = 5;
  const int64_t f = product(spec.sampleShape);
  int64_t a = f + 2 * spec.classes;  // input; logits and their (log-)softmax
  if (spec.name == "mlp") {
    for (int64_t h : spec.hidden) a += 2 * h;
  } else if (spec.name == "cnn") {
    int64_t c = spec.sampleShape[0], h = spec.sampleShape[1], w = spec.sampleShape[2], unfold = 0;
    for (int64_t out : spec.channels) {
      unfold = std::max(unfold, c * 9 * h * w);
      h /= 2;
      w /= 2;
      a += 2 * out * (2 * h) * (2 * w) + out * h * w * 3;  // conv, relu; pooled + int64 indices
      c = out;
    }
    a += unfold + 2 * spec.cnnHidden;
  } else {
    const int64_t t = spec.seqLen, d = spec.dim, m = spec.mlpRatio * spec.dim, h = spec.heads;
    a += 2 * t * d;  // embedding, + positions
    // Per layer: ln1, qkv (3), attention output, its transposed copy, proj, residual, ln2, fc2,
    // residual (11 T*D); fc1 and gelu (2 T*M); scores, scaled, masked, softmax (4 H*T*T).
    a += spec.layers * (11 * t * d + 2 * t * m + 4 * h * t * t);
    a += t * d + d;  // final LayerNorm, mean-pool
  }
  MemoryFootprint fp;
  fp.fixedBytes = kFixedCopies * int64_t(sizeof(float)) * parameterCount(*makeModel(spec));
  fp.bytesPerSample = 2 * a * int64_t(sizeof(float));
  return fp;
}

int64_t maxMicroBatch(const MemoryFootprint& footprint, int64_t capBytes) {
  if (capBytes <= 0) return std::numeric_limits<int64_t>::max();
  HETRA_ENFORCE_GT(footprint.bytesPerSample, 0, "a footprint needs bytes per sample");
  const int64_t left = capBytes - footprint.fixedBytes;
  return left <= 0 ? 0 : left / footprint.bytesPerSample;
}

}  // namespace hetra::train
