// Pipeline parallelism (train/pipeline/): the 1F1B schedule cannot deadlock under send/receive
// that complete only together; P = 2 and 3 stages on real ranks over the shared-memory transport
// (threads) train exactly as one process running the same chunks; several pipelines of different
// speeds as data-parallel replicas (with ZeRO-1 over a stage's replicas) train as one process
// within float rounding; and a stage's process killed
// mid-step makes every other stage fail naming it instead of waiting for its deadline.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "common/errors.h"
#include "harness.h"
#include "process_testing.h"
#include "store/file_store.h"
#include "train/config.h"
#include "train/datasets.h"
#include "train/models.h"
#include "train/optim.h"
#include "train/pipeline/schedule.h"
#include "train/sampler.h"
#include "train/specs.h"
#include "train/trainer.h"

namespace hetra::train {
namespace {

namespace fs = std::filesystem;
using pipeline::Action;
using pipeline::oneFOneB;
using pipeline::Step;

// ---- The schedule -------------------------------------------------------------------------------

bool sendsRight(Action a) {
  return a == Action::kSendActivation;
}
bool receivesRight(Action a) {
  return a == Action::kReceiveGradient;
}
bool onRightLink(Action a) {
  return sendsRight(a) || receivesRight(a);
}
bool onLeftLink(Action a) {
  return a == Action::kReceiveActivation || a == Action::kSendGradient;
}

// Runs every stage's list against the others with rendezvous messages (a send and its receive
// complete together, one message at a time per stage, as the communicator's send/recv do).
// Returns false when no stage can move before all are done: a deadlock.
bool completesUnderRendezvous(int stages, int64_t chunks) {
  std::vector<std::vector<Step>> lists;
  for (int i = 0; i < stages; ++i) lists.push_back(oneFOneB(i, stages, chunks));
  std::vector<size_t> at(size_t(stages), 0);
  auto done = [&] {
    for (int i = 0; i < stages; ++i)
      if (at[size_t(i)] < lists[size_t(i)].size()) return false;
    return true;
  };
  while (!done()) {
    bool moved = false;
    for (int i = 0; i < stages; ++i) {
      auto& pos = at[size_t(i)];
      while (pos < lists[size_t(i)].size()) {
        const Step s = lists[size_t(i)][pos];
        if (s.action == Action::kForward || s.action == Action::kBackward) {
          ++pos;
          moved = true;
          continue;
        }
        // A message: the neighbour must be at the matching one, same chunk.
        const int peer = onRightLink(s.action) ? i + 1 : i - 1;
        const Action match = s.action == Action::kSendActivation      ? Action::kReceiveActivation
                             : s.action == Action::kReceiveActivation ? Action::kSendActivation
                             : s.action == Action::kReceiveGradient   ? Action::kSendGradient
                                                                      : Action::kReceiveGradient;
        auto& peerPos = at[size_t(peer)];
        if (peerPos < lists[size_t(peer)].size() &&
            lists[size_t(peer)][peerPos] == Step{match, s.chunk}) {
          ++pos;
          ++peerPos;
          moved = true;
        }
        break;
      }
    }
    if (!moved) return false;
  }
  return true;
}

TEST(PipelineSchedule, EveryStageRunsEachChunkForwardThenBackwardOnce) {
  for (int stages = 1; stages <= 6; ++stages)
    for (int64_t chunks = 1; chunks <= 10; ++chunks)
      for (int i = 0; i < stages; ++i) {
        SCOPED_TRACE(testing::Message()
                     << "stage " << i << " of " << stages << ", " << chunks << " chunks");
        std::map<int64_t, int> forwards, backwards;
        int64_t inFlight = 0, most = 0, nextForward = 0, nextBackward = 0;
        for (const Step& s : oneFOneB(i, stages, chunks)) {
          if (s.action == Action::kForward) {
            EXPECT_EQ(s.chunk, nextForward++);
            most = std::max(most, ++inFlight);
          }
          if (s.action == Action::kBackward) {
            EXPECT_EQ(s.chunk, nextBackward++);
            EXPECT_LT(s.chunk, nextForward) << "backward before its forward";
            --inFlight;
          }
          EXPECT_FALSE(i == 0 && onLeftLink(s.action)) << pipeline::describe(s);
          EXPECT_FALSE(i + 1 == stages && onRightLink(s.action)) << pipeline::describe(s);
        }
        EXPECT_EQ(nextForward, chunks);
        EXPECT_EQ(nextBackward, chunks);
        EXPECT_EQ(most, std::min<int64_t>(stages - i, chunks));  // 1F1B's bound, and reached
      }
}

TEST(PipelineSchedule, NoDeadlockWhenSendsCompleteOnlyWithTheirReceives) {
  for (int stages = 1; stages <= 6; ++stages)
    for (int64_t chunks = 1; chunks <= 10; ++chunks)
      EXPECT_TRUE(completesUnderRendezvous(stages, chunks))
          << stages << " stages, " << chunks << " chunks";
}

// ---- Training equals one process ----------------------------------------------------------------

const std::string kBase = R"(
[data]
name = "synthetic"
samples = 512
test_samples = 64
features = 12
classes = 5

[train]
global_batch = 30
steps = 20
lr = 0.05
seed = 3
log_every = 0
eval_every = 0

[comm]
timeout_s = 60
)";

RunConfig pipelineConfig(const std::vector<std::string>& sets) {
  return parseConfig(kBase, "pipeline test", sets);
}

fs::path tempDir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("hetra-pipeline-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<nlohmann::json> records(const fs::path& metrics, const std::string& event) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    // A line being written as we read (the kill test) does not parse yet.
    auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_discarded() && record["event"] == event) out.push_back(std::move(record));
  }
  return out;
}

