// Tensor parallelism for the transformer (Megatron-LM's layers, split unevenly): the ranks of a
// *tensor group* each hold a slice of every layer and compute it on the same micro-batch.
//
// Vocabulary (one layer, dim D, H heads of dh = D / H, MLP width M):
//   column-parallel  a Linear whose output features are split: qkv (rank r: the q, k and v rows of
//                    its heads) and fc1 (its hidden units); its input is the whole activation.
//   row-parallel     a Linear whose input features are split the same way: proj (the columns of
//                    its heads) and fc2 (of its hidden units); each rank's product is a partial
//                    sum over its slice, all-reduced, then the (replicated) bias is added once.
//   copy / reduce    Megatron's f and g: copy is the identity forward and an allreduce of the
//                    input gradient backward (before a column-parallel layer); reduce is an
//                    allreduce forward and the identity backward (after a row-parallel one).
// So a layer costs two allreduces of [N, T, D] forward and two backward. Everything else (the
// embedding, the positions, the LayerNorms, the two row-parallel biases, the final LayerNorm and
// the head) is replicated: every rank computes it on the same values, so its gradients, and with
// the same optimizer its values, stay equal on every rank without communication.
//
// Split unevenly: rank r holds split.heads[r] heads and split.hidden[r] hidden units of every
// layer (balance/tensor_split.h splits both by the devices' speeds), so each rank's share of the
// layer's work follows its speed; at least one head each.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "train/models.h"

namespace hetra::train {

struct TensorSplit {
  std::vector<int64_t> heads, hidden;  // per rank of the tensor group
};

// The split of `spec`'s heads and MLP units over devices of relative `speeds` (balance/
// tensor_split.h), or an even one when `even`. ConfigError for a model other than the transformer,
// fewer heads than devices, or a causal mask (not split yet).
TensorSplit tensorSplitFor(const ModelSpec& spec, const std::vector<double>& speeds,
                           bool even = false);

class TensorParallelTransformer : public BlockModel {
 public:
  // This rank's slices of makeModel(spec)'s parameters (built once, in host memory, and cut), so
  // the group computes what one process computes with makeModel(spec), to float rounding: the
  // allreduces sum partial products in another order. Its named_parameters() have the whole
  // model's names, each holding this rank's slice (sliceOf). ConfigError for a split that does not
  // fit the spec or the group.
  TensorParallelTransformer(const ModelSpec& spec, TensorSplit split,
                            std::shared_ptr<comm::Communicator> group);

  // This rank's slice of the whole model's parameter `name` (named as makeModel's).
  torch::Tensor sliceOf(const std::string& name, const torch::Tensor& whole) const;
  const TensorSplit& split() const { return split_; }
  comm::Communicator& group() const { return *group_; }

 private:
  torch::Tensor prologue(torch::Tensor x) override;

  ModelSpec spec_;
  TensorSplit split_;
  std::shared_ptr<comm::Communicator> group_;
  int64_t headBegin_ = 0, hiddenBegin_ = 0;  // this rank's first head and hidden unit
};

// Megatron's f and g over `group` (exposed for tests).
torch::Tensor copyToTensorGroup(const torch::Tensor& x, comm::Communicator& group);
torch::Tensor reduceFromTensorGroup(const torch::Tensor& x, comm::Communicator& group);

}  // namespace hetra::train
