// DataParallel: keeps the model replicas of all ranks identical and turns each rank's summed
// micro-batch gradients into the gradient of the mean loss over the global batch.
//
// Vocabulary: a *bucket* is the unit of one allreduce. A *direct* bucket is one large parameter,
// all-reduced in place in its own .grad (no copy); a *packed* bucket is a flat float32 buffer into
// which the gradients of small parameters, taken in reverse registration order (the order backward
// produces them), are copied. A parameter is *ready* when autograd has accumulated this step's last
// gradient into its .grad (a post-hook on its gradient accumulator fires). Buckets are *launched*
// strictly in index order (see the constructor), so every rank issues the same sequence of
// collectives whatever order its hooks fire in.
//
// Use per step: start with undefined (or zero) gradients; run micro-batches 1..k-1 with plain
// backward (gradients accumulate locally, no communication); call armLastBackward() before the
// last backward, so each bucket is all-reduced while backward still runs; then
// finish(globalBatch). A rank with no samples in a step calls finish() alone and contributes zeros.
// Gradients are best cleared by clearGradients() (undefined, so autograd adopts the first
// micro-batch's gradient without a copy); zeroing them works too.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace torch::autograd {
struct Node;
}

namespace hetra::train {

struct DataParallelOptions {
  size_t bucketBytes = 25u << 20;
  // Parameters of at least this many bytes (or of at least bucketBytes) are direct buckets.
  size_t directBytes = 256u << 10;
  // The gradients' bytes on the wire of a flat group, or between the islands of a hierarchy
  // (comm/policy.h); exact by default.
  comm::CompressionPolicy compression;
  // For buckets whose allreduce keeps error feedback (Communicator::feedbackCodec): keep what the
  // codec lost of this bucket and add it to the next step's, so no part of a gradient is lost,
  // only delayed.
  bool errorFeedback = false;
};

// The policy of a float32 sum allreduce of `count` elements under `policy`, with error feedback
// in `residual` (created at zero, count floats, this rank's own) where the operation's provider
// keeps it (Communicator::feedbackCodec); `policy` as it is otherwise.
comm::OpPolicy withErrorFeedback(const comm::Communicator& comm, comm::OpPolicy policy,
                                 size_t count, torch::Tensor& residual);

// Rank `root`'s values of `tensors` (alike in shape on every rank: a model's parameters and
// buffers, float32 or int64) replace every rank's; returns how far this rank's had drifted from
// them, the largest absolute difference of any element (0 on the root). Collective over `comm`.
double adoptRootValues(comm::Communicator& comm, const std::vector<torch::Tensor>& tensors,
                       int root = 0);

// Rank `root`'s optimizer state (its moments and step counts, as a checkpoint holds them) replaces
// every rank's; the optimizers are alike over parameters alike in shape. Collective over `comm`.
void adoptRootOptimizerState(comm::Communicator& comm, torch::optim::Optimizer& optimizer,
                             int root);

class DataParallel {
 public:
  DataParallel(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<comm::Communicator> comm,
               DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Makes every rank's parameters and buffers equal to rank 0's (of the communicator the
  // constructor took, whatever the gradient group).
  void broadcastParameters();

  // The ranks the gradients are all-reduced over from now on (and re-synchronised over), a group
  // split from the constructor's communicator; nullptr for a rank that is left out of it
  // (balance/balancer.h, "left out"), which then calls none of the step's functions.
  void setGradientGroup(std::shared_ptr<comm::Communicator> group);
  const std::shared_ptr<comm::Communicator>& gradientGroup() const { return group_; }

  // broadcastParameters() that first measures how far this rank's replica had drifted from rank
  // 0's (adoptRootValues). Replicas on devices whose float arithmetic differs (a GPU's fused
  // multiply-adds beside a CPU's loop) take the same averaged gradients but round their updates
  // differently, so they drift apart step by step; doing this every N steps bounds the drift to
  // N steps' worth.
  double resynchronize();

  // The next backward is the step's last: as each parameter becomes ready its bucket fills, and
  // each full bucket's allreduce is launched.
  void armLastBackward();

  // Waits for every bucket, then sets each parameter's gradient to (sum over all ranks) /
  // globalBatch. Returns the seconds spent waiting for communication after backward ended.
  // finish(1), for a loss already divided by the global batch, leaves large gradients untouched.
  double finish(int64_t globalBatch);

  // Makes every gradient undefined (what the optimizer's zero_grad does, without the memset).
  void clearGradients();

  size_t bucketCount() const { return buckets_.size(); }

  // Error feedback state (each rank has its own), in the units of the summed gradients: every
  // bucket's residual one after the other, zeros where a bucket has none; residualElements()
  // float32 values. Saved with checkpoints.
  torch::Tensor saveResiduals() const;
  int64_t residualElements() const;
  // Restores saveResiduals(); an undefined tensor resets them (no error owed).
  void loadResiduals(const torch::Tensor& flat);

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    bool direct = false;
    torch::Tensor flat;  // packed buckets: float32, contiguous
    size_t pending = 0;  // parameters not ready yet in this step
    comm::WorkPtr work;
    torch::Tensor residual;  // error feedback state of this bucket (this rank's), float32, flat
  };
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0;  // elements into a packed bucket
    bool ready = false;
  };

  std::vector<torch::Tensor> modelTensors() const;  // parameters, then buffers
  void onReady(size_t param);
  void markReady(size_t param);
  void logGradientRoute() const;
  void launchReady();

  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<comm::Communicator> comm_;   // every rank of the model's replicas
  std::shared_ptr<comm::Communicator> group_;  // the gradients' (comm_ unless ranks are left out)
  std::vector<torch::Tensor> params_;
  // Held so that every backward reuses the accumulator nodes that carry our post-hooks.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hookKeys_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  size_t nextLaunch_ = 0;
  bool armed_ = false;
  bool errorFeedback_ = false;
  comm::OpPolicy gradientPolicy_;  // the compression DataParallelOptions asked for
};

}  // namespace hetra::train