std::shared_ptr<BlockModel> blockModel(const RunConfig& config, const Dataset& data) {
  return std::dynamic_pointer_cast<BlockModel>(
      makeModel(modelSpecOf(config, DatasetGeometry{data.inputShape(), data.classes()})));
}

struct Reference {
  std::vector<double> losses;
  std::shared_ptr<BlockModel> model;
  double testLoss = 0, testAccuracy = 0;  // of the trained model
};

// One process, the whole model: the step's global batch as `chunks` micro-batches of sizes as
// even as possible (the first ones larger), each forward and backward in turn, gradients summed,
// the summed loss divided by the global batch, then the optimizer step.
Reference singleProcess(const RunConfig& config) {
  auto data = makeDataset(dataSpecOf(config), /*train=*/true);
  Reference ref;
  ref.model = blockModel(config, *data);
  auto optimizer = makeOptimizer(ref.model->parameters(), optimSpecOf(config.train));
  LrSchedule schedule(scheduleSpecOf(config.train, config.train.steps));
  const int64_t batch = config.train.globalBatch, chunks = config.parallel.chunks;
  GlobalSampler sampler(data->size(), batch, uint64_t(config.train.seed));
  for (int64_t step = 0; step < config.train.steps; ++step) {
    const auto indices = sampler.indices(step, {batch}, 0);
    double lossSum = 0;
    size_t offset = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      const size_t n = size_t(batch / chunks + (k < batch % chunks ? 1 : 0));
      const Batch b = data->get(
          std::vector<int64_t>(indices.begin() + long(offset), indices.begin() + long(offset + n)));
      offset += n;
      auto loss = torch::nn::functional::cross_entropy(
          ref.model->forward(b.inputs), b.targets,
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      (loss * (1.0 / double(batch))).backward();
      lossSum += loss.item<double>();
    }
    applyLr(*optimizer, schedule.lrAt(step));
    optimizer->step();
    for (auto& p : ref.model->parameters()) p.mutable_grad().reset();
    ref.losses.push_back(lossSum / double(batch));
  }
  // The test set in order, in parts of twice the largest training chunk, without gradients.
  torch::NoGradGuard noGrad;
  auto test = makeDataset(dataSpecOf(config), /*train=*/false);
  const int64_t part = 2 * ((batch + chunks - 1) / chunks);
  double lossSum = 0, correct = 0;
  for (int64_t start = 0; start < test->size(); start += part) {
    std::vector<int64_t> indices;
    for (int64_t i = start; i < std::min(test->size(), start + part); ++i) indices.push_back(i);
    const Batch b = test->get(indices);
    const auto logits = ref.model->forward(b.inputs);
    lossSum += torch::nn::functional::cross_entropy(
                   logits, b.targets,
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
    correct += logits.argmax(1).eq(b.targets).sum().item<double>();
  }
  ref.testLoss = lossSum / double(test->size());
  ref.testAccuracy = correct / double(test->size());
  return ref;
}

// Trains `config` with one thread per device over the shared-memory transport, rank 0 writing
// `metrics`; returns each rank's model as training left it.
std::vector<std::shared_ptr<BlockModel>> trainOnThreads(
    const RunConfig& config, const fs::path& metrics,
    const std::function<void(int, TrainerOptions&)>& customize = {}) {
  const int world = int(config.devices.size());
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<std::shared_ptr<BlockModel>> models(static_cast<size_t>(world));
  test::runRanks(world, [&](int rank) {
    comm::GroupOptions group;
    group.timeout = Millis(60000);
    group.transport = "shm";
    auto comm = comm::Communicator::create(store, rank, world, group);
    TrainerOptions options;
    options.metricsPath = metrics.string();
    options.makeModel = [&] {
      auto data = makeDataset(dataSpecOf(config), true);
      models[size_t(rank)] = blockModel(config, *data);
      return std::shared_ptr<Model>(models[size_t(rank)]);
    };
    if (customize) customize(rank, options);
    train(config, comm, options);
  });
  return models;
}

// Trains the pipeline with one thread per stage over the shared-memory transport and compares
// every step's loss and every trained block with the single process: bitwise, since every sum
// runs in the same order (the chunks' gradients accumulate in chunk order on both sides).
// `moves`, when given, receives the "pipeline" record the run started with, then its
// "repartition" records.
void expectSameAsOneProcess(const RunConfig& config, const std::string& name,
                            std::vector<nlohmann::json>* moves = nullptr) {
  torch::set_num_threads(1);
  const int stages = int(config.parallel.pipeline);
  const auto dir = tempDir(name);
  const fs::path metrics = dir / "metrics.jsonl";
  const auto models = trainOnThreads(config, metrics);
  const Reference ref = singleProcess(config);
  const auto steps = records(metrics, "pipeline_step");
  ASSERT_EQ(steps.size(), ref.losses.size());
  for (size_t s = 0; s < steps.size(); ++s) {
    EXPECT_EQ(steps[s]["loss"].get<double>(), ref.losses[s]) << "step " << s + 1;
    ASSERT_EQ(steps[s]["stages"].size(), size_t(stages));
    for (const auto& stage : steps[s]["stages"]) {
      EXPECT_GT(stage["stage_s"].get<double>(), 0);
      EXPECT_GE(stage["idle_fraction"].get<double>(), 0);
      EXPECT_LE(stage["idle_fraction"].get<double>(), 1);
    }
  }
  // The final evaluation through the stages: the trained model's on the whole test set.
  const auto evals = records(metrics, "eval");
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0]["step"].get<int64_t>(), int64_t(ref.losses.size()));
  EXPECT_DOUBLE_EQ(evals[0]["test_loss"].get<double>(), ref.testLoss);
  EXPECT_DOUBLE_EQ(evals[0]["test_accuracy"].get<double>(), ref.testAccuracy);
  // The partition record names every stage with at least one block, covering all of them.
  const auto partition = records(metrics, "pipeline");
  ASSERT_EQ(partition.size(), 1u);
  int64_t covered = 0;
  for (const auto& stage : partition[0]["stages"]) {
    EXPECT_EQ(stage["first_block"].get<int64_t>(), covered);
    EXPECT_GE(stage["blocks"].get<int64_t>(), 1);
    covered += stage["blocks"].get<int64_t>();
  }
  EXPECT_EQ(covered, int64_t(ref.model->blockCount()));
  // Each block was trained on exactly one stage (the others freed it), equal to the reference.
  for (size_t b = 0; b < ref.model->blockCount(); ++b) {
    int holders = 0;
    for (int r = 0; r < stages; ++r) {
      const auto& params = models[size_t(r)]->blockParameters(b);
      if (params.front().numel() == 0) continue;
      ++holders;
      const auto& expected = ref.model->blockParameters(b);
      ASSERT_EQ(params.size(), expected.size());
      for (size_t i = 0; i < params.size(); ++i)
        EXPECT_TRUE(torch::equal(params[i], expected[i]))
            << "block " << b << " parameter " << i << " on stage " << r << ": max difference "
            << (params[i] - expected[i]).abs().max().item<double>();
    }
    EXPECT_EQ(holders, 1) << "block " << b;
  }
  if (moves) {
    *moves = records(metrics, "pipeline");
    for (auto& r : records(metrics, "repartition")) moves->push_back(std::move(r));
  }
  fs::remove_all(dir);
}

