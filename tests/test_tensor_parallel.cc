// Tensor parallelism (train/tensor_parallel.h): Megatron's copy and reduce operators over real
// ranks (threads on the shared-memory transport), and the transformer split over T = 2 and 3 ranks,
// unevenly by speed and evenly, trained for 20 steps against one process training the whole model
// on the same batches: the same losses and parameters to 1e-5, the replicated parameters bitwise
// alike on every rank. Then `hetra run`'s loop with [parallel] tensor: one replica of three
// devices, and two replicas of two (tensor x data parallelism) train as one device does; what it
// cannot run is refused by name.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/errors.h"
#include "harness.h"
#include "store/store.h"
#include "train/models.h"
#include "train/optim.h"
#include "train/tensor_parallel.h"
#include "train/trainer.h"

namespace hetra::train {
namespace {

std::shared_ptr<comm::Communicator> group(std::shared_ptr<store::Store> store, int rank, int size) {
  comm::GroupOptions options;
  options.transport = "shm";
  options.timeout = Millis(20000);
  return comm::Communicator::create(std::move(store), rank, size, options);
}

// ---- copy and reduce ----------------------------------------------------------------------------

// Rank r's input x_r (distinct per rank and element); the loss is sum(w_r * op(x_r)) with a
// weight distinct per rank, so each operator's forward and backward show in the gradients.
TEST(TensorGroupOperators, CopyAllReducesGradientsAndReduceAllReducesValues) {
  torch::set_num_threads(1);
  constexpr int kRanks = 3;
  constexpr int64_t kCount = 7;
  auto input = [](int r) { return torch::arange(kCount, torch::kFloat32) * 0.5 + 10.0 * r; };
  auto weight = [](int r) { return torch::arange(kCount, torch::kFloat32) + 100.0 * (r + 1); };
  torch::Tensor sumOfInputs = torch::zeros({kCount}), sumOfWeights = torch::zeros({kCount});
  for (int r = 0; r < kRanks; ++r) {
    sumOfInputs += input(r);
    sumOfWeights += weight(r);
  }
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(kRanks, [&](int rank) {
    auto comm = group(store, rank, kRanks);
    // copy: the value unchanged; its input's gradient the sum of every rank's output gradient.
    auto x = input(rank).requires_grad_();
    auto copied = copyToTensorGroup(x, *comm);
    EXPECT_TRUE(torch::equal(copied, input(rank))) << "rank " << rank;
    (copied * weight(rank)).sum().backward();
    EXPECT_TRUE(torch::allclose(x.grad(), sumOfWeights)) << "rank " << rank << ": " << x.grad();
    // reduce: every rank's value summed; its input's gradient its own output gradient only.
    auto y = input(rank).requires_grad_();
    auto reduced = reduceFromTensorGroup(y, *comm);
    EXPECT_TRUE(torch::allclose(reduced, sumOfInputs)) << "rank " << rank << ": " << reduced;
    (reduced * weight(rank)).sum().backward();
    EXPECT_TRUE(torch::equal(y.grad(), weight(rank))) << "rank " << rank;
  });
}

// ---- the split transformer against one process --------------------------------------------------

ModelSpec smallTransformer() {
  ModelSpec spec;
  spec.name = "transformer";
  spec.sampleShape = {1, 8, 6};  // 8 tokens of 6 features
  spec.seqLen = 8;
  spec.classes = 5;
  spec.layers = 2;
  spec.dim = 24;
  spec.heads = 6;  // dh = 4
  spec.mlpRatio = 2;
  spec.seed = 7;
  return spec;
}

constexpr int kSteps = 20;
constexpr int64_t kBatch = 7;

struct Batch {
  torch::Tensor inputs, targets;
};

std::vector<Batch> batches() {
  auto generator = at::detail::createCPUGenerator(5);
  std::vector<Batch> out;
  for (int s = 0; s < kSteps; ++s)
    out.push_back({torch::randn({kBatch, 1, 8, 6}, generator),
                   torch::randint(0, 5, {kBatch}, generator, torch::kInt64)});
  return out;
}

OptimSpec optimizerNamed(const std::string& name) {
  OptimSpec spec;
  spec.name = name;
  spec.lr = name == "sgd" ? 0.05 : 0.01;
  if (name == "sgd") spec.momentum = 0.9;
  return spec;
}

double step(Model& model, torch::optim::Optimizer& optimizer, const Batch& batch) {
  optimizer.zero_grad();
  auto loss = torch::nn::functional::cross_entropy(model.forward(batch.inputs), batch.targets);
  loss.backward();
  optimizer.step();
  return loss.item<double>();
}

double relativeDifference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1e-12, b.abs().max().item<double>());
}

