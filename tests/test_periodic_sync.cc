// Periodic model averaging (train/periodic_sync.h) on real ranks over real transports: on
// quadratics F_i(x) = 1/2 |x - e_i|^2 plain averaging with unequal local steps converges to the
// step-weighted point and FedNova to the sample-weighted optimum; uniform averaging of a skewed
// split is biased; one local step per round is synchronous data parallelism; time mode divides by
// the steps each rank took; a run with H = 4 resumed from a checkpoint ends where an uninterrupted
// one does.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "harness.h"
#include "train/config.h"
#include "train/data_parallel.h"
#include "train/dataset_geometry.h"
#include "train/fused_optim.h"
#include "train/models.h"
#include "train/optim.h"
#include "train/periodic_sync.h"
#include "train/specs.h"
#include "train/trainer.h"

namespace hetra::train {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<comm::Communicator> makeGroup(std::shared_ptr<store::Store> store, int rank,
                                              int size, const std::string& transport) {
  comm::GroupOptions group;
  group.timeout = Millis(30000);
  if (transport == "islands") {
    // Two islands over tcp, the averaging through the hierarchical allreduce.
    group.transport = "tcp";
    for (int r = 0; r < size; ++r) group.islands.push_back(r < (size + 1) / 2 ? 0 : 1);
    group.algorithm = "allreduce:hierarchical";
  } else {
    group.transport = transport;
  }
  return comm::Communicator::create(std::move(store), rank, size, group);
}

// One parameter x of `dims` values, starting at zero.
struct Point : torch::nn::Module {
  explicit Point(int64_t dims) { x = register_parameter("x", torch::zeros({dims})); }
  torch::Tensor x;
};

// Rounds of local SGD on rank i's F_i(x) = 1/2 |x - e_i|^2: rank i takes steps[i] local steps of
// batch[i] samples per round. The learning rate halves from 0.05 in phases long enough for the
// bias of each rate to settle, so the fixed points are those of vanishing rates. Returns rank 0's
// x (every rank holds the same after a round).
std::vector<double> averageQuadratics(const std::string& transport,
                                      const std::vector<int64_t>& steps,
                                      const std::vector<int64_t>& batch, bool normalize,
                                      bool uniform) {
  const int n = int(steps.size());
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<std::vector<double>> result(static_cast<size_t>(n));
  test::runRanks(n, [&](int rank) {
    auto comm = makeGroup(store, rank, n, transport);
    auto point = std::make_shared<Point>(n);
    auto optimizer = makeOptimizer(point->parameters(), OptimSpec{});
    PeriodicSyncOptions options;
    options.normalizeBySteps = normalize;
    options.uniform = uniform;
    PeriodicSync sync(point, *optimizer, comm, options);
    torch::Tensor target = torch::zeros({n});
    target[rank] = 1.0;
    for (int phase = 0; phase < 7; ++phase) {
      const double lr = 0.05 / double(1 << phase);
      applyLr(*optimizer, lr);
      for (int round = 0; round < int(0.6 / lr); ++round) {
        for (int64_t s = 0; s < steps[size_t(rank)]; ++s) {
          ASSERT_TRUE(sync.takesStep(s));
          point->x.mutable_grad() = point->x.detach() - target;
          optimizer->step();
          sync.tookStep(batch[size_t(rank)]);
        }
        sync.average();
      }
    }
    for (int i = 0; i < n; ++i) result[size_t(rank)].push_back(point->x[i].item<double>());
  });
  for (int rank = 1; rank < n; ++rank)
    for (int i = 0; i < n; ++i)
      EXPECT_EQ(result[size_t(rank)][size_t(i)], result[0][size_t(i)]) << "rank " << rank;
  return result[0];
}

// sum_i w_i e_i / sum_i w_i: the minimiser of sum_i w_i F_i.
std::vector<double> weightedPoint(const std::vector<double>& w) {
  double total = 0;
  for (double v : w) total += v;
  std::vector<double> point;
  for (double v : w) point.push_back(v / total);
  return point;
}

double maxDistance(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

class Transports : public ::testing::TestWithParam<std::string> {};

// Local steps proportional to speed (1, 2, 4) on equal local batches: each rank processed
// n_i = 8 tau_i samples, so the sample-weighted objective is sum_i n_i F_i. Plain averaging,
// weighted by samples, converges to sum_i n_i tau_i e_i / sum_i n_i tau_i instead.
TEST_P(Transports, FedNovaReachesTheSampleWeightedOptimumPlainAveragingTheStepWeightedPoint) {
  torch::set_num_threads(1);
  const std::vector<int64_t> steps = {1, 2, 4}, batch = {8, 8, 8};
  const auto sampleWeighted = weightedPoint({8, 16, 32});
  const auto stepWeighted = weightedPoint({8 * 1, 16 * 2, 32 * 4});
  const auto plain = averageQuadratics(GetParam(), steps, batch, false, false);
  const auto fedNova = averageQuadratics(GetParam(), steps, batch, true, false);
  EXPECT_LT(maxDistance(fedNova, sampleWeighted), 1e-3);
  EXPECT_LT(maxDistance(plain, stepWeighted), 1e-3);
  EXPECT_GT(maxDistance(plain, sampleWeighted), 0.1) << "the two points must differ to tell";
}

// Equal local steps on a skewed split (1, 2, 5 samples per step): weighted by samples the
// average reaches the optimum of the global batch's mean loss; weighing every rank 1/n (PyTorch's
// PeriodicModelAverager) reaches the centre of the e_i instead.
TEST_P(Transports, UniformAveragingOfASkewedSplitIsBiased) {
  torch::set_num_threads(1);
  const std::vector<int64_t> steps = {2, 2, 2}, batch = {1, 2, 5};
  const auto optimum = weightedPoint({1, 2, 5});
  const auto weighted = averageQuadratics(GetParam(), steps, batch, false, false);
  const auto uniform = averageQuadratics(GetParam(), steps, batch, false, true);
  EXPECT_LT(maxDistance(weighted, optimum), 1e-3);
  EXPECT_LT(maxDistance(uniform, weightedPoint({1, 1, 1})), 1e-3);
  EXPECT_GT(maxDistance(uniform, optimum), 0.2) << "uniform averaging is biased";
}

INSTANTIATE_TEST_SUITE_P(PeriodicSync, Transports, ::testing::Values("shm", "tcp", "islands"));

// A small MLP whose parameters start at distinct values of a fixed formula (no global RNG, which
// the rank threads would share).
torch::nn::Sequential smallMlp() {
  torch::nn::Sequential mlp(torch::nn::Linear(6, 5), torch::nn::ReLU(), torch::nn::Linear(5, 3));
  torch::NoGradGuard noGrad;
  int64_t offset = 0;
  for (auto& p : mlp->parameters()) {
    p.copy_(torch::arange(offset, offset + p.numel()).mul(0.77).sin().mul(0.4).view_as(p));
    offset += p.numel();
  }
  return mlp;
}

// The samples of rank `rank`'s share of step `step`: inputs and labels distinct per step, sample
// and feature.
std::pair<torch::Tensor, torch::Tensor> shareOf(int64_t step, const std::vector<int64_t>& batch,
                                                int rank) {
  int64_t first = step * 100;
  for (int r = 0; r < rank; ++r) first += batch[size_t(r)];
  const int64_t b = batch[size_t(rank)];
  const auto ids = torch::arange(first, first + b, torch::kFloat32);
  const auto inputs = (ids.unsqueeze(1) * 0.31 + torch::arange(6).unsqueeze(0) * 1.7).sin();
  const auto labels = (torch::arange(first, first + b) * 7 + step) % 3;
  return {inputs, labels};
}

// H = 1 (one local step per round, then the average) against synchronous data parallelism on the
// same uneven split: every rank ends with the same parameters to 1e-6, with and without momentum.
void expectOneStepRoundsAreSynchronous(double momentum) {
  torch::set_num_threads(1);
  const std::vector<int64_t> batch = {2, 3, 5};
  const int64_t globalBatch = 10, steps = 12;
  const int n = 3;
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(n, [&](int rank) {
    auto comm = makeGroup(store, rank, n, "shm");
    OptimSpec spec;
    spec.lr = 0.2;
    spec.momentum = momentum;
    auto loss = [](const torch::Tensor& logits, const torch::Tensor& labels, double scale) {
      return torch::nn::functional::cross_entropy(
                 logits, labels,
                 torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) *
             scale;
    };
    auto syncModel = smallMlp(), localModel = smallMlp();
    auto syncOptim = makeOptimizer(syncModel->parameters(), spec);
    auto localOptim = makeOptimizer(localModel->parameters(), spec);
    DataParallel parallel(syncModel.ptr(), comm);
    PeriodicSync sync(localModel.ptr(), *localOptim, comm, PeriodicSyncOptions{});
    for (int64_t step = 0; step < steps; ++step) {
      const auto [inputs, labels] = shareOf(step, batch, rank);
      parallel.armLastBackward();
      loss(syncModel->forward(inputs), labels, 1.0 / double(globalBatch)).backward();
      parallel.finish(1);
      syncOptim->step();
      parallel.clearGradients();
      ASSERT_TRUE(sync.takesStep(step));
      localOptim->zero_grad();
      loss(localModel->forward(inputs), labels, 1.0 / double(batch[size_t(rank)])).backward();
      localOptim->step();
      sync.tookStep(batch[size_t(rank)]);
      sync.average();
    }
    const auto a = syncModel->parameters(), b = localModel->parameters();
    for (size_t k = 0; k < a.size(); ++k)
      EXPECT_LT((a[k] - b[k]).abs().max().item<double>(), 1e-6)
          << "rank " << rank << " parameter " << k;
    // The runs moved: the comparison is not of two initial models.
    EXPECT_GT((a[0] - smallMlp()->parameters()[0]).abs().max().item<double>(), 1e-3);
  });
}

TEST(PeriodicSync, OneStepRoundsAreSynchronousDataParallelism) {
  expectOneStepRoundsAreSynchronous(0.0);
}

TEST(PeriodicSync, OneStepRoundsAreSynchronousDataParallelismWithMomentum) {
  expectOneStepRoundsAreSynchronous(0.9);
}

// Time mode: a rank whose steps take longer stops at the budget after fewer local steps (at least
// one), and the average divides each rank's delta by its own steps (FedNova), recomputed here from
// every rank's delta.
TEST(PeriodicSync, TimeModeNormalisesUnequalLocalSteps) {
  torch::set_num_threads(1);
  const int n = 2;
  const std::vector<int64_t> batch = {3, 5};
  const std::vector<std::chrono::milliseconds> stepTime = {std::chrono::milliseconds(1),
                                                           std::chrono::milliseconds(150)};
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<torch::Tensor> deltas(n), averaged(n);
  std::vector<int64_t> taken(n);
  test::runRanks(n, [&](int rank) {
    auto comm = makeGroup(store, rank, n, "shm");
    auto point = std::make_shared<Point>(3);
    auto optimizer = makeOptimizer(point->parameters(), OptimSpec{});
    PeriodicSyncOptions options;
    options.every = 8;
    options.mode = SyncMode::kTime;
    options.roundSeconds = 0.2;
    PeriodicSync sync(point, *optimizer, comm, options);
    const auto target = torch::tensor({1.0f, -2.0f, 0.5f}) * float(rank + 1);
    for (int64_t s = 0; s < options.every; ++s) {
      if (!sync.takesStep(s)) continue;
      std::this_thread::sleep_for(stepTime[size_t(rank)]);
      point->x.mutable_grad() = point->x.detach() - target;
      optimizer->step();
      sync.tookStep(batch[size_t(rank)]);
    }
    deltas[size_t(rank)] = point->x.detach().clone();  // the anchor is zero
    sync.average();
    taken[size_t(rank)] = sync.lastLocalSteps();
    averaged[size_t(rank)] = point->x.detach().clone();
  });
  EXPECT_LE(taken[1], 2) << "150 ms steps in a 200 ms budget";
  EXPECT_GE(taken[1], 1);
  EXPECT_GT(taken[0], taken[1]);
  // p_i = n_i / sum n, n_i = tau_i b_i; x = tau_eff sum p_i delta_i / tau_i.
  const double n0 = double(taken[0] * batch[0]), n1 = double(taken[1] * batch[1]);
  const double p0 = n0 / (n0 + n1), p1 = n1 / (n0 + n1);
  const double tauEff = p0 * double(taken[0]) + p1 * double(taken[1]);
  const auto expected =
      tauEff * (p0 * deltas[0] / double(taken[0]) + p1 * deltas[1] / double(taken[1]));
  for (int rank = 0; rank < n; ++rank)
    EXPECT_LT((averaged[size_t(rank)] - expected).abs().max().item<double>(), 1e-6)
        << "rank " << rank;
}

// Adam's moments are averaged with the samples' weights, its step count becomes their weighted
// mean, rounded, the same on every rank; recomputed here from every rank's state before the round's
// end.
TEST(PeriodicSync, AdamMomentsAreAveragedWithTheSampleWeights) {
  torch::set_num_threads(1);
  const int n = 2;
  const std::vector<int64_t> steps = {1, 3}, batch = {4, 6};
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<torch::Tensor> m(n), v(n), averagedM(n), averagedV(n);
  std::vector<int64_t> averagedStep(n);
  test::runRanks(n, [&](int rank) {
    auto comm = makeGroup(store, rank, n, "tcp");
    auto point = std::make_shared<Point>(4);
    OptimSpec spec;
    spec.name = "adam";
    auto optimizer = makeOptimizer(point->parameters(), spec);
    PeriodicSync sync(point, *optimizer, comm, PeriodicSyncOptions{});
    const auto target = torch::arange(4, torch::kFloat32).mul(0.5) + float(3 * rank);
    for (int64_t s = 0; s < steps[size_t(rank)]; ++s) {
      ASSERT_TRUE(sync.takesStep(s));
      point->x.mutable_grad() = point->x.detach() - target;
      optimizer->step();
      sync.tookStep(batch[size_t(rank)]);
    }
    auto state = [&]() -> torch::optim::AdamParamState& {
      return static_cast<torch::optim::AdamParamState&>(*paramStateSlot(*optimizer, point->x));
    };
    m[size_t(rank)] = state().exp_avg().clone();
    v[size_t(rank)] = state().exp_avg_sq().clone();
    sync.average();
    averagedM[size_t(rank)] = state().exp_avg().clone();
    averagedV[size_t(rank)] = state().exp_avg_sq().clone();
    averagedStep[size_t(rank)] = state().step();
  });
  // n_i = tau_i b_i: 4 and 18 samples.
  const double p0 = 4.0 / 22.0, p1 = 18.0 / 22.0;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_LT((averagedM[size_t(rank)] - (p0 * m[0] + p1 * m[1])).abs().max().item<double>(), 1e-6);
    EXPECT_LT((averagedV[size_t(rank)] - (p0 * v[0] + p1 * v[1])).abs().max().item<double>(), 1e-6);
    EXPECT_EQ(averagedStep[size_t(rank)], std::llround(p0 * 1 + p1 * 3)) << "rank " << rank;
  }
}

fs::path tempDir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("hetra-periodic-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

RunConfig periodicConfig(const std::vector<std::string>& extra) {
  std::ifstream in(std::string(HETRA_SOURCE_DIR) + "/examples/tiny_synthetic.toml");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> sets = {"train.log_every=0",
                                   "train.eval_every=0",
                                   "train.sync_every=4",
                                   "train.sync_warmup_steps=2",
                                   "comm.compression=\"fp8-e4m3\"",
                                   "comm.compression_min_bytes=0"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parseConfig(text, "tiny_synthetic.toml", sets);
}

// Trains with one thread per device; returns every rank's final parameters, flat.
std::vector<torch::Tensor> trainRanks(const RunConfig& config, const std::string& resume = "",
                                      const fs::path& metrics = {}) {
  auto store = std::make_shared<store::MemoryStore>();
  const int ranks = int(config.devices.size());
  std::vector<torch::Tensor> finals(static_cast<size_t>(ranks));
  test::runRanks(ranks, [&](int rank) {
    auto comm = makeGroup(store, rank, ranks, "auto");
    std::shared_ptr<Model> model;
    TrainerOptions options;
    options.resumeDir = resume;
    options.metricsPath = metrics.string();
    options.makeModel = [&] {
      model = makeModel(modelSpecOf(config, datasetGeometry(config.data)));
      return model;
    };
    train(config, comm, options);
    std::vector<torch::Tensor> flat;
    for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}));
    finals[size_t(rank)] = torch::cat(flat);
  });
  return finals;
}