std::string devices(int n) {
  std::string list = "devices=[";
  for (int i = 0; i < n; ++i) list += str(i ? "," : "", "{name=\"stage", i, "\"}");
  return list + "]";
}

TEST(Pipeline, TwoStagesOddBlocksMoreChunksThanStagesEqualOneProcess) {
  // 3 blocks (fc0, fc1, out) in 2 stages, 5 chunks of 6 samples.
  expectSameAsOneProcess(
      pipelineConfig({"model.name=\"mlp\"", "model.hidden=[24, 16]", "train.momentum=0.9",
                      "parallel.pipeline=2", "parallel.chunks=5", "parallel.partition=\"even\"",
                      devices(2)}),
      "two");
}

TEST(Pipeline, ThreeStagesFewerChunksThanStagesEqualOneProcess) {
  // 5 blocks in 3 stages, 2 chunks of 15 samples; the balanced partition of the profile.
  expectSameAsOneProcess(
      pipelineConfig({"model.name=\"mlp\"", "model.hidden=[24, 16, 8, 8]",
                      "train.optimizer=\"adam\"", "train.lr=0.01", "parallel.pipeline=3",
                      "parallel.chunks=2", "parallel.partition=\"balanced\"", devices(3)}),
      "three");
}

TEST(Pipeline, ThreeStageTransformerEqualsOneProcess) {
  // embed, block0, head: one block per stage; 4 chunks (8, 8, 7, 7 samples).
  expectSameAsOneProcess(
      pipelineConfig({"model.name=\"transformer\"", "model.layers=1", "model.dim=16",
                      "model.heads=2", "model.seq_len=4", "train.optimizer=\"adamw\"",
                      "train.lr=0.01", "train.weight_decay=0.01", "parallel.pipeline=3",
                      "parallel.chunks=4", devices(3)}),
      "transformer");
}