void expectLikeOneProcess(const TensorSplit& split, const std::string& optimizer) {
  torch::set_num_threads(1);
  const ModelSpec spec = smallTransformer();
  const auto data = batches();
  const OptimSpec optim = optimizerNamed(optimizer);
  // One process, the whole model.
  auto whole = makeModel(spec);
  auto wholeOptimizer = makeOptimizer(whole->parameters(), optim);
  std::vector<double> losses;
  for (const auto& batch : data) losses.push_back(step(*whole, *wholeOptimizer, batch));

  const int ranks = int(split.heads.size());
  std::string what = optimizer + ", heads";
  for (int64_t h : split.heads) what += " " + std::to_string(h);
  what += ", hidden";
  for (int64_t h : split.hidden) what += " " + std::to_string(h);
  std::vector<std::vector<torch::Tensor>> replicated(static_cast<size_t>(ranks));
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(ranks, [&](int rank) {
    auto model =
        std::make_shared<TensorParallelTransformer>(spec, split, group(store, rank, ranks));
    auto modelOptimizer = makeOptimizer(model->parameters(), optim);
    for (int s = 0; s < kSteps; ++s) {
      const double loss = step(*model, *modelOptimizer, data[size_t(s)]);
      EXPECT_NEAR(loss, losses[size_t(s)], 1e-5 * std::abs(losses[size_t(s)]))
          << what << ": rank " << rank << " step " << s;
    }
    const auto wholeParameters = whole->named_parameters();
    for (const auto& item : model->named_parameters()) {
      const auto expected = model->sliceOf(item.key(), wholeParameters[item.key()]);
      ASSERT_EQ(item.value().sizes(), expected.sizes()) << what << ": " << item.key();
      if (item.key().find(".qkv.bias") != std::string::npos) {
        // [q, k, v] of this rank's heads. The key bias's gradient is zero in exact arithmetic (a
        // constant added to every score of a query leaves its softmax alone), so what it gets is
        // rounding noise, which Adam scales to steps of about lr whose signs follow the summation
        // order: it is checked to stay within those steps; q and v as every other parameter.
        const auto qkv = item.value().chunk(3), reference = expected.chunk(3);
        for (int part : {0, 2})
          EXPECT_LE(relativeDifference(qkv[size_t(part)], reference[size_t(part)]), 1e-5)
              << what << ": rank " << rank << " " << item.key() << " part " << part;
        EXPECT_LE((qkv[1] - reference[1]).abs().max().item<double>(), 2.0 * kSteps * optim.lr)
            << what << ": rank " << rank << " key bias";
        continue;
      }
      EXPECT_LE(relativeDifference(item.value(), expected), 1e-5)
          << what << ": rank " << rank << " " << item.key();
      if (item.value().sizes() == wholeParameters[item.key()].sizes())
        replicated[size_t(rank)].push_back(item.value().detach().clone());
    }
  });
  for (int r = 1; r < ranks; ++r) {
    ASSERT_EQ(replicated[size_t(r)].size(), replicated[0].size());
    for (size_t k = 0; k < replicated[0].size(); ++k)
      EXPECT_TRUE(torch::equal(replicated[size_t(r)][k], replicated[0][k]))
          << what << ": replicated parameter " << k << " differs on rank " << r;
  }
}