// H = 4 after two synchronous steps, fp8 with error feedback on the model delta: stopped at the
// checkpoint of step 10 (a round cut short by it) and resumed to 18, every rank ends where the
// uninterrupted run's does.
TEST(PeriodicSync, ResumedRunEndsWhereAnUninterruptedRunEnds) {
  torch::set_num_threads(1);
  const auto dir = tempDir("resume");
  auto sets = [&](int steps, const fs::path& root) {
    return std::vector<std::string>{
        "train.steps=" + std::to_string(steps), "train.checkpoint_every=10",
        // Local steps depend on the split (unlike synchronous
        // gradients), and the balancer's depends on timings.
        "balance.mode=\"equal\"", "train.checkpoint_dir=" + root.string()};
  };
  const auto full = trainRanks(periodicConfig(sets(18, dir / "full")));
  trainRanks(periodicConfig(sets(10, dir / "part")));
  torch::Tensor saved;
  torch::load(saved, (dir / "part" / "step-10" / "sync_residuals.pt").string());
  EXPECT_EQ(saved.size(0), 3) << "one row of residuals per rank";
  EXPECT_GT(saved.abs().max().item<double>(), 0.0) << "fp8 lost nothing? the residuals are empty";
  const auto resumed = trainRanks(periodicConfig(sets(18, dir / "part")), (dir / "part").string());
  for (size_t rank = 0; rank < full.size(); ++rank) {
    EXPECT_LT((resumed[rank] - full[rank]).abs().max().item<double>(), 1e-5) << "rank " << rank;
    EXPECT_TRUE(torch::equal(full[rank], full[0])) << "one model after the last round";
  }
  fs::remove_all(dir);
}