TEST(Pipeline, ADeviceSlowingDownMidRunGivesBlocksAwayAndStillEqualsOneProcess) {
  // 8 blocks in 3 stages; the device "fast" is profiled 4 times as fast as the others, so its
  // stage starts with the most blocks, and it runs 24 times slower from step 3 on. The watch
  // (balance/pipeline_rebalance.h) sees the imbalance persist and moves blocks off it, with their
  // parameters and momentum: the training stays bitwise the single process's.
  const RunConfig config = pipelineConfig(
      {"model.name=\"mlp\"", "model.hidden=[48, 48, 48, 48, 48, 48, 48]", "train.momentum=0.9",
       "train.steps=30", "parallel.pipeline=3", "parallel.chunks=4",
       "devices=[{name=\"slow0\",slowdown=4},{name=\"fast\",slowdown_schedule=[[3, 24]]},"
       "{name=\"slow2\",slowdown=4}]"});
  std::vector<nlohmann::json> moves;
  expectSameAsOneProcess(config, "repartition", &moves);
  ASSERT_FALSE(moves.empty());
  ASSERT_GE(moves.size(), 2u) << "no repartition record; the start: " << moves.front().dump();
  // The stage the fast device runs (the plan may order the devices otherwise than listed).
  size_t fast = 0;
  const auto& stages = moves.front()["stages"];
  while (fast < stages.size() && stages[fast]["device"] != "fast") ++fast;
  ASSERT_LT(fast, stages.size()) << moves.front().dump();
  const int64_t atStart = stages[fast]["blocks"].get<int64_t>();
  ASSERT_GE(atStart, 2) << "the fastest device should start with the most blocks";
  const auto& last = moves.back();
  EXPECT_LT(last["blocks"][fast].get<int64_t>(), atStart) << last.dump();
  EXPECT_GE(last["step"].get<int64_t>(), 3 + 5) << "before the slowdown persisted: " << last.dump();
  EXPECT_GT(last["speed_factors"][fast].get<double>(), 3.0) << last.dump();
}

// ---- Several pipelines as data-parallel replicas (DP x PP) --------------------------------------

