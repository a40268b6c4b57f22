// One pipeline stage at run time: blocks [first, last) of a model, walking its 1F1B schedule
// (schedule.h) for each step, exchanging activations and their gradients with its neighbours
// through the communicator (send/recv, one message at a time), each forward and backward one
// compute segment of its emulated device.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "train/datasets.h"
#include "train/pipeline/profile.h"
#include "train/pipeline/schedule.h"

namespace hetra::train {
class BlockModel;
}

namespace hetra::train::pipeline {

struct StageSpan {
  int stage = 0, stages = 1;
  std::vector<int> ranks;       // the communicator's rank of each stage
  int64_t first = 0, last = 0;  // blocks [first, last)
  // Shape of one sample of this stage's input (the previous block's output); unused on stage 0.
  std::vector<int64_t> inputShape;
};

struct StageStep {
  double lossSum = 0;         // the last stage: summed loss of the step's samples; else 0
  double computeSeconds = 0;  // forwards and backwards, the emulation's sleep included
  // The most chunks whose activations were alive at once (forward run, backward not yet): at
  // most min(P - i, M) on stage i under 1F1B.
  int64_t peakChunksInFlight = 0;
};

class Stage {
 public:
  // The communicator's rank span.ranks[i] runs stage i; its neighbours run stages i - 1 and
  // i + 1.
  Stage(BlockModel& model, StageSpan span, comm::Communicator& comm);

  // One step of `chunks` (the first stage reads their inputs, the last their targets, every stage
  // their sizes): gradients accumulate in the stage's parameters, the loss is scaled by `lossScale`
  // before backward. No chunks: nothing runs (the pipeline has no samples this step; every stage
  // of it must be given none). A failure aborts the group, so the other stages wake at once.
  StageStep run(int64_t step, const std::vector<Batch>& chunks, double lossScale,
                EmulatedDevice& device, double slowdown);

  // Forward only, no gradients, every chunk in turn through the stages (evaluation number
  // `round`): on the last stage the summed loss and the count of correct predictions, else zeros.
  // Collective over the stages; fails like run().
  std::pair<double, double> evaluate(int64_t round, const std::vector<Batch>& chunks);

  const StageSpan& span() const { return span_; }

 private:
  uint64_t tag(int64_t step, int64_t chunk, bool gradient) const;
  int previous() const { return span_.ranks[size_t(span_.stage) - 1]; }
  int next() const { return span_.ranks[size_t(span_.stage) + 1]; }
  // Runs `body`; on a failure aborts the group (the other stages wake at once) and rethrows.
  void abortOnFailure(const std::function<void()>& body);
  void execute(const Step& s, int64_t step, const std::vector<Batch>& chunks, double lossScale,
               EmulatedDevice& device, double slowdown, StageStep& out);

  BlockModel& model_;
  StageSpan span_;
  comm::Communicator& comm_;
  std::vector<Step> schedule_;
  int64_t scheduleChunks_ = 0;
  // Per chunk in flight: the stage's input (a leaf with a gradient, past stage 0), its output (the
  // loss on the last stage), and the gradient received for that output.
  std::vector<torch::Tensor> inputs_, outputs_, gradients_;
  int64_t inFlight_ = 0;
};

}  // namespace hetra::train::pipeline
