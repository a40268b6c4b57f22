// The models `hetra run` trains: classifiers returning logits, built from a plain ModelSpec.
//
// Vocabulary:
//   sample shape   the shape of one input sample without the batch dimension ({1, 28, 28} for
//                  Fashion-MNIST, {features} for Synthetic); a model takes [N, sample shape...].
//   token          transformer: one row of tokenFeatures = (elements of a sample) / seqLen
//                  values; a 28x28 image is 28 tokens of 28 features (one per image row).
//   block          a named step of a built-in model's forward (an MLP layer, a conv block, a
//                  transformer layer, the head): the unit of activation checkpointing, and of the
//                  ZeRO-3 gathering and pipeline partitioning to come.
//   footprint      the memory a replica needs: fixed bytes (parameters, gradients, optimizer state)
//                  plus bytes per sample of a micro-batch (activations of forward and backward).
//
// Initialisation depends only on ModelSpec::seed, through a generator of our own (not LibTorch's
// global one), so replicas built in different threads, processes or LibTorch versions start equal.
// No BatchNorm and no dropout: a replica's result must not depend on how a batch is split.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "train/activation_checkpoint.h"

namespace hetra::train {

struct ModelSpec {
  std::string name = "mlp";                        // mlp | cnn | transformer
  std::vector<int64_t> sampleShape = {1, 28, 28};  // from Dataset::inputShape()
  int64_t classes = 10;
  std::vector<int64_t> hidden = {256, 128};  // mlp: hidden widths (empty: a linear model)
  std::vector<int64_t> channels = {32, 64};  // cnn: conv 3x3 (padding 1) + ReLU + max-pool 2 blocks
  int64_t cnnHidden = 128;                   // cnn: width of the fully connected layer (0: none)
  int64_t layers = 2;                        // transformer: pre-LayerNorm blocks
  int64_t heads = 4;                         // transformer: attention heads (divides dim)
  int64_t dim = 64;                          // transformer: model width
  int64_t seqLen = 28;                       // transformer: tokens per sample
  int64_t mlpRatio = 4;                      // transformer: MLP width = mlpRatio * dim
  bool causal = false;            // transformer: token t attends to tokens <= t only (GPT mask)
  bool checkpointBlocks = false;  // recompute each block's activations in backward
  uint64_t seed = 1;
};

// Every model: forward maps inputs [N, sample shape...] to logits [N, classes].
class Model : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

// Called around each block of a BlockModel (ZeRO-3, train/zero_parallel.h, gathers a block's
// parameters before it runs and frees them after). With hooks every block runs checkpointed
// (train/activation_checkpoint.h): no activation of a block outlives the block's run, and backward
// recomputes the block between recomputing() and takeGradients().
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void beforeBlock(size_t block) = 0;  // forward
  virtual void afterBlock(size_t block) = 0;
  virtual void recomputing(size_t block) = 0;  // backward, before the block's recompute
  // After it: the gradients of the block's trainable parameters (CheckpointOptions::takeGradients).
  virtual void takeGradients(size_t block, std::vector<torch::Tensor>& gradients) = 0;
};

// A model that is a sequence of named blocks. forward runs the prologue (input checks, reshapes),
// then each block on the previous one's output, checkpointed (train/activation_checkpoint.h) when
// checkpointing is on.
class BlockModel : public Model {
 public:
  torch::Tensor forward(torch::Tensor x) override;
  std::vector<std::string> blockNames() const;
  void setCheckpointing(bool on) { checkpointing_ = on; }
  // One pipeline stage's forward: the prologue when `first` is 0, then blocks [first, last).
  torch::Tensor forwardBlocks(torch::Tensor x, size_t first, size_t last);
  size_t blockCount() const { return blocks_.size(); }
  // The parameters block `block` reads, as addBlock named them.
  const std::vector<torch::Tensor>& blockParameters(size_t block) const {
    return blocks_.at(block).parameters;
  }
  // nullptr removes them; the hooks must outlive their use.
  void setBlockHooks(BlockHooks* hooks);

 protected:
  // `parameters` are those `run` reads (registered by the model as usual).
  void addBlock(const std::string& name, std::vector<torch::Tensor> parameters,
                std::function<torch::Tensor(const torch::Tensor&)> run);
  virtual torch::Tensor prologue(torch::Tensor x) = 0;

 private:
  struct NamedBlock {
    std::string name;
    std::vector<torch::Tensor> parameters;
    std::function<torch::Tensor(const torch::Tensor&)> run;
  };
  std::vector<NamedBlock> blocks_;
  bool checkpointing_ = false;
  BlockHooks* hooks_ = nullptr;
  std::vector<CheckpointOptions> hookedOptions_;  // per block, calling hooks_
};

// Throws ConfigError naming the field when the spec does not describe a buildable model.
std::shared_ptr<Model> makeModel(const ModelSpec& spec);

// Number of scalar parameters (trainable or not).
int64_t parameterCount(const torch::nn::Module& model);

struct MemoryFootprint {
  int64_t fixedBytes = 0;      // parameters + gradients + optimizer state (2 copies, as Adam)
  int64_t bytesPerSample = 0;  // activations of forward + backward for one sample
};

// An analytic estimate (float32), documented in models.cc; it errs high. Throws like makeModel.
MemoryFootprint estimateFootprint(const ModelSpec& spec);

// The largest micro-batch whose estimated footprint fits in capBytes; 0 when not even one sample
// fits (the device cannot train this model), INT64_MAX when capBytes <= 0 (no cap).
int64_t maxMicroBatch(const MemoryFootprint& footprint, int64_t capBytes);

}  // namespace hetra::train