double maxDifference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Trains `config`'s pipelines with one thread per device and compares with the single process:
// every step's loss and every trained block within 1e-5 (the replicas sum their gradients in
// another order than one process's chunks), each block on exactly one stage of every pipeline
// and bitwise alike there, the shares summing to the global batch. Returns the step records.
std::vector<nlohmann::json> expectReplicasSameAsOneProcess(const RunConfig& config,
                                                           const std::string& name) {
  torch::set_num_threads(1);
  const int world = int(config.devices.size()), stages = int(config.parallel.pipeline);
  const int replicas = world / stages;
  const auto dir = tempDir(name);
  const fs::path metrics = dir / "metrics.jsonl";
  const auto models = trainOnThreads(config, metrics);
  const Reference ref = singleProcess(config);
  const auto steps = records(metrics, "pipeline_step");
  EXPECT_EQ(steps.size(), ref.losses.size());
  for (size_t s = 0; s < std::min(steps.size(), ref.losses.size()); ++s) {
    EXPECT_NEAR(steps[s]["loss"].get<double>(), ref.losses[s], 1e-5) << "step " << s + 1;
    EXPECT_EQ(steps[s]["stages"].size(), size_t(world));
    const auto shares = steps[s]["shares"].get<std::vector<int64_t>>();
    EXPECT_EQ(shares.size(), size_t(replicas));
    int64_t sum = 0;
    for (int64_t b : shares) sum += b;
    EXPECT_EQ(sum, config.train.globalBatch) << "step " << s + 1;
    for (const auto& stage : steps[s]["stages"])
      EXPECT_LE(stage["chunks_in_flight"].get<int64_t>(),
                std::min<int64_t>(stages - stage["stage"].get<int64_t>(), config.parallel.chunks));
  }
  const auto evals = records(metrics, "eval");
  EXPECT_EQ(evals.size(), 1u);
  if (!evals.empty()) {
    EXPECT_NEAR(evals[0]["test_loss"].get<double>(), ref.testLoss, 1e-5);
    EXPECT_NEAR(evals[0]["test_accuracy"].get<double>(), ref.testAccuracy, 1e-9);
  }
  for (size_t b = 0; b < ref.model->blockCount(); ++b) {
    std::vector<int> holders;
    for (int r = 0; r < world; ++r)
      if (models[size_t(r)]->blockParameters(b).front().numel() > 0) holders.push_back(r);
    EXPECT_EQ(holders.size(), size_t(replicas)) << "block " << b;
    if (holders.empty()) continue;
    for (int r : holders) {
      EXPECT_EQ(r % stages, holders.front() % stages) << "block " << b << ": another stage";
      const auto& params = models[size_t(r)]->blockParameters(b);
      const auto& expected = ref.model->blockParameters(b);
      const auto& first = models[size_t(holders.front())]->blockParameters(b);
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_LE(maxDifference(params[i], expected[i]), 1e-5)
            << "block " << b << " parameter " << i << " on rank " << r;
        EXPECT_TRUE(torch::equal(params[i], first[i]))
            << "block " << b << " parameter " << i << ": replicas differ";
      }
    }
  }
  fs::remove_all(dir);
  return steps;
}

TEST(PipelineReplicas, TwoPipelinesOfDifferentSpeedsEqualOneProcess) {
  // 2 pipelines of 2 stages, the second 6 times slower (layers wide enough that compute, not
  // scheduling, sets the pace on a busy machine): the balancer moves samples to the first
  // (odd shares, 3 chunks each, uneven chunk sizes), and the training still equals one process.
  const auto steps = expectReplicasSameAsOneProcess(
      pipelineConfig({"model.name=\"mlp\"", "model.hidden=[256, 256]", "train.momentum=0.9",
                      "parallel.pipeline=2", "parallel.chunks=3", "balance.profile_steps=2",
                      "devices=[{name=\"a0\"},{name=\"a1\"},{name=\"b0\",slowdown=6},"
                      "{name=\"b1\",slowdown=6}]"}),
      "replicas-two");
  ASSERT_FALSE(steps.empty());
  const auto first = steps.front()["shares"].get<std::vector<int64_t>>();
  const auto last = steps.back()["shares"].get<std::vector<int64_t>>();
  EXPECT_EQ(first, (std::vector<int64_t>{15, 15}));  // the profile's equal split
  EXPECT_GT(last[0], last[1]) << "the faster pipeline should end with more samples";
}

