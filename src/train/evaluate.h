// Evaluation on the test set, split over the ranks in proportion to their share of the global
// batch, so fast devices take more of it too.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "balance/balancer.h"
#include "comm/communicator.h"

namespace hetra::train {

class Model;    // train/models.h
class Dataset;  // train/datasets.h

// The contiguous part [begin, end) of `total` test samples that `rank` evaluates under `plan`:
// rank r takes total * batch_r / globalBatch after the parts of ranks 0..r-1, the last rank the
// rest.
std::pair<int64_t, int64_t> evaluationRange(int64_t total, const balance::Plan& plan,
                                            int64_t globalBatch, int rank);

struct Evaluation {
  double loss = 0;      // mean cross-entropy over the test set
  double accuracy = 0;  // share of samples whose largest logit is the target
};

// Collective: every rank of `comm` calls it with the same `plan` (the balancer's, equal on every
// rank once its timings are all in); losses and hits are summed over ranks.
// With `forwardWithoutSamples` every rank runs as many forwards as the rank with the most test
// batches, calling it for each one it has no batch for: a model whose forward runs collectives
// (ZeRO-3's gathers, train/zero_parallel.h) needs the same number on every rank.
Evaluation evaluate(Model& model, const Dataset& test, const balance::Plan& plan,
                    int64_t globalBatch, comm::Communicator& comm,
                    const std::function<void()>& forwardWithoutSamples = {});

}  // namespace hetra::train
