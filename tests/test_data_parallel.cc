// Exactness of heterogeneous data parallelism: whatever the split of the global batch over ranks
// and whatever each rank's micro-batching, the reduced gradient equals the single-process gradient
// of the mean loss over the same global batch.
#include <gtest/gtest.h>

#include <random>

#include "comm/communicator.h"
#include "harness.h"
#include "train/data_parallel.h"
#include "train/models.h"

namespace hetra::train {
namespace {

ModelSpec smallMlp() {
  ModelSpec spec;
  spec.name = "mlp";
  spec.sampleShape = {13};
  spec.classes = 5;
  spec.hidden = {17, 11};
  spec.seed = 42;
  return spec;
}

struct GlobalBatch {
  torch::Tensor inputs, targets;
};

GlobalBatch makeBatch(int64_t size) {
  torch::manual_seed(7);
  return {torch::randn({size, 13}), torch::randint(0, 5, {size}, torch::kInt64)};
}

torch::Tensor lossSum(Model& model, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(
      model.forward(x), y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

// Gradient of the mean loss over the whole batch in one process: the reference.
std::vector<torch::Tensor> referenceGradients(const GlobalBatch& batch) {
  auto model = makeModel(smallMlp());
  (lossSum(*model, batch.inputs, batch.targets) / double(batch.inputs.size(0))).backward();
  std::vector<torch::Tensor> grads;
  for (auto& p : model->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

struct Split {
  std::vector<int64_t> batches;  // per rank
  std::vector<int64_t> accum;    // micro-batches per rank
};

void expectExact(const Split& split, size_t bucketBytes, const std::string& transport) {
  const int ranks = int(split.batches.size());
  int64_t total = 0;
  for (auto b : split.batches) total += b;
  const GlobalBatch batch = makeBatch(total);
  const auto reference = referenceGradients(batch);
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(ranks, [&](int rank) {
    comm::GroupOptions options;
    options.transport = transport;
    options.timeout = Millis(20000);
    auto comm = comm::Communicator::create(store, rank, ranks, options);
    auto model = makeModel(smallMlp());
    // Start rank > 0 from different parameters: the broadcast must make them equal.
    if (rank > 0) {
      torch::NoGradGuard noGrad;
      for (auto& p : model->parameters()) p.add_(0.5);
    }
    DataParallelOptions parallelOptions;
    parallelOptions.bucketBytes = bucketBytes;
    DataParallel parallel(model, comm, parallelOptions);
    parallel.broadcastParameters();
    int64_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += split.batches[size_t(r)];
    const int64_t mine = split.batches[size_t(rank)];
    const int64_t k = mine == 0 ? 0 : split.accum[size_t(rank)];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t start = offset + mine * j / k, end = offset + mine * (j + 1) / k;
      if (j + 1 == k) parallel.armLastBackward();
      lossSum(*model, batch.inputs.slice(0, start, end), batch.targets.slice(0, start, end))
          .backward();
    }
    parallel.finish(total);
    const auto params = model->parameters();
    for (size_t p = 0; p < params.size(); ++p) {
      const auto diff = (params[p].grad() - reference[p]).abs().max().item<double>();
      const auto scale = reference[p].abs().max().item<double>();
      EXPECT_LE(diff, 1e-5 * std::max(scale, 1e-3))
          << "rank " << rank << " parameter " << p << " (" << transport << ")";
    }
  });
}

TEST(DataParallel, UnevenSplitsMatchOneProcess) {
  torch::set_num_threads(1);
  expectExact({{37}, {3}}, 1 << 20, "auto");                // one rank, three micro-batches
  expectExact({{5, 0, 32}, {1, 1, 4}}, 1 << 20, "auto");    // a rank with no samples
  expectExact({{1, 2, 3, 31}, {1, 2, 3, 5}}, 256, "auto");  // many small buckets
  expectExact({{20, 11, 6}, {7, 1, 2}}, 600, "tcp");
}

TEST(DataParallel, RandomSplitsMatchOneProcess) {
  torch::set_num_threads(1);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    const int ranks = 2 + int(rng() % 4);
    Split split;
    for (int r = 0; r < ranks; ++r) {
      split.batches.push_back(int64_t(rng() % 20));
      split.accum.push_back(1 + int64_t(rng() % 4));
    }
    split.batches[0] += 1;  // at least one sample overall
    expectExact(split, 64 + rng() % 2048, "auto");
  }
}

// Error feedback: with the same gradient every step (the parameters do not move), the sum of the
// compressed reduced gradients over T steps must stay within a bounded distance of T times the
// exact one (the residuals carry what each step lost, the senders' and the reducers' encodings),
// while without feedback the same rounding adds up step after step.
// Returns, for each T in checkpoints, max |sum_t reduced_t - T * exact| over all elements.
std::vector<double> accumulatedError(bool errorFeedback, const std::vector<int>& checkpoints) {
  constexpr int kRanks = 3;
  const Split split{{9, 4, 6}, {2, 1, 3}};
  const GlobalBatch batch = makeBatch(19);
  const auto reference = referenceGradients(batch);
  std::vector<double> errors(checkpoints.size(), 0.0);
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(kRanks, [&](int rank) {
    comm::GroupOptions options;
    options.timeout = Millis(20000);
    auto comm = comm::Communicator::create(store, rank, kRanks, options);
    auto model = makeModel(smallMlp());
    DataParallelOptions dp;
    dp.bucketBytes = 512;  // several buckets
    dp.directBytes = 256;
    dp.compression = comm::CompressionPolicy(comm::Compression::Fp8E5M2, 32, 0);
    dp.errorFeedback = errorFeedback;
    DataParallel parallel(model, comm, dp);
    parallel.broadcastParameters();
    const auto params = model->parameters();
    std::vector<torch::Tensor> sums;
    for (auto& p : params) sums.push_back(torch::zeros_like(p));
    int64_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += split.batches[size_t(r)];
    const int64_t mine = split.batches[size_t(rank)], k = split.accum[size_t(rank)];
    size_t next = 0;
    for (int t = 1; t <= checkpoints.back(); ++t) {
      parallel.clearGradients();
      for (int64_t j = 0; j < k; ++j) {
        const int64_t start = offset + mine * j / k, end = offset + mine * (j + 1) / k;
        if (j + 1 == k) parallel.armLastBackward();
        lossSum(*model, batch.inputs.slice(0, start, end), batch.targets.slice(0, start, end))
            .backward();
      }
      parallel.finish(19);
      for (size_t p = 0; p < params.size(); ++p) sums[p] += params[p].grad();
      if (t == checkpoints[next]) {
        double worst = 0;
        for (size_t p = 0; p < params.size(); ++p)
          worst = std::max(worst, (sums[p] - t * reference[p]).abs().max().item<double>());
        if (rank == 0) errors[next] = worst;
        ++next;
      }
    }
  });
  return errors;
}

TEST(DataParallel, ErrorFeedbackKeepsTheAccumulatedErrorBounded) {
  torch::set_num_threads(1);
  const std::vector<int> checkpoints = {5, 60};
  const auto withFeedback = accumulatedError(true, checkpoints);
  const auto without = accumulatedError(false, checkpoints);
  // Without feedback the same rounding repeats every step: 12x the steps, ~12x the error.
  EXPECT_GT(without[1], 8 * without[0]) << without[0] << " -> " << without[1];
  // With it the error stays at the size of one step's rounding.
  EXPECT_LT(withFeedback[1], 2 * without[0]) << withFeedback[1] << " vs " << without[0];
  EXPECT_LT(withFeedback[1], 0.1 * without[1]);
}

}  // namespace
}  // namespace hetra::train