TEST(PipelineReplicas, ZeroOneOverThreePipelinesEqualsOneProcess) {
  // 3 pipelines of 2 stages (6 ranks), adam with its state sharded over each stage's 3 replicas.
  expectReplicasSameAsOneProcess(
      pipelineConfig({"model.name=\"mlp\"", "model.hidden=[24, 16, 8]", "train.optimizer=\"adam\"",
                      "train.lr=0.01", "parallel.pipeline=2", "parallel.chunks=2", "zero.stage=1",
                      "devices=[{name=\"a0\"},{name=\"a1\"},{name=\"b0\",slowdown=2},"
                      "{name=\"b1\",slowdown=2},{name=\"c0\"},{name=\"c1\"}]"}),
      "replicas-zero");
}

// Replicas whose devices round differently drift apart; every train.resync_every steps the first
// pipeline's stage parameters replace the others'. Rank r adds eps * r * (1 + i % 7) / 7 to
// element i of what its optimizer updated, every step: a stage's two replicas (ranks s and 2 + s)
// drift by 4 * 2 * eps in 4 steps, and after the last step, a re-synchronising one, every block is
// bitwise alike on its replicas.
TEST(PipelineReplicas, ResynchronisingBoundsTheDriftOfEachStagesReplicas) {
  torch::set_num_threads(1);
  const double eps = 1e-5;
  const auto dir = tempDir("replicas-drift");
  const auto config = pipelineConfig(
      {"model.name=\"mlp\"", "model.hidden=[24, 16]", "train.momentum=0.9", "train.steps=12",
       "train.resync_every=4", "parallel.pipeline=2", "parallel.chunks=2", "balance.mode=equal",
       "devices=[{name=\"a0\"},{name=\"a1\"},{name=\"b0\"},{name=\"b1\"}]"});
  const auto models =
      trainOnThreads(config, dir / "metrics.jsonl", [&](int rank, TrainerOptions& options) {
        options.afterOptimizerStep = [rank, eps](const std::vector<torch::Tensor>& updated,
                                                 int64_t) {
          torch::NoGradGuard noGrad;
          for (const auto& p : updated) {
            auto flat = p.view({-1});
            const auto i = torch::arange(flat.numel(), torch::kInt64);
            flat.add_((i.remainder(7) + 1).to(torch::kFloat32) * float(eps * rank / 7.0));
          }
        };
      });
  const auto steps = records(dir / "metrics.jsonl", "pipeline_step");
  ASSERT_EQ(steps.size(), 12u);
  for (size_t s = 0; s < steps.size(); ++s) {
    if ((s + 1) % 4 == 0) {
      ASSERT_TRUE(steps[s]["replica_drift"].is_number()) << "step " << s + 1;
      EXPECT_NEAR(steps[s]["replica_drift"].get<double>(), 8 * eps, 0.01 * 8 * eps)
          << "step " << s + 1;
    } else {
      EXPECT_TRUE(steps[s]["replica_drift"].is_null()) << "step " << s + 1;
    }
  }
  const size_t blocks = models[0]->blockCount();
  for (size_t b = 0; b < blocks; ++b) {
    std::vector<int> holders;
    for (int r = 0; r < 4; ++r)
      if (models[size_t(r)]->blockParameters(b).front().numel() > 0) holders.push_back(r);
    ASSERT_EQ(holders.size(), 2u) << "block " << b;
    const auto& first = models[size_t(holders[0])]->blockParameters(b);
    const auto& second = models[size_t(holders[1])]->blockParameters(b);
    for (size_t i = 0; i < first.size(); ++i)
      EXPECT_TRUE(torch::equal(first[i], second[i])) << "block " << b << " parameter " << i;
  }
  fs::remove_all(dir);
}

