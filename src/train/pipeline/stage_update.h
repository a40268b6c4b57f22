// A stage's optimizer step, with the same stage of the other pipelines when several pipelines
// train as data-parallel replicas ([parallel] pipeline < devices: "DP x PP").
//
// Every stage's chunks scale their summed loss by 1 / B, B the *global* batch, whatever share of
// it their pipeline ran; so the sum over the replicas of a stage's gradients is the global
// batch's mean gradient, exactly, for any split of B between the pipelines (one with no samples
// contributes zeros). The replicas of stage i form one group (`replicas`, rank j = pipeline j):
//   zero.stage = 0   the gradients are summed over the group in one allreduce of a flat buffer,
//                    then every replica runs its own optimizer over the stage's parameters (the
//                    same update everywhere: the replicas stay equal);
//   zero.stage = 1   ZeRO-1 over the group (train/zero_parallel.h): the gradients are
//                    reduce-scattered, each replica updates its shard of the stage's parameters
//                    and keeps optimizer state for it only, the parameters are all-gathered.
// A single pipeline is a group of one: no communication, the optimizer as above.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "train/optim.h"
#include "train/pipeline/profile.h"

namespace hetra::train {
class ZeroParallel;
}

namespace hetra::train::pipeline {

struct StageUpdateOptions {
  OptimSpec optimizer;
  int zeroStage = 0;  // 0 or 1
  std::vector<int64_t>
      shardSizes;  // zeroStage 1: elements per replica (zero_layout.h); empty: even
};

struct UpdateSeconds {
  double comm = 0;     // summing the gradients, sharing the updated parameters
  double compute = 0;  // the optimizer's segment, the emulation's sleep included
};

class StageUpdate {
 public:
  // `parameters`: the stage's trainable tensors (contiguous float32), in a fixed order alike on
  // every replica. ZeroParallel's constructor is a collective of the group (rank 0's values).
  StageUpdate(std::vector<torch::Tensor> parameters, std::shared_ptr<comm::Communicator> replicas,
              StageUpdateOptions options);
  ~StageUpdate();
  StageUpdate(const StageUpdate&) = delete;
  StageUpdate& operator=(const StageUpdate&) = delete;

  // Before the step's first backward (ZeRO-1 lets the backward allocate the gradients anew).
  void beginStep();
  // After the step's last backward: sums the gradients over the replicas and updates the stage's
  // parameters with `lr`, the update one compute segment of `device` at `slowdown`. The gradients
  // are released afterwards. Collective over the group.
  UpdateSeconds update(double lr, EmulatedDevice& device, double slowdown);

  // zero.stage 0: the optimizer state of one of the stage's parameters, and giving one the state
  // taken on another stage (a re-partition moves blocks with their state).
  ParameterState stateOf(const torch::Tensor& parameter);
  void setState(const torch::Tensor& parameter, ParameterState state);

  // Elements of the stage this replica updates (its ZeRO-1 shard, else all of them).
  int64_t updatedElements() const;

  // The stage's parameters.
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }

  // zero.stage 0 with several replicas: the first replica's parameters replace the others' (they
  // drift apart where the replicas' devices round differently); returns how far this replica's had
  // drifted (adoptRootValues). ZeRO-1 and a single pipeline: 0, nothing to do. Collective.
  double resynchronize();

 private:
  // zero.stage 0: every gradient (zeros where a replica ran no samples) summed over the group.
  void sumGradients();

  std::vector<torch::Tensor> parameters_;
  std::shared_ptr<comm::Communicator> replicas_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // zero.stage 0
  std::unique_ptr<ZeroParallel> zero_;                  // zero.stage 1
  torch::Tensor flatGradients_;                         // zero.stage 0, more than one replica
};

}  // namespace hetra::train::pipeline