// The uneven devices of tiny_synthetic.toml: the balancer still measures them and moves the split,
// at the ends of rounds only (steps 1 and 2 are synchronous, then rounds end at multiples of 4 and
// at the last step); one step record per round.
TEST(PeriodicSync, BalancerMovesTheSplitAtRoundEnds) {
  torch::set_num_threads(1);
  const auto dir = tempDir("balance");
  trainRanks(periodicConfig({"train.steps=30"}), "", dir / "metrics.jsonl");
  std::ifstream in(dir / "metrics.jsonl");
  std::vector<int64_t> recorded, moved;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "step") recorded.push_back(record["step"].get<int64_t>());
    if (record["event"] == "balance") moved.push_back(record["step"].get<int64_t>());
  }
  const std::vector<int64_t> roundEnds = {1, 2, 4, 8, 12, 16, 20, 24, 28, 30};
  EXPECT_EQ(recorded, roundEnds);
  ASSERT_FALSE(moved.empty()) << "the split never moved";
  for (int64_t step : moved)
    EXPECT_NE(std::find(roundEnds.begin(), roundEnds.end(), step), roundEnds.end()) << step;
  fs::remove_all(dir);
}

// Time mode through the trainer: with a budget shorter than the slow devices' steps they skip the
// rest of each round (no rank waits for another's step), and after the last round every rank holds
// the same, finite model.
TEST(PeriodicSync, TimeModeRunsThroughTheTrainer) {
  torch::set_num_threads(1);
  const auto finals = trainRanks(
      periodicConfig({"train.steps=14", "train.sync_mode=\"time\"", "train.sync_seconds=0.0005"}));
  for (const auto& f : finals) {
    EXPECT_TRUE(torch::equal(f, finals[0]));
    EXPECT_TRUE(torch::isfinite(f).all().item<bool>());
  }
}

TEST(PeriodicSync, ConfigNamesTheKeys) {
  try {
    periodicConfig({"train.sync_mode=\"time\""});
    FAIL() << "time mode without a budget";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.sync_seconds"), std::string::npos) << e.what();
  }
  try {
    periodicConfig({"train.sync_mode=\"often\""});
    FAIL() << "an unknown mode";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.sync_mode"), std::string::npos) << e.what();
  }
  try {
    periodicConfig({"train.sync_every=1", "train.sync_mode=\"time\"", "train.sync_seconds=1"});
    FAIL() << "time mode with rounds of one step";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.sync_every"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hetra::train