// Speeds 1 : 1/2 split 6 heads 4 : 2 and 48 hidden units 32 : 16.
TEST(TensorParallel, TwoRanksSplitBySpeedTrainAsOneProcess) {
  const TensorSplit split = tensorSplitFor(smallTransformer(), {1.0, 0.5});
  EXPECT_EQ(split.heads, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(split.hidden, (std::vector<int64_t>{32, 16}));
  expectLikeOneProcess(split, "sgd");
  expectLikeOneProcess(split, "adam");
}

// Speeds 1 : 1/2 : 1/4: 4 : 1 : 1 heads (each rank at least one), hidden units 28 : 14 : 6.
TEST(TensorParallel, ThreeRanksSplitBySpeedTrainAsOneProcess) {
  const TensorSplit split = tensorSplitFor(smallTransformer(), {1.0, 0.5, 0.25});
  EXPECT_EQ(split.heads, (std::vector<int64_t>{4, 1, 1}));
  EXPECT_EQ(split.hidden, (std::vector<int64_t>{28, 14, 6}));
  expectLikeOneProcess(split, "adam");
}

TEST(TensorParallel, ThreeRanksSplitEvenlyTrainAsOneProcess) {
  const TensorSplit split = tensorSplitFor(smallTransformer(), {1.0, 0.5, 0.25}, /*even=*/true);
  EXPECT_EQ(split.heads, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(split.hidden, (std::vector<int64_t>{16, 16, 16}));
  expectLikeOneProcess(split, "sgd");
}

TEST(TensorParallel, SplitsItCannotRunAreRefusedByName) {
  ModelSpec mlp;
  EXPECT_THROW(tensorSplitFor(mlp, {1, 1}), ConfigError);
  ModelSpec spec = smallTransformer();
  try {
    tensorSplitFor(spec, std::vector<double>(7, 1.0));
    FAIL() << "7 devices, 6 heads";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.heads = 6"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tensorSplitFor(spec, {1, 1, 1, 1}, /*even=*/true), ConfigError);  // 6 heads / 4
  spec.causal = true;
  EXPECT_THROW(tensorSplitFor(spec, {1, 1}), ConfigError);
  // A split that does not fit the model or the group.
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(2, [&](int rank) {
    auto comm = group(store, rank, 2);
    EXPECT_THROW(TensorParallelTransformer(smallTransformer(), {{5, 2}, {24, 24}}, comm),
                 ConfigError);
    EXPECT_THROW(TensorParallelTransformer(smallTransformer(), {{6, 0}, {24, 24}}, comm),
                 ConfigError);
    EXPECT_THROW(TensorParallelTransformer(smallTransformer(), {{2, 2, 2}, {16, 16, 16}}, comm),
                 ConfigError);
  });
}

// ---- hetra run's loop ---------------------------------------------------------------------------

const char* kRunConfig = R"(
[model]
name = "transformer"
layers = 2
dim = 24
heads = 6
seq_len = 4
[data]
name = "synthetic"
samples = 512
test_samples = 61
features = 24
classes = 5
[train]
global_batch = 21
steps = 12
optimizer = "adam"
lr = 0.01
log_every = 0
eval_every = 0
)";

RunConfig runConfig(int devices, const std::vector<std::string>& sets) {
  std::string text = kRunConfig;
  for (int d = 0; d < devices; ++d) text += "[[devices]]\nname = \"d" + std::to_string(d) + "\"\n";
  return parseConfig(text, "tensor-test", sets);
}

std::vector<TrainResult> trainOn(const RunConfig& config) {
  const int ranks = int(config.devices.size());
  std::vector<TrainResult> out(static_cast<size_t>(ranks));
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(ranks, [&](int rank) {
    out[size_t(rank)] = train(config, group(store, rank, ranks), TrainerOptions{});
  });
  return out;
}

void expectLikeOneDevice(const std::vector<TrainResult>& results, const TrainResult& one,
                         const std::string& what) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_NEAR(results[r].lastLoss, one.lastLoss, 1e-5 * std::abs(one.lastLoss))
        << what << ": rank " << r;
    EXPECT_NEAR(results[r].testLoss, one.testLoss, 1e-5 * std::abs(one.testLoss))
        << what << ": rank " << r;
    EXPECT_EQ(results[r].testAccuracy, one.testAccuracy) << what << ": rank " << r;
    EXPECT_EQ(results[r].steps, one.steps) << what << ": rank " << r;
  }
}

// Three devices of speeds 1, 1/2 and 1/4 (emulated) in one tensor group, split by their measured
// speeds: the first device takes the most heads; the run trains as one device does.
TEST(TensorParallelRun, OneReplicaOfThreeDevicesTrainsAsOneDevice) {
  torch::set_num_threads(1);
  const auto one = trainOn(runConfig(1, {}));
  ASSERT_GT(one[0].testLoss, 0);
  const auto split =
      trainOn(runConfig(3, {"parallel.tensor=3", "devices.1.slowdown=2", "devices.2.slowdown=4"}));
  expectLikeOneDevice(split, one[0], "tensor = 3, split by speed");
  const auto even = trainOn(runConfig(3, {"parallel.tensor=3", "parallel.tensor_split=even"}));
  expectLikeOneDevice(even, one[0], "tensor = 3, even");
}

// Two replicas of two devices: the balancer splits the global batch over the replicas, each
// replica's two ranks take the same share, and the gradients of each slice are all-reduced
// between the replicas.
TEST(TensorParallelRun, TwoReplicasOfTwoDevicesTrainAsOneDevice) {
  torch::set_num_threads(1);
  const auto one = trainOn(runConfig(1, {}));
  const auto split =
      trainOn(runConfig(4, {"parallel.tensor=2", "devices.2.slowdown=2", "devices.3.slowdown=2"}));
  expectLikeOneDevice(split, one[0], "tensor = 2 x 2 replicas");
}

TEST(TensorParallelRun, ConfigsItCannotRunAreRefusedByName) {
  auto message = [](int devices, const std::vector<std::string>& sets) {
    try {
      runConfig(devices, sets);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(2, {"parallel.tensor=2", "model.name=mlp"}).find("parallel.tensor"),
            std::string::npos);
  EXPECT_NE(message(3, {"parallel.tensor=2"}).find("must divide the number of devices (3)"),
            std::string::npos);
  EXPECT_NE(message(7, {"parallel.tensor=7"}).find("model.heads = 6"), std::string::npos);
  EXPECT_NE(
      message(4, {"parallel.tensor=4", "parallel.tensor_split=even"}).find("parallel.tensor_split"),
      std::string::npos);
  EXPECT_NE(message(2, {"parallel.tensor=2", "parallel.pipeline=2"}).find("parallel.pipeline"),
            std::string::npos);
  EXPECT_NE(message(2, {"parallel.tensor=2", "zero.stage=1"}).find("zero.stage"),
            std::string::npos);
  EXPECT_NE(
      message(2, {"parallel.tensor=2", "devices.1.memory=\"64MiB\""}).find("devices[1].memory"),
      std::string::npos);
  EXPECT_NO_THROW(runConfig(4, {"parallel.tensor=2"}));
}

}  // namespace
}  // namespace hetra::train
