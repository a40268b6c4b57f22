// DataParallel: keeps the model replicas of all ranks identical and turns each rank's summed
// micro-batch gradients into the gradient of the mean loss over the global batch.
//
// Vocabulary: a *bucket* is a flat float32 buffer holding the gradients of consecutive parameters
// (in reverse registration order, the order backward produces them); it is all-reduced as one
// operation. Buckets are *launched* strictly in index order, so every rank issues the same sequence
// of collectives whatever order its hooks fire in.
//
// Use per step: run micro-batches 1..k-1 with plain backward (gradients accumulate locally, no
// communication); call armLastBackward() before the last backward, so each bucket is all-reduced
// while backward still runs; then finish(globalBatch). A rank with no samples in a step calls
// finish() alone and contributes zeros.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace hetra::train {

struct DataParallelOptions {
  size_t bucketBytes = 25u << 20;
};

class DataParallel {
 public:
  DataParallel(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<comm::Communicator> comm,
               DataParallelOptions options = {});
  ~DataParallel();

  // Makes every rank's parameters and buffers equal to rank 0's.
  void broadcastParameters();

  // The next backward is the step's last: gradient hooks copy (accumulated + new) gradients into
  // buckets and launch each bucket's allreduce as soon as it is full.
  void armLastBackward();

  // Waits for every bucket, then sets each parameter's gradient to (sum over all ranks) /
  // globalBatch. Returns the seconds spent waiting for communication after backward ended.
  double finish(int64_t globalBatch);

  size_t bucketCount() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    torch::Tensor flat;          // float32, contiguous
    size_t pending = 0;          // parameters still to be copied in this step
    comm::WorkPtr work;
  };
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0;  // elements into the bucket
    bool filled = false;
  };

  void onGradient(size_t param, const torch::Tensor& grad);
  void launchReady();

  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<comm::Communicator> comm_;
  std::vector<torch::Tensor> params_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  size_t nextLaunch_ = 0;
  bool armed_ = false;
};

}  // namespace hetra::train
