#include "train/evaluate.h"

#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "balance/balancer.h"
#include "comm/communicator.h"
#include "train/datasets.h"
#include "train/models.h"

namespace hetra::train {

std::pair<int64_t, int64_t> evaluationRange(int64_t total, const balance::Plan& plan,
                                            int64_t globalBatch, int rank) {
  const int ranks = int(plan.ranks.size());
  int64_t begin = 0, end = 0;
  for (int r = 0; r <= rank; ++r) {
    begin = end;
    end = r + 1 == ranks ? total : begin + total * plan.ranks[size_t(r)].batch / globalBatch;
  }
  return {begin, end};
}

Evaluation evaluate(Model& model, const Dataset& test, const balance::Plan& plan,
                    int64_t globalBatch, comm::Communicator& comm,
                    const std::function<void()>& forwardWithoutSamples) {
  torch::NoGradGuard noGrad;
  const int rank = comm.rank();
  const auto [begin, end] = evaluationRange(test.size(), plan, globalBatch, rank);
  // Twice the training micro-batch: without gradients that fits the same memory.
  const int64_t chunk =
      std::max<int64_t>(1, std::min<int64_t>(1024, plan.ranks[size_t(rank)].microBatch * 2));
  double sums[3] = {0, 0, 0};  // loss, correct, count
  if (forwardWithoutSamples) {
    int64_t batches = (end - begin + chunk - 1) / chunk, most = batches;
    comm.allreduce(&most, &most, 1, DType::I64, comm::ReduceOp::Max)->wait();
    for (; batches < most; ++batches) forwardWithoutSamples();
  }
  for (int64_t start = begin; start < end; start += chunk) {
    std::vector<int64_t> indices;
    for (int64_t i = start; i < std::min(end, start + chunk); ++i) indices.push_back(i);
    Batch batch = test.get(indices);
    auto logits = model.forward(batch.inputs);
    sums[0] += torch::nn::functional::cross_entropy(
                   logits, batch.targets,
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
    sums[1] += logits.argmax(1).eq(batch.targets).sum().item<double>();
    sums[2] += double(indices.size());
  }
  comm.allreduce(sums, sums, 3, DType::F64, comm::ReduceOp::Sum)->wait();
  return {sums[0] / std::max(1.0, sums[2]), sums[1] / std::max(1.0, sums[2])};
}

}  // namespace hetra::train