TEST(Pipeline, ConfigRefusesWhatThePipelineCannotRun) {
  auto message = [](const std::vector<std::string>& sets) {
    try {
      pipelineConfig(sets);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string mlp = "model.hidden=[8]";  // 2 blocks
  EXPECT_NE(message({mlp, "parallel.pipeline=3", devices(3)})
                .find("parallel.pipeline = 3: more stages than the 2 blocks"),
            std::string::npos);
  EXPECT_NE(message({"parallel.pipeline=2", devices(3)})
                .find("parallel.pipeline = 2: must divide the number of devices (3)"),
            std::string::npos);
  EXPECT_NE(message({"parallel.pipeline=2", "zero.stage=2", devices(4)})
                .find("zero.stage = 2: with parallel.pipeline > 1, ZeRO shards"),
            std::string::npos);
  EXPECT_NE(
      message({"parallel.pipeline=2", "zero.stage=1", "zero.offload=\"optimizer\"", devices(4)})
          .find("zero.offload = \"optimizer\": not supported with parallel.pipeline > 1"),
      std::string::npos);
  EXPECT_EQ(message({"parallel.pipeline=2", "zero.stage=1", devices(4)}), "no error");
  EXPECT_NE(message({"parallel.pipeline=2", "parallel.chunks=31", devices(2)})
                .find("parallel.chunks = 31: more chunks than train.global_batch = 30"),
            std::string::npos);
  EXPECT_NE(message({"parallel.pipeline=2", "train.grad_clip=1", devices(2)})
                .find("not supported with parallel.pipeline > 1"),
            std::string::npos);
  EXPECT_NE(message({"parallel.partition=\"uniform\""}).find("parallel.partition"),
            std::string::npos);
}

// ---- A stage's process killed mid-step ----------------------------------------------------------

// Rank `rank` of 3 processes sharing a file store: trains until it fails, then writes the error's
// type and text to `out` and exits (0 finished, 3 PeerAbortedError, 4 anything else).
[[noreturn]] void stageProcess(const RunConfig& config, const fs::path& dir, int rank) {
  std::string outcome;
  int code = 4;
  try {
    torch::set_num_threads(1);
    auto store = std::make_shared<store::FileStore>((dir / "store").string());
    comm::GroupOptions group;
    group.timeout = Millis(60000);  // a rank waiting for its deadline would take minutes
    auto comm = comm::Communicator::create(store, rank, 3, group);
    TrainerOptions options;
    if (rank == 0) options.metricsPath = (dir / "metrics.jsonl").string();
    train(config, comm, options);
    outcome = "finished";
    code = 0;
  } catch (const PeerAbortedError& e) {
    outcome = str("PeerAbortedError ", e.what());
    code = 3;
  } catch (const std::exception& e) {
    outcome = str("other ", e.what());
  }
  std::ofstream(dir / ("rank" + std::to_string(rank))) << outcome;
  _exit(code);
}

TEST(Pipeline, AKilledStageMakesEveryOtherStageFailNamingIt) {
  const auto dir = tempDir("kill");
  const RunConfig config =
      pipelineConfig({"model.name=\"mlp\"", "model.hidden=[24, 16]", "train.steps=1000000",
                      "parallel.pipeline=3", "parallel.chunks=4", devices(3)});
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 3; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) stageProcess(config, dir, rank);
    pids.push_back(pid);
  }
  // Training runs once rank 0 has written a few step records; then the middle stage dies in
  // whatever step it is in.
  const auto started = std::chrono::steady_clock::now();
  while (records(dir / "metrics.jsonl", "pipeline_step").size() < 3 &&
         std::chrono::steady_clock::now() - started < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(records(dir / "metrics.jsonl", "pipeline_step").size(), 3u);
  kill(pids[1], SIGKILL);
  // The survivors end on their own (a safety net far below the communicator's deadline, so a
  // rank that waited for it fails here rather than hanging the test).
  std::map<pid_t, int> statuses;
  const auto killed = std::chrono::steady_clock::now();
  while (statuses.size() < 3 &&
         std::chrono::steady_clock::now() - killed < std::chrono::seconds(50)) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0)
      statuses[done] = status;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : pids)
    if (!statuses.count(pid)) {
      ADD_FAILURE() << "pid " << pid << " still running";
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  for (int rank : {0, 2}) {
    const std::string outcome = test::slurp(dir / ("rank" + std::to_string(rank)));
    SCOPED_TRACE(outcome);
    ASSERT_TRUE(statuses.count(pids[size_t(rank)]));
    const int status = statuses[pids[size_t(rank)]];
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << "rank " << rank;
    EXPECT_EQ(outcome.rfind("PeerAbortedError", 0), 0u) << "rank " << rank;
    EXPECT_NE(outcome.find("rank 1"), std::string::npos) << "rank " << rank;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hetra::train
