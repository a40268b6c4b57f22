// ZeRO stages 1-3 (train/zero_parallel.h, docs/zero.md): the shard layout; 50 steps on 3 ranks
// with uneven batches, uneven accumulation and uneven shards (one empty, one boundary inside a
// tensor) against plain data parallelism; the accounted memory of rank processes against the
// formula of docs/zero.md; a model that does not fit the smallest device under data parallelism
// nor under even shards, and trains under ZeRO-3 with memory shards; and `hetra run`'s trainer
// under every stage. Memory is per process (device/memory_accounting.h), so the memory tests run
// each rank as a process of its own: this binary again, with the rank's role in its environment.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>
#include <thread>

#include "comm/communicator.h"
#include "common/errors.h"
#include "device/memory_accounting.h"
#include "harness.h"
#include "store/file_store.h"
#include "store/store.h"
#include "train/config.h"
#include "train/data_parallel.h"
#include "train/dataset_geometry.h"
#include "train/models.h"
#include "train/optim.h"
#include "train/shard_follower.h"
#include "train/specs.h"
#include "train/trainer.h"
#include "train/zero_layout.h"
#include "train/zero_parallel.h"
#include "train/zero_plan.h"

namespace hetra::train {
namespace {

namespace fs = std::filesystem;
using device::MemoryCategory;

// ---- Layout ------------------------------------------------------------------------------------

TEST(ZeroLayout, ProportionalShardsAreAlignedCoverEverythingAndMayBeEmpty) {
  const auto sizes = proportionalShards(1000, {0.0, 1.0, 3.0});
  ASSERT_EQ(sizes.size(), 3u);
  EXPECT_EQ(sizes[0], 0);
  EXPECT_EQ(sizes[1] % kShardAlign, 0);
  EXPECT_EQ(sizes[0] + sizes[1] + sizes[2], 1000);
  EXPECT_EQ(sizes[1], 256);  // 1000 / 4 = 250, to the nearest multiple of 16
  const auto even = proportionalShards(1000, {1.0, 1.0, 1.0});
  EXPECT_EQ(even, (std::vector<int64_t>{336, 336, 328}));
  // A last rank of weight zero gets nothing; the one before it the rest.
  EXPECT_EQ(proportionalShards(100, {1.0, 1.0, 0.0}), (std::vector<int64_t>{48, 52, 0}));
}

TEST(ZeroLayout, CountsAreEachRanksPieceOfARange) {
  const ShardLayout layout({221, 17, 187}, {0, 160, 265});
  EXPECT_EQ(layout.total(), 425);
  EXPECT_EQ(layout.shard(1), (FlatRange{0, 160}));
  EXPECT_EQ(layout.countsOf(layout.tensor(0)), (std::vector<size_t>{0, 160, 61}));
  EXPECT_EQ(layout.countsOf(layout.tensor(1)), (std::vector<size_t>{0, 0, 17}));
  EXPECT_THROW(ShardLayout({10}, {3, 7}), ConfigError);   // boundary 3 is not aligned
  EXPECT_THROW(ShardLayout({10}, {16, 0}), ConfigError);  // more than the parameters
  // The end of the parameters is a boundary even when empty shards follow it, as
  // proportionalShards makes them for a last rank of weight zero.
  const ShardLayout lastEmpty({100}, proportionalShards(100, {1.0, 1.0, 0.0}));
  EXPECT_EQ(lastEmpty.shard(1), (FlatRange{48, 100}));
  EXPECT_EQ(lastEmpty.shard(2), (FlatRange{100, 100}));
  EXPECT_THROW(ShardLayout({100}, {40, 60, 0}), ConfigError);  // 40 is not aligned
}

// ---- Against data parallelism
// --------------------------------------------------------------------

constexpr int kRanks = 3;
constexpr int kSteps = 50;
constexpr int64_t kGlobalBatch = 17;

ModelSpec smallMlp() {
  ModelSpec spec;
  spec.sampleShape = {13};
  spec.classes = 5;
  spec.hidden = {17, 11};  // tensors of 221, 17, 187, 11, 55, 5 elements: 496
  spec.seed = 42;
  return spec;
}

// Uneven batches and micro-batch counts, a rank without samples in one of them.
struct Split {
  std::vector<int64_t> batches, accum;
};
const std::vector<Split> kSplits = {
    {{5, 9, 3}, {1, 3, 2}}, {{0, 12, 5}, {0, 2, 1}}, {{7, 1, 9}, {2, 1, 4}}};

// Rank 0's shard is empty; the boundary at 160 falls inside fc0.weight (221 elements).
const std::vector<int64_t> kShards = {0, 160, 336};

struct StepData {
  torch::Tensor inputs, targets;
};

std::vector<StepData> makeSteps() {
  auto generator = at::detail::createCPUGenerator(11);
  std::vector<StepData> steps;
  for (int s = 0; s < kSteps; ++s)
    steps.push_back({torch::randn({kGlobalBatch, 13}, generator),
                     torch::randint(0, 5, {kGlobalBatch}, generator, torch::kInt64)});
  return steps;
}

int64_t microBatches(const Split& split, int rank) {
  return split.batches[size_t(rank)] == 0 ? 0 : split.accum[size_t(rank)];
}

// This rank's micro-batches of step `s`, the loss divided by the global batch as the trainer's;
// `beforeLast` runs before the last backward.
void runMicroBatches(Model& model, const StepData& data, const Split& split, int rank,
                     const std::function<void()>& beforeLast) {
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += split.batches[size_t(r)];
  const int64_t mine = split.batches[size_t(rank)], k = microBatches(split, rank);
  for (int64_t j = 0; j < k; ++j) {
    const int64_t start = offset + mine * j / k, end = offset + mine * (j + 1) / k;
    if (j + 1 == k) beforeLast();
    auto loss = torch::nn::functional::cross_entropy(
        model.forward(data.inputs.slice(0, start, end)), data.targets.slice(0, start, end),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    (loss / double(kGlobalBatch)).backward();
  }
}

OptimSpec optimizerNamed(const std::string& name) {
  OptimSpec spec;
  spec.name = name;
  if (name == "sgd") {
    spec.lr = 0.05;
    spec.momentum = 0.9;
    spec.weightDecay = 1e-3;
  } else {
    spec.lr = 0.01;
  }
  return spec;
}

ZeroOptions zeroOptions(int stage, std::vector<int64_t> shards, const OptimSpec& optim,
                        Offload offload = Offload::kNone) {
  ZeroOptions options;
  options.stage = stage;
  options.shardSizes = std::move(shards);
  options.optimizer = optim;
  options.offload = offload;
  return options;
}

// The group the runs share: the shared-memory collectives, whose small operations reduce every
// element in rank order, in an allreduce and a reduce-scatter alike (comm/algorithms/shared.h),
// so data parallelism and ZeRO sum the same numbers in the same order.
// (`algorithm` "" leaves the choice to the provider table: a compressed operation needs it.)
std::shared_ptr<comm::Communicator> group(std::shared_ptr<store::Store> store, int rank,
                                          const std::string& algorithm = "shared") {
  comm::GroupOptions options;
  options.transport = "shm";
  options.algorithm = algorithm;
  options.timeout = Millis(20000);
  return comm::Communicator::create(std::move(store), rank, kRanks, options);
}

// Rank 0's parameters after kSteps of plain data parallelism (DataParallel, the fused optimizer,
// LibTorch's clipping): the reference.
std::vector<torch::Tensor> dataParallelRun(const std::vector<StepData>& steps,
                                           const OptimSpec& optim, double clip) {
  std::vector<torch::Tensor> result;
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(kRanks, [&](int rank) {
    auto comm = group(store, rank);
    auto model = makeModel(smallMlp());
    DataParallel parallel(model, comm);
    parallel.broadcastParameters();
    auto optimizer = makeOptimizer(model->parameters(), optim);
    for (int s = 0; s < kSteps; ++s) {
      parallel.clearGradients();
      runMicroBatches(*model, steps[size_t(s)], kSplits[size_t(s) % kSplits.size()], rank,
                      [&] { parallel.armLastBackward(); });
      parallel.finish(1);
      if (clip > 0) clipGradNorm(model->parameters(), clip);
      applyLr(*optimizer, optim.lr);
      optimizer->step();
    }
    if (rank == 0)
      for (const auto& p : flatParameters(*model)) result.push_back(p.detach().clone());
  });
  return result;
}

// Each rank's engine options beyond stage, shards and optimizer.
using AdjustOptions = std::function<void(ZeroOptions&, int rank)>;

// Called on every rank after step s (0-based) of a run.
using AfterStep = std::function<void(ZeroParallel&, int s, int rank)>;

// What a step runs after its micro-batches: by default finish() then step().
using EndStep = std::function<void(ZeroParallel&, double lr, double clip)>;

// Every rank's parameters after kSteps under ZeRO `stage` with kShards.
std::vector<std::vector<torch::Tensor>> zeroRun(int stage, const std::vector<StepData>& steps,
                                                const OptimSpec& optim, double clip,
                                                const AdjustOptions& adjust = {},
                                                const std::string& algorithm = "shared",
                                                const AfterStep& afterStep = {},
                                                const EndStep& endStep = {}) {
  std::vector<std::vector<torch::Tensor>> result(kRanks);
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(kRanks, [&](int rank) {
    auto comm = group(store, rank, algorithm);
    auto model = makeModel(smallMlp());
    if (rank > 0) {  // the constructor's broadcast must make them rank 0's
      torch::NoGradGuard noGrad;
      for (auto& p : model->parameters()) p.add_(0.5);
    }
    ZeroOptions options = zeroOptions(stage, kShards, optim);
    if (adjust) adjust(options, rank);
    ZeroParallel zero(model, comm, options);
    EXPECT_EQ(zero.offload(), options.offload);
    EXPECT_EQ(zero.layout().shardSizes(), kShards);
    for (int s = 0; s < kSteps; ++s) {
      const Split& split = kSplits[size_t(s) % kSplits.size()];
      int64_t most = 0;
      for (int r = 0; r < kRanks; ++r) most = std::max(most, microBatches(split, r));
      zero.beginStep(microBatches(split, rank), most);
      runMicroBatches(*model, steps[size_t(s)], split, rank, [&] { zero.armLastBackward(); });
      if (endStep) {
        endStep(zero, optim.lr, clip);
      } else {
        zero.finish();
        zero.step(optim.lr, clip);
      }
      if (afterStep) afterStep(zero, s, rank);
    }
    result[size_t(rank)] = zero.gatherParameters();
  });
  return result;
}

double relativeDifference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1e-12, b.abs().max().item<double>());
}

// Rank 0's parameters go to `rank0` when given.
void expectLikeDataParallel(int stage, const std::string& optimizer, double clip,
                            const std::vector<Offload>& offloads = {}, bool prefetch = true,
                            std::vector<torch::Tensor>* rank0 = nullptr) {
  torch::set_num_threads(1);
  const auto steps = makeSteps();
  const OptimSpec optim = optimizerNamed(optimizer);
  const auto reference = dataParallelRun(steps, optim, clip);
  const auto initial = flatParameters(*makeModel(smallMlp()));
  const auto ranks = zeroRun(stage, steps, optim, clip, [&](ZeroOptions& o, int rank) {
    if (!offloads.empty()) o.offload = offloads[size_t(rank)];
    o.prefetch = prefetch;
  });
  std::string what = "stage " + std::to_string(stage) + ", " + optimizer +
                     (clip > 0 ? ", clipped" : "") +
                     (stage == 3 && !prefetch ? ", no prefetch" : "");
  for (Offload o : offloads) what += std::string(", ") + offloadName(o);
  ASSERT_EQ(reference.size(), initial.size());
  for (size_t k = 0; k < reference.size(); ++k) {
    EXPECT_FALSE(torch::equal(reference[k], initial[k])) << "tensor " << k << " never moved";
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_EQ(ranks[size_t(r)].size(), reference.size());
      const auto& mine = ranks[size_t(r)][k];
      if (clip > 0)
        EXPECT_LE(relativeDifference(mine, reference[k]), 1e-6)
            << what << ": rank " << r << " tensor " << k;
      else
        EXPECT_TRUE(torch::equal(mine, reference[k]))
            << what << ": rank " << r << " tensor " << k << " differs by "
            << relativeDifference(mine, reference[k]);
      EXPECT_TRUE(torch::equal(mine, ranks[0][k])) << what << ": rank " << r << " tensor " << k;
    }
  }
  if (rank0) *rank0 = ranks.at(0);
}

TEST(ZeroParallel, Stage1IsBitwiseDataParallel) {
  expectLikeDataParallel(1, "sgd", 0);
  expectLikeDataParallel(1, "adam", 0);
}

// The overlapped step updates and all-gathers the parameters in groups of tensors as their
// reduce-scatters end: one group per tensor (the empty shard's rank updates nothing in each),
// groups of two to four tensors whose boundary falls inside rank 1's shard, and one group.
TEST(ZeroParallel, Stage1WithTheOverlappedUpdateIsBitwiseDataParallel) {
  torch::set_num_threads(1);
  const auto steps = makeSteps();
  // smallMlp's tensors in reverse flat order: 5, 55, 11, 187, 17, 221 elements.
  const std::vector<std::pair<int64_t, int>> groupings = {{1, 6}, {200, 2}, {1 << 16, 1}};
  for (const std::string optimizer : {"sgd", "adam"}) {
    const OptimSpec optim = optimizerNamed(optimizer);
    const auto reference = dataParallelRun(steps, optim, 0);
    for (const auto& [atLeast, groups] : groupings) {
      const auto ranks = zeroRun(
          1, steps, optim, 0, [&](ZeroOptions& o, int) { o.groupElements = atLeast; }, "shared", {},
          [&](ZeroParallel& zero, double lr, double clip) {
            ASSERT_TRUE(zero.overlapsUpdate(clip));
            const OverlappedStep spent =
                zero.finishAndUpdate(lr, [](const std::function<void()>& work) {
                  work();
                  return 0.25;  // one segment per group, alike on every rank
                });
            EXPECT_EQ(spent.updateSeconds, 0.25 * groups);
            EXPECT_GE(spent.waitedSeconds, 0.0);
          });
      for (int r = 0; r < kRanks; ++r)
        for (size_t k = 0; k < reference.size(); ++k)
          EXPECT_TRUE(torch::equal(ranks[size_t(r)][k], reference[k]))
              << optimizer << ", groups of " << atLeast << ": rank " << r << " tensor " << k
              << " differs by " << relativeDifference(ranks[size_t(r)][k], reference[k]);
    }
  }
}

TEST(ZeroParallel, Stage2IsBitwiseDataParallel) {
  expectLikeDataParallel(2, "sgd", 0);
  expectLikeDataParallel(2, "adam", 0);
}

// With and without prefetching the next block: the same collectives, issued in another order.
TEST(ZeroParallel, Stage3IsBitwiseDataParallelWithAndWithoutPrefetch) {
  for (const std::string optimizer : {"sgd", "adam"}) {
    std::vector<torch::Tensor> prefetched, plain;
    expectLikeDataParallel(3, optimizer, 0, {}, true, &prefetched);
    expectLikeDataParallel(3, optimizer, 0, {}, false, &plain);
    ASSERT_EQ(prefetched.size(), plain.size());
    for (size_t k = 0; k < plain.size(); ++k)
      EXPECT_TRUE(torch::equal(prefetched[k], plain[k])) << optimizer << " tensor " << k;
  }
}

// Offloading moves the shard's state to host memory; the arithmetic is the same loops on the same
// numbers, so the result stays bitwise data parallelism's, with ranks offloading differently.
TEST(ZeroParallel, OffloadedShardsTrainBitwiseAsDataParallel) {
  const Offload none = Offload::kNone, state = Offload::kOptimizer, all = Offload::kParameters;
  expectLikeDataParallel(1, "adam", 0, {state, none, state});
  expectLikeDataParallel(2, "sgd", 0, {none, state, state});
  expectLikeDataParallel(3, "adam", 0, {all, state, none});
  expectLikeDataParallel(3, "sgd", 0, {none, all, all});
}

// Compressed gradients: fp8-e5m2 (3 significant bits) on every reduce-scatter. Error feedback
// keeps what each encoding lost for the next step, so the run stays much closer to exact data
// parallelism than without it; every rank still ends with the same parameters, and keeps one
// residual float per parameter.
TEST(ZeroParallel, CompressedGradientsWithErrorFeedbackStayCloseToExactDataParallel) {
  torch::set_num_threads(1);
  const auto steps = makeSteps();
  OptimSpec optim = optimizerNamed("sgd");
  optim.momentum = 0;
  const auto exact = dataParallelRun(steps, optim, 0);
  const int64_t psi = 496;  // smallMlp's parameters
  auto distance = [&](const std::vector<torch::Tensor>& params) {
    double squares = 0, norm = 0;
    for (size_t k = 0; k < exact.size(); ++k) {
      squares += (params[k] - exact[k]).pow(2).sum().item<double>();
      norm += exact[k].pow(2).sum().item<double>();
    }
    return std::sqrt(squares / norm);
  };
  for (int stage : {1, 2, 3}) {
    double withFeedback = 0, without = 0;
    for (bool feedback : {true, false}) {
      std::vector<int64_t> residuals(kRanks, -1);
      const auto ranks = zeroRun(
          stage, steps, optim, 0,
          [&](ZeroOptions& o, int) {
            o.compression = comm::CompressionPolicy(comm::Compression::Fp8E5M2, 16, /*minBytes=*/0);
            o.errorFeedback = feedback;
          },
          /*algorithm=*/"");
      for (int r = 0; r < kRanks; ++r)
        for (size_t k = 0; k < exact.size(); ++k)
          EXPECT_TRUE(torch::equal(ranks[size_t(r)][k], ranks[0][k]))
              << "stage " << stage << " rank " << r << " tensor " << k;
      (feedback ? withFeedback : without) = distance(ranks[0]);
    }
    EXPECT_GT(without, 0) << "stage " << stage << ": fp8 lost nothing?";
    EXPECT_LT(withFeedback, 0.5 * without) << "stage " << stage;
  }
  // Residuals: every tensor's whole gradient, on every rank (the communication category).
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(kRanks, [&](int rank) {
    ZeroOptions options = zeroOptions(3, kShards, optim);
    options.compression = comm::CompressionPolicy(comm::Compression::BF16, 256, 0);
    options.errorFeedback = true;
    ZeroParallel zero(makeModel(smallMlp()), group(store, rank, ""), options);
    EXPECT_EQ(zero.residualElements(), psi) << "rank " << rank;
  });
}

// Shards moved twice during the run (the empty shard from rank 0 to rank 2, then to rank 1, the
// boundaries into other tensors), one rank's optimizer state offloaded and, under stage 3, another
// rank's parameters: what the shards hold moves with them, and since the updates are elementwise
// and the shared-memory collectives sum in rank order, the run stays bitwise data parallelism's.
TEST(ZeroParallel, MovedShardsTrainBitwiseAsDataParallel) {
  torch::set_num_threads(1);
  const auto steps = makeSteps();
  const std::vector<std::vector<int64_t>> moves = {{208, 288, 0}, {96, 0, 400}};
  for (int stage : {1, 2, 3})
    for (const std::string optimizer : {"sgd", "adam"}) {
      const OptimSpec optim = optimizerNamed(optimizer);
      const auto reference = dataParallelRun(steps, optim, 0);
      const auto ranks = zeroRun(
          stage, steps, optim, 0,
          [&](ZeroOptions& o, int rank) {
            if (rank == 1) o.offload = Offload::kOptimizer;
            if (rank == 2 && stage == 3) o.offload = Offload::kParameters;
          },
          "shared",
          [&](ZeroParallel& zero, int s, int rank) {
            if (s != 3 && s != 7) return;
            // The second move in chunks of 64 elements: some keep their owners (copied
            // locally), others are gathered, a shard spanning several.
            const auto& sizes = moves[s == 3 ? 0 : 1];
            zero.reshard(sizes, s == 3 ? int64_t(1) << 20 : 64);
            EXPECT_EQ(zero.layout().shardSizes(), sizes);
            EXPECT_EQ(zero.ownShard().size(), sizes[size_t(rank)]);
            for (const auto& held : zero.shardState())
              EXPECT_EQ(held.numel(), zero.ownShard().size());
          });
      for (size_t k = 0; k < reference.size(); ++k)
        for (int r = 0; r < kRanks; ++r)
          EXPECT_TRUE(torch::equal(ranks[size_t(r)][k], reference[k]))
              << "stage " << stage << ", " << optimizer << ": rank " << r << " tensor " << k
              << " differs by " << relativeDifference(ranks[size_t(r)][k], reference[k]);
    }
}

// A move needs sizes that fit the layout, and none while error feedback keeps residuals.
TEST(ZeroParallel, AMoveItCannotMakeIsRefused) {
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(kRanks, [&](int rank) {
    ZeroOptions options = zeroOptions(2, kShards, optimizerNamed("sgd"));
    ZeroParallel zero(makeModel(smallMlp()), group(store, rank), options);
    EXPECT_THROW(zero.reshard({0, 160, 320}), ConfigError);  // 480 of 496
    EXPECT_THROW(zero.reshard({8, 152, 336}), ConfigError);  // a boundary off the alignment
    EXPECT_THROW(zero.reshard({496}), ConfigError);          // one shard for three ranks
    EXPECT_EQ(zero.layout().shardSizes(), kShards);
  });
  auto compressed = std::make_shared<store::MemoryStore>();
  test::runRanks(kRanks, [&](int rank) {
    ZeroOptions options = zeroOptions(1, kShards, optimizerNamed("sgd"));
    options.compression = comm::CompressionPolicy(comm::Compression::BF16, 256, 0);
    options.errorFeedback = true;
    ZeroParallel zero(makeModel(smallMlp()), group(compressed, rank, ""), options);
    EXPECT_THROW(zero.reshard({160, 160, 176}), ConfigError);
    EXPECT_EQ(zero.layout().shardSizes(), kShards);
  });
}

// Clipping needs the global norm: a sum of the shards' squares in float64 against LibTorch's
// float32 norm of norms, so the scale differs in its last bits.
TEST(ZeroParallel, ClippedStagesFollowDataParallelClosely) {
  for (int stage : {1, 2, 3}) {
    expectLikeDataParallel(stage, "sgd", 0.05);
    expectLikeDataParallel(stage, "adam", 0.05);
  }
  expectLikeDataParallel(3, "adam", 0.05, {}, /*prefetch=*/false);
}

// ---- Stage 3's collective sequence ---------------------------------------------------------

// A group that logs each collective as it is issued ("G<elements>" an all-gather, "RS<elements>"
// a reduce-scatter, "AR", "B"), then issues it on the group it wraps.
class RecordingGroup : public comm::Communicator {
 public:
  RecordingGroup(std::shared_ptr<comm::Communicator> inner, std::vector<std::string>* log)
      : inner_(std::move(inner)), log_(log) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* transportName() const override { return inner_->transportName(); }
  comm::Transport& transport() override { return inner_->transport(); }
  const comm::GroupOptions& groupOptions() const override { return inner_->groupOptions(); }
  std::shared_ptr<comm::Communicator> split(int color, int key,
                                            const comm::GroupOptions& options) override {
    return inner_->split(color, key, options);
  }
  comm::WorkPtr allreduce(const void* in, void* out, size_t count, DType dtype, comm::ReduceOp op,
                          const comm::OpPolicy& policy) override {
    log_->push_back("AR");
    return inner_->allreduce(in, out, count, dtype, op, policy);
  }
  comm::WorkPtr reduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                              DType dtype, comm::ReduceOp op,
                              const comm::OpPolicy& policy) override {
    log_->push_back("RS" + std::to_string(sum(counts)));
    return inner_->reduceScatter(in, out, counts, dtype, op, policy);
  }
  comm::WorkPtr allgather(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                          const comm::OpPolicy& policy) override {
    log_->push_back("G" + std::to_string(sum(counts)));
    return inner_->allgather(in, out, counts, dtype, policy);
  }
  comm::WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override {
    log_->push_back("B");
    return inner_->broadcast(buf, count, dtype, root);
  }
  comm::WorkPtr barrier() override { return inner_->barrier(); }
  comm::WorkPtr send(const void* buf, size_t count, DType dtype, int dst, uint64_t tag) override {
    return inner_->send(buf, count, dtype, dst, tag);
  }
  comm::WorkPtr recv(void* buf, size_t count, DType dtype, int src, uint64_t tag) override {
    return inner_->recv(buf, count, dtype, src, tag);
  }
  const comm::Codec* feedbackCodec(comm::OpKind kind, DType dtype, comm::ReduceOp op, size_t count,
                                   const comm::OpPolicy& policy) const override {
    return inner_->feedbackCodec(kind, dtype, op, count, policy);
  }
  std::string providerFor(comm::OpKind kind, DType dtype, comm::ReduceOp op, size_t count,
                          const comm::OpPolicy& policy) const override {
    return inner_->providerFor(kind, dtype, op, count, policy);
  }
  uint64_t bytesSent() const override { return inner_->bytesSent(); }
  uint64_t bytesReceived() const override { return inner_->bytesReceived(); }
  void abort(const std::string& reason) override { inner_->abort(reason); }

 private:
  static size_t sum(const std::vector<size_t>& counts) {
    size_t total = 0;
    for (size_t c : counts) total += c;
    return total;
  }
  std::shared_ptr<comm::Communicator> inner_;
  std::vector<std::string>* log_;
};

// Three linear blocks of 15, 20 and 12 elements (weights 12, 15, 10; biases 3, 5, 2), each
// logging "run<b>" when it computes (forward and recompute) and throwing once when told to.
class LoggedBlocks : public BlockModel {
 public:
  LoggedBlocks(std::vector<std::string>* log, const bool* throwInBlock1) {
    const std::vector<int64_t> widths = {4, 3, 5, 2};
    for (size_t b = 0; b + 1 < widths.size(); ++b) {
      auto layer =
          register_module("fc" + std::to_string(b), torch::nn::Linear(widths[b], widths[b + 1]));
      {
        torch::NoGradGuard noGrad;
        for (auto& p : layer->parameters()) p.copy_(torch::linspace(-1, 1, p.numel()).view_as(p));
      }
      addBlock("fc" + std::to_string(b), layer->parameters(),
               [layer, log, throwInBlock1, b](const torch::Tensor& x) {
                 log->push_back("run" + std::to_string(b));
                 if (b == 1 && *throwInBlock1) throw std::runtime_error("block 1 fails");
                 return torch::tanh(layer->forward(x));
               });
    }
  }

 private:
  torch::Tensor prologue(torch::Tensor x) override { return x; }
};

std::string joined(const std::vector<std::string>& log, bool withRuns) {
  std::string out;
  for (const auto& entry : log)
    if (withRuns || entry.rfind("run", 0) != 0) out += (out.empty() ? "" : " ") + entry;
  return out;
}

// Each rank's log of one step (rank 0: two micro-batches, rank 1: one, rank 2: no samples), then
// an evaluation (rank 0 computes, the others run forwardWithoutSamples), then gatherParameters.
std::vector<std::vector<std::string>> sequenceLogs(bool prefetch, bool throwFirst = false) {
  torch::set_num_threads(1);
  std::vector<std::vector<std::string>> logs(kRanks);
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(kRanks, [&](int rank) {
    auto& log = logs[size_t(rank)];
    bool throwInBlock1 = throwFirst;
    auto comm = std::make_shared<RecordingGroup>(group(store, rank), &log);
    auto model = std::make_shared<LoggedBlocks>(&log, &throwInBlock1);
    ZeroOptions options = zeroOptions(3, {16, 0, 31}, optimizerNamed("sgd"));
    options.prefetch = prefetch;
    ZeroParallel zero(model, comm, options);
    const auto input = torch::linspace(-2, 2, 8 * 4).view({8, 4}) + double(rank);
    if (throwFirst) {  // every rank's forward fails in block 1, with block 2's gather in flight
      zero.beginStep(1, 1);
      EXPECT_THROW(model->forward(input), std::runtime_error);
      throwInBlock1 = false;
    }
    log.clear();
    const int64_t mine = rank == 0 ? 2 : rank == 1 ? 1 : 0;
    zero.beginStep(mine, 2);
    for (int64_t j = 0; j < mine; ++j) {
      if (j + 1 == mine) zero.armLastBackward();
      model->forward(input.slice(0, 4 * j, 4 * j + 4)).sum().backward();
    }
    zero.finish();
    zero.step(0.1, 0);
    {
      torch::NoGradGuard noGrad;
      if (rank == 0)
        model->forward(input);
      else
        zero.forwardWithoutSamples();
    }
    zero.gatherParameters();
  });
  return logs;
}

TEST(ZeroSequence, PrefetchIssuesTheNextBlocksGatherBeforeABlockRuns) {
  const auto logs = sequenceLogs(true);
  // docs/zero.md's order: forward G0 G1 run0 G2 run1 run2; backward G2 G1 run2 R2 G0 run1 R1
  // run0 R0 (the reduce-scatters in the armed micro-batch only).
  const std::string forward = "G15 G20 run0 G12 run1 run2";
  const std::string expected = forward + " G12 G20 run2 G15 run1 run0 " + forward +
                               " G12 G20 run2 RS10 RS2 G15 run1 RS15 RS5 run0 RS12 RS3 " + forward +
                               " G15 G20 G12";
  EXPECT_EQ(joined(logs[0], true), expected);
  for (int r = 1; r < kRanks; ++r)
    EXPECT_EQ(joined(logs[size_t(r)], false), joined(logs[0], false)) << "rank " << r;
}

TEST(ZeroSequence, WithoutPrefetchEachGatherComesJustBeforeItsBlock) {
  const auto logs = sequenceLogs(false);
  const std::string forward = "G15 run0 G20 run1 G12 run2";
  const std::string expected = forward + " G12 run2 G20 run1 G15 run0 " + forward +
                               " G12 run2 RS10 RS2 G20 run1 RS15 RS5 G15 run0 RS12 RS3 " + forward +
                               " G15 G20 G12";
  EXPECT_EQ(joined(logs[0], true), expected);
  for (int r = 1; r < kRanks; ++r)
    EXPECT_EQ(joined(logs[size_t(r)], false), joined(logs[0], false)) << "rank " << r;
}

// A pass that throws leaves block 2's prefetch in flight: the next step waits for it and frees
// its buffer first, so its sequence is a clean one's.
TEST(ZeroSequence, APassThatThrowsLeavesNothingInFlight) {
  const auto clean = sequenceLogs(true);
  const auto afterThrow = sequenceLogs(true, /*throwFirst=*/true);
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(joined(afterThrow[size_t(r)], true), joined(clean[size_t(r)], true)) << "rank " << r;
}

// Stage 1's overlapped step: the reduce-scatters issued in backward (reverse flat order), then
// each group's update and all-gather, in the same order; rank 0, without samples, issues the
// same sequence from finishAndUpdate.
TEST(ZeroSequence, Stage1UpdatesAndGathersEachGroupAfterItsReduceScatters) {
  torch::set_num_threads(1);
  std::vector<std::vector<std::string>> logs(kRanks);
  const StepData data = makeSteps().front();
  const Split& split = kSplits[1];  // {0, 12, 5} samples in {0, 2, 1} micro-batches
  auto store = std::make_shared<store::MemoryStore>();
  test::runRanks(kRanks, [&](int rank) {
    auto& log = logs[size_t(rank)];
    auto comm = std::make_shared<RecordingGroup>(group(store, rank), &log);
    auto model = makeModel(smallMlp());
    ZeroOptions options = zeroOptions(1, kShards, optimizerNamed("adam"));
    options.groupElements = 200;
    ZeroParallel zero(model, comm, options);
    log.clear();
    zero.beginStep(microBatches(split, rank), 2);
    runMicroBatches(*model, data, split, rank, [&] { zero.armLastBackward(); });
    zero.finishAndUpdate(0.01, [&](const std::function<void()>& work) {
      log.push_back("update");
      work();
      return 0.0;
    });
  });
  const std::string expected = "RS5 RS55 RS11 RS187 RS17 RS221 update G258 update G238";
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(joined(logs[size_t(r)], true), expected) << "rank " << r;
}

TEST(ZeroParallel, RefusesWhatItCannotShard) {
  auto store = std::make_shared<store::MemoryStore>();
  auto comm = comm::Communicator::create(store, 0, 1, comm::GroupOptions{});
  OptimSpec optim;
  EXPECT_THROW(ZeroParallel(makeModel(smallMlp()), comm, zeroOptions(4, {}, optim)), ConfigError);
  EXPECT_THROW(ZeroParallel(makeModel(smallMlp()), comm, zeroOptions(1, {480, 16}, optim)),
               ConfigError);  // two shards for a group of one
  // Stages 1 and 2 keep every parameter on the device: none to offload.
  EXPECT_THROW(
      ZeroParallel(makeModel(smallMlp()), comm, zeroOptions(2, {}, optim, Offload::kParameters)),
      ConfigError);
}

// Stages 1 and 2 reduce a tensor's gradient as soon as autograd has accumulated it in the last
// backward: a second backward after armLastBackward() would add into a gradient already reduced
// (stage 1: while its reduce-scatter may still be reading it), so it is refused, not lost.
TEST(ZeroParallel, ASecondBackwardAfterArmingIsRefused) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE(stage);
    auto store = std::make_shared<store::MemoryStore>();
    auto comm = comm::Communicator::create(store, 0, 1, comm::GroupOptions{});
    auto model = makeModel(smallMlp());
    ZeroParallel zero(model, comm, zeroOptions(stage, {}, optimizerNamed("sgd")));
    const auto input = torch::linspace(-1, 1, 4 * 13).view({4, 13});
    zero.beginStep(1, 1);
    zero.armLastBackward();
    model->forward(input).sum().backward();
    try {
      model->forward(input).sum().backward();
      ADD_FAILURE() << "a second backward was taken";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("accumulated again after its reduce-scatter"),
                std::string::npos)
          << e.what();
    }
  }
}

// ---- Rank processes: accounted memory
// ------------------------------------------------------------

const char* kBaseConfig = R"(
[data]
name = "synthetic"
samples = 512
test_samples = 48
features = 64
classes = 4
[train]
global_batch = 12
steps = 3
optimizer = "adam"
lr = 0.001
log_every = 0
eval_every = 0
[balance]
mode = "static"
[[devices]]
name = "big"
[[devices]]
name = "small1"
[[devices]]
name = "small2"
)";

RunConfig configWith(const std::vector<std::string>& sets) {
  return parseConfig(kBaseConfig, "zero-test", sets);
}

enum RankEnd { kTrained = 0, kOutOfMemory = 10, kPeerAborted = 11, kOtherError = 12 };

std::vector<std::string> splitSets(const std::string& text) {
  std::vector<std::string> sets;
  std::stringstream in(text);
  for (std::string set; std::getline(in, set, ';');)
    if (!set.empty()) sets.push_back(set);
  return sets;
}

// The role of this process when a test below started it as a rank (HETRA_ZEROTEST_* set): it
// trains the config and writes its exit reason and, when it trained, the ledger's peaks.
TEST(ZeroRankProcess, Rank) {
  const char* rankText = std::getenv("HETRA_ZEROTEST_RANK");
  if (!rankText) GTEST_SKIP() << "runs only as a rank of the process tests";
  const int rank = std::atoi(rankText);
  const std::string dir = std::getenv("HETRA_ZEROTEST_DIR");
  const RunConfig config = configWith(splitSets(std::getenv("HETRA_ZEROTEST_SETS")));
  const bool customModel = std::getenv("HETRA_ZEROTEST_CUSTOM") != nullptr;
  std::ofstream out(dir + "/rank" + std::to_string(rank) + ".txt");
  int code = kTrained;
  try {
    auto store = std::make_shared<store::FileStore>(dir + "/store");
    comm::GroupOptions options;
    options.timeout = Millis(60000);
    auto comm = comm::Communicator::create(store, rank, kRanks, options);
    TrainerOptions trainer;
    // A program's own model has no footprint: no micro-batch bound keeps it under the cap, the
    // allocator is what stops it.
    const ModelSpec spec = modelSpecOf(config, datasetGeometry(config.data));
    if (customModel) trainer.makeModel = [spec] { return makeModel(spec); };
    train(config, comm, trainer);
    comm->barrier()->wait();
    const auto usage = device::MemoryLedger::process().usage();
    out << "trained\n" << usage.devicePeak << "\n";
    for (size_t c = 0; c < device::kMemoryCategories; ++c) out << usage.peak[c] << "\n";
  } catch (const DeviceOutOfMemoryError& e) {
    out << "out of memory\n" << e.device() << "\n" << e.what() << "\n";
    code = kOutOfMemory;
  } catch (const PeerAbortedError& e) {
    out << "peer aborted\n" << e.what() << "\n";
    code = kPeerAborted;
  } catch (const std::exception& e) {
    out << "error\n" << e.what() << "\n";
    code = kOtherError;
  }
  out.close();
  std::_Exit(code);
}

fs::path freshDir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("hetra-zero-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<std::string> linesOf(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct RankOutcome {
  int code = -1;                   // RankEnd, or -1 for a rank killed after its deadline
  std::vector<std::string> lines;  // what it wrote
};

// Runs the three ranks of `sets` as processes of this binary; a rank still running after three
// minutes is killed (a hang) and reported as -1.
std::vector<RankOutcome> runRankProcesses(const std::string& name,
                                          const std::vector<std::string>& sets,
                                          bool customModel = false) {
  const fs::path dir = freshDir(name);
  std::string joined;
  for (const auto& s : sets) joined += s + ";";
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kRanks; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("HETRA_ZEROTEST_RANK", std::to_string(rank).c_str(), 1);
      setenv("HETRA_ZEROTEST_DIR", dir.c_str(), 1);
      setenv("HETRA_ZEROTEST_SETS", joined.c_str(), 1);
      if (customModel) setenv("HETRA_ZEROTEST_CUSTOM", "1", 1);
      execl("/proc/self/exe", "test_data_parallel_zero", "--gtest_filter=ZeroRankProcess.Rank",
            static_cast<char*>(nullptr));
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<RankOutcome> outcomes(kRanks);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  for (int r = 0; r < kRanks; ++r) {
    int status = 0;
    while (waitpid(pids[size_t(r)], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pids[size_t(r)], SIGKILL);
        waitpid(pids[size_t(r)], &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (status != -1 && WIFEXITED(status)) outcomes[size_t(r)].code = WEXITSTATUS(status);
    outcomes[size_t(r)].lines = linesOf(dir / ("rank" + std::to_string(r) + ".txt"));
  }
  fs::remove_all(dir);
  return outcomes;
}

std::string lastLine(const RankOutcome& o) {
  return o.lines.empty() ? "(nothing written)" : o.lines.back();
}

// Parameters, gradients and optimizer state at their peaks: what the formula accounts for.
int64_t accountedPeak(const RankOutcome& o) {
  const auto peak = [&](MemoryCategory c) { return std::stoll(o.lines.at(2 + size_t(c))); };
  return peak(MemoryCategory::kParameters) + peak(MemoryCategory::kGradients) +
         peak(MemoryCategory::kOptimizerState);
}

const std::vector<std::string> kFormulaModel = {"model.hidden=[128, 128, 128, 128, 128, 128]",
                                                "devices.0.memory=64MiB", "devices.1.memory=16MiB",
                                                "devices.2.memory=8MiB"};

// docs/zero.md, fp32 with Adam (K = 8 bytes of state per parameter), psi parameters, f_i rank i's
// share of them, B the largest block's parameters: DP (8+K) psi; Z1 8 psi + K psi f_i;
// Z2 4 psi + (4+K) psi f_i plus at most 4 B (one block's gradients until their reduce-scatter);
// Z3 (8+K) psi f_i + 4 P with P the largest two adjacent blocks' parameters (the gathered block and
// the next one, prefetched), 4 B without prefetch. Each rank's accounted peak within 5% of it; the
// sum over ranks below data parallelism's.
TEST(ZeroMemory, AccountedPeaksFollowTheFormula) {
  const RunConfig base = configWith(kFormulaModel);
  auto model = makeModel(modelSpecOf(base, datasetGeometry(base.data)));
  const double psi = double(parameterCount(*model));
  double largestBlock = 0, largestPair = 0, previous = 0;
  for (size_t b = 0; b < dynamic_cast<BlockModel&>(*model).blockCount(); ++b) {
    double elements = 0;
    for (const auto& p : dynamic_cast<BlockModel&>(*model).blockParameters(b))
      elements += double(p.numel());
    largestBlock = std::max(largestBlock, elements);
    largestPair = std::max(largestPair, elements + previous);
    previous = elements;
  }
  constexpr double K = 8;
  double dataParallelSum = 0, dataParallelDeviceSum = 0;
  // Stage 4: stage 3 without prefetch.
  for (int run = 0; run <= 4; ++run) {
    const int stage = std::min(run, 3);
    const bool prefetch = run == 3;
    auto sets = kFormulaModel;
    sets.push_back("zero.stage=" + std::to_string(stage));
    if (stage == 3) sets.push_back(std::string("zero.prefetch=") + (prefetch ? "true" : "false"));
    const RunConfig config = configWith(sets);
    std::vector<int64_t> shards(kRanks, 0);
    if (stage > 0) {
      auto planned = makeModel(modelSpecOf(config, datasetGeometry(config.data)));
      const auto footprint = estimateFootprint(modelSpecOf(config, datasetGeometry(config.data)));
      shards = planShards(config, shardedBytesOf(config, *planned), int64_t(psi),
                          footprint.bytesPerSample);
      EXPECT_GT(shards[0], shards[1]);  // memory shards: the big device holds the most
      EXPECT_GT(shards[1], shards[2]);
    }
    const auto outcomes = runRankProcesses("formula" + std::to_string(run), sets);
    const std::string what = "stage " + std::to_string(stage) + (run == 4 ? " no prefetch" : "");
    double sum = 0, deviceSum = 0;
    for (int r = 0; r < kRanks; ++r) {
      const auto& o = outcomes[size_t(r)];
      ASSERT_EQ(o.code, kTrained) << what << " rank " << r << ": " << lastLine(o);
      const double f = double(shards[size_t(r)]) / psi;
      double low = 0, high = 0;
      switch (stage) {
        case 0:
          low = high = (8 + K) * psi;
          break;
        case 1:
          low = high = 8 * psi + K * psi * f;
          break;
        case 2:
          low = 4 * psi + (4 + K) * psi * f;
          high = low + 4 * largestBlock;
          break;
        default:
          low = high = (8 + K) * psi * f + 4 * (prefetch ? largestPair : largestBlock);
      }
      const double accounted = double(accountedPeak(o));
      EXPECT_GE(accounted, 0.95 * low) << what << " rank " << r;
      EXPECT_LE(accounted, 1.05 * high) << what << " rank " << r;
      sum += accounted;
      deviceSum += double(std::stoll(o.lines.at(1)));
    }
    if (stage == 0) {
      dataParallelSum = sum;
      dataParallelDeviceSum = deviceSum;
    } else {
      EXPECT_LT(sum, dataParallelSum) << what;
      EXPECT_LT(deviceSum, dataParallelDeviceSum) << what;
    }
  }
}

// ---- The plan
// ------------------------------------------------------------------------------------

// Memory shards follow what each device keeps per shard element: a device that offloads its
// optimizer state holds twice Adam's elements in the same headroom, and one that offloads
// everything counts with the largest share of the others.
TEST(ZeroPlan, OffloadingDevicesTakeShardsByWhatTheyKeepOnTheDevice) {
  auto sets = kFormulaModel;
  sets.insert(sets.end(),
              {"zero.stage=3", "devices.1.offload=optimizer", "devices.2.offload=parameters"});
  const RunConfig config = configWith(sets);
  const ModelSpec spec = modelSpecOf(config, datasetGeometry(config.data));
  auto model = makeModel(spec);
  const ShardedBytes bytes = shardedBytesOf(config, *model);
  EXPECT_EQ(offloadOf(config, 0), Offload::kNone);
  EXPECT_EQ(offloadOf(config, 1), Offload::kOptimizer);
  EXPECT_EQ(offloadOf(config, 2), Offload::kParameters);
  // Adam under stage 3: 4 bytes of parameters, 4 of gradients, 8 of moments per shard element.
  EXPECT_EQ(bytes.onDevicePerElement(Offload::kNone), 16);
  EXPECT_EQ(bytes.onDevicePerElement(Offload::kOptimizer), 8);
  EXPECT_EQ(bytes.onDevicePerElement(Offload::kParameters), 0);
  const int64_t perSample = estimateFootprint(spec).bytesPerSample;
  const double held0 = double(64 * 1048576 - bytes.buffers - perSample) / 16;
  const double held1 = double(16 * 1048576 - bytes.buffers - perSample) / 8;
  const auto shards = planShards(config, bytes, bytes.psi, perSample);
  EXPECT_EQ(shards, proportionalShards(bytes.psi, {held0, held1, std::max(held0, held1)}));
  const auto caps = shardedRankCaps(config, bytes, shards, perSample);
  const auto rows = shardPlanRows(config, bytes, shards, caps);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1].deviceBytes, bytes.buffers + 8 * shards[1]);
  EXPECT_EQ(rows[1].offloadedBytes, 8 * shards[1]);
  EXPECT_EQ(rows[2].deviceBytes, bytes.buffers);
  EXPECT_EQ(rows[2].offloadedBytes, 16 * shards[2]);
  EXPECT_EQ(rows[0].offloadedBytes, 0);
  EXPECT_EQ(rows[2].capBytes, 8 * 1048576);
  // Shards that follow speed grow at most to the plan's on a capped device that keeps shard bytes
  // on it (0: all, 1: its parameters and gradients); device 2 keeps none there, and device 0
  // without its cap (below) has none: both unbounded.
  EXPECT_EQ(memoryBounds(config, bytes, shards),
            (std::vector<int64_t>{shards[0], shards[1], kUnboundedShard}));
  auto uncapped = sets;
  uncapped.push_back("devices.0.memory=\"unlimited\"");
  const RunConfig withoutCap = configWith(uncapped);
  EXPECT_EQ(memoryBounds(withoutCap, bytes, shards)[0], kUnboundedShard);
}

// ---- Rank processes: a model larger than the smallest device
// -------------------------------------

// 215K parameters: Adam's 16 bytes each under data parallelism (3.4 MB), and a third of that plus
// a gathered block under even ZeRO-3 shards (1.15 MB + 0.5 MB), do not fit a 1.5 MiB device; its
// small memory shard does.
const std::vector<std::string> kLargeModel = {"model.hidden=[256, 256, 256, 256]",
                                              "devices.0.memory=16MiB", "devices.1.memory=1536KiB",
                                              "devices.2.memory=1536KiB"};

void expectOutOfMemoryOnASmallDevice(const std::vector<RankOutcome>& outcomes,
                                     const std::string& what) {
  int outOfMemory = 0;
  for (int r = 0; r < kRanks; ++r) {
    const auto& o = outcomes[size_t(r)];
    EXPECT_NE(o.code, kTrained) << what << ": rank " << r << " trained";
    EXPECT_NE(o.code, -1) << what << ": rank " << r << " hung";
    EXPECT_NE(o.code, kOtherError) << what << ": rank " << r << ": " << lastLine(o);
    if (o.code != kOutOfMemory) continue;
    ++outOfMemory;
    EXPECT_NE(r, 0) << what << ": the big device ran out of memory: " << lastLine(o);
    ASSERT_GE(o.lines.size(), 2u);
    EXPECT_EQ(o.lines[1], "small" + std::to_string(r)) << what;
  }
  EXPECT_GE(outOfMemory, 1) << what;
}

TEST(ZeroMemory, AModelTooLargeForTheSmallestDeviceTrainsOnlyUnderMemoryShards) {
  auto dataParallel = kLargeModel;
  dataParallel.push_back("zero.stage=0");
  expectOutOfMemoryOnASmallDevice(runRankProcesses("dp", dataParallel, /*customModel=*/true),
                                  "data parallel");
  auto even = kLargeModel;
  even.insert(even.end(), {"zero.stage=3", "zero.shards=even"});
  expectOutOfMemoryOnASmallDevice(runRankProcesses("even", even), "ZeRO-3, even shards");
  auto memory = kLargeModel;
  memory.insert(memory.end(), {"zero.stage=3", "zero.shards=memory"});
  const auto outcomes = runRankProcesses("memory", memory);
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(outcomes[size_t(r)].code, kTrained)
        << "ZeRO-3, memory shards: rank " << r << ": " << lastLine(outcomes[size_t(r)]);
}

// 215K parameters again, on devices of 2, 1 and 1 MiB: together less than Adam's 16 bytes per
// parameter and each device's block buffers, so ZeRO-3 runs out of memory even with memory shards,
// and trains once the small devices keep their shards in host memory ([zero] offload).
TEST(ZeroMemory, AModelLargerThanItsDevicesTogetherTrainsWithTheShardsOffloaded) {
  const std::vector<std::string> tight = {"model.hidden=[256, 256, 256, 256]",
                                          "devices.0.memory=2MiB", "devices.1.memory=1MiB",
                                          "devices.2.memory=1MiB", "zero.stage=3"};
  const auto onDevice = runRankProcesses("offload-none", tight);
  int outOfMemory = 0;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_NE(onDevice[size_t(r)].code, -1) << "rank " << r << " hung";
    EXPECT_NE(onDevice[size_t(r)].code, kOtherError) << lastLine(onDevice[size_t(r)]);
    outOfMemory += onDevice[size_t(r)].code == kOutOfMemory;
  }
  EXPECT_GE(outOfMemory, 1) << "the state fits the devices: the model is not too large";

  auto offloaded = tight;
  offloaded.insert(offloaded.end(),
                   {"devices.1.offload=parameters", "devices.2.offload=parameters"});
  const RunConfig config = configWith(offloaded);
  auto model = makeModel(modelSpecOf(config, datasetGeometry(config.data)));
  const ShardedBytes bytes = shardedBytesOf(config, *model);
  const auto shards = planShards(
      config, bytes, bytes.psi,
      estimateFootprint(modelSpecOf(config, datasetGeometry(config.data))).bytesPerSample);
  const auto outcomes = runRankProcesses("offload-parameters", offloaded);
  const auto peak = [&](int r, MemoryCategory c) {
    return double(std::stoll(outcomes[size_t(r)].lines.at(2 + size_t(c))));
  };
  for (int r = 0; r < kRanks; ++r) {
    const auto& o = outcomes[size_t(r)];
    ASSERT_EQ(o.code, kTrained) << "rank " << r << ": " << lastLine(o);
    // Host memory: parameters, gradients and Adam's two moments of the shard, 16 bytes each.
    const double hosted = r == 0 ? 0.0 : 16.0 * double(shards[size_t(r)]);
    EXPECT_GE(peak(r, MemoryCategory::kOffloaded), 0.95 * hosted) << "rank " << r;
    EXPECT_LE(peak(r, MemoryCategory::kOffloaded), 1.05 * hosted) << "rank " << r;
    if (r > 0) {
      EXPECT_EQ(peak(r, MemoryCategory::kOptimizerState), 0) << "rank " << r;
    }
  }
  EXPECT_GT(shards[1], 0);
  EXPECT_GT(shards[2], 0);
}

// ---- The trainer
// ---------------------------------------------------------------------------------

// `hetra run`'s loop under every stage, evaluation included (every 3 steps and at the end): the
// same training as data parallelism, to float rounding (the collectives' providers are the cost
// model's choice here, not the rank-order ones of the tests above).
TEST(ZeroTrainer, EveryStageTrainsAndEvaluatesAsDataParallel) {
  torch::set_num_threads(1);
  auto results = [](const std::vector<std::string>& zero) {
    std::vector<std::string> sets = {"model.hidden=[32, 16]", "train.steps=7",
                                     "train.eval_every=3",    "train.global_batch=20",
                                     "zero.shards=even",      "data.test_samples=43"};
    sets.insert(sets.end(), zero.begin(), zero.end());
    const RunConfig config = configWith(sets);
    std::vector<TrainResult> out(kRanks);
    auto store = std::make_shared<store::MemoryStore>();
    test::runRanks(kRanks, [&](int rank) {
      comm::GroupOptions options;
      options.timeout = Millis(20000);
      auto comm = comm::Communicator::create(store, rank, kRanks, options);
      out[size_t(rank)] = train(config, comm, TrainerOptions{});
    });
    return out;
  };
  const auto reference = results({"zero.stage=0"});
  const std::vector<std::vector<std::string>> variants = {
      {"zero.stage=1"},
      {"zero.stage=1", "zero.overlap_update=true"},  // updated group by group as gradients arrive
      {"zero.stage=2"},
      {"zero.stage=3"},
      {"zero.stage=3", "zero.prefetch=false"}};
  for (const auto& variant : variants) {
    const auto sharded = results(variant);
    std::string what;
    for (const auto& set : variant) what += set + " ";
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_NEAR(sharded[size_t(r)].testLoss, reference[size_t(r)].testLoss,
                  1e-5 * std::abs(reference[size_t(r)].testLoss))
          << what << "rank " << r;
      EXPECT_EQ(sharded[size_t(r)].testAccuracy, reference[size_t(r)].testAccuracy)
          << what << "rank " << r;
      EXPECT_NEAR(sharded[size_t(r)].lastLoss, reference[size_t(r)].lastLoss,
                  1e-5 * std::abs(reference[size_t(r)].lastLoss))
          << what << "rank " << r;
    }
  }
}

// `hetra run`'s loop on devices of speeds 1, 1/3 and 1/9 without caps: once every optimizer step
// is measured the shards move once (a "shards" record), the fastest device's growing past the
// slowest's and the slowest's shrinking below the even share, and the run trains as one whose
// shards stay put (zero.follow_speed = false) does, to float rounding. Under shards = "even"
// nothing moves. Only the devices 9x apart are compared: the updates take well under a
// millisecond, and a loaded machine's scheduling swapped the 1/3 device with each of the others
// (a fresh machine's make test, then a CI run under ctest -j2).
TEST(ZeroTrainer, ShardsFollowTheMeasuredSpeedAndTrainAsFixedShardsDo) {
  torch::set_num_threads(1);
  struct Outcome {
    std::vector<TrainResult> results;
    std::vector<std::vector<int64_t>> moves;  // the "shards" records' sizes
  };
  auto run = [](int stage, const std::string& shards, bool follow) {
    const RunConfig config = configWith(
        {"model.hidden=[256, 256]", "train.steps=16", "train.global_batch=24",
         "zero.stage=" + std::to_string(stage), "zero.shards=" + shards, "devices.1.slowdown=3",
         "devices.2.slowdown=9", std::string("zero.follow_speed=") + (follow ? "true" : "false")});
    const fs::path dir = freshDir("follow");
    Outcome out;
    out.results.resize(kRanks);
    auto store = std::make_shared<store::MemoryStore>();
    test::runRanks(kRanks, [&](int rank) {
      comm::GroupOptions options;
      options.timeout = Millis(20000);
      auto comm = comm::Communicator::create(store, rank, kRanks, options);
      TrainerOptions trainer;
      if (rank == 0) trainer.metricsPath = (dir / "metrics.jsonl").string();
      out.results[size_t(rank)] = train(config, comm, trainer);
    });
    for (const auto& line : linesOf(dir / "metrics.jsonl")) {
      const auto record = nlohmann::json::parse(line);
      if (record.at("event") == "shards")
        out.moves.push_back(record.at("shard_elements").get<std::vector<int64_t>>());
    }
    fs::remove_all(dir);
    return out;
  };
  for (int stage : {1, 3}) {
    const Outcome fixed = run(stage, "memory", false), following = run(stage, "memory", true);
    EXPECT_TRUE(fixed.moves.empty()) << "stage " << stage;
    ASSERT_EQ(following.moves.size(), 1u) << "stage " << stage;
    const auto& moved = following.moves.front();
    ASSERT_EQ(moved.size(), size_t(kRanks));
    const int64_t even = std::accumulate(moved.begin(), moved.end(), int64_t(0)) / kRanks;
    EXPECT_GT(moved[0], moved[2]) << "stage " << stage;
    EXPECT_LT(moved[2], even) << "stage " << stage;
    for (int r = 0; r < kRanks; ++r) {
      const TrainResult &a = following.results[size_t(r)], &b = fixed.results[size_t(r)];
      EXPECT_NEAR(a.lastLoss, b.lastLoss, 1e-5 * std::abs(b.lastLoss)) << "stage " << stage;
      EXPECT_NEAR(a.testLoss, b.testLoss, 1e-5 * std::abs(b.testLoss)) << "stage " << stage;
    }
    EXPECT_TRUE(run(stage, "even", true).moves.empty()) << "stage " << stage;
  }
}

TEST(ZeroConfig, ValuesAndCombinationsItCannotRunAreRefusedByName) {
  auto message = [](const std::vector<std::string>& sets) {
    try {
      configWith(sets);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message({"zero.stage=4"}).find("zero.stage"), std::string::npos);
  EXPECT_NE(message({"zero.shards=odd"}).find("zero.shards"), std::string::npos);
  // Sharded runs save checkpoints (tests/test_data_parallel_zero_checkpoint.cc).
  EXPECT_EQ(message({"zero.stage=2", "train.checkpoint_every=5", "train.checkpoint_dir=/tmp/c"}),
            "(accepted)");
  EXPECT_NE(message({"zero.stage=1", "train.sync_every=4"}).find("sync_every"), std::string::npos);
  EXPECT_EQ(message({"zero.stage=1", "comm.compression=fp16"}), "(accepted)");
  EXPECT_NE(message({"zero.offload=optimizer"}).find("zero.offload"), std::string::npos);
  EXPECT_NE(message({"zero.stage=2", "devices.1.offload=parameters"}).find("devices[1].offload"),
            std::string::npos);
  EXPECT_NE(message({"zero.stage=3", "zero.offload=disk"}).find("zero.offload"), std::string::npos);
  const RunConfig offloading =
      configWith({"zero.stage=3", "zero.offload=optimizer", "devices.2.offload=parameters"});
  EXPECT_EQ(parseConfig(toToml(offloading), "printed", {}), offloading);
  const RunConfig fine = configWith({"zero.stage=3", "zero.shards=even"});
  EXPECT_EQ(fine.zero.stage, 3);
  EXPECT_EQ(fine.zero.shards, "even");
  EXPECT_TRUE(fine.zero.prefetch);  // the default
  EXPECT_FALSE(configWith({"zero.stage=3", "zero.prefetch=false"}).zero.prefetch);
  EXPECT_TRUE(fine.zero.followSpeed);  // the default
  EXPECT_FALSE(configWith({"zero.follow_speed=false"}).zero.followSpeed);
  EXPECT_FALSE(fine.zero.overlapUpdate);  // the default
  EXPECT_TRUE(configWith({"zero.overlap_update=true"}).zero.overlapUpdate);
  EXPECT_EQ(parseConfig(toToml(fine), "printed", {}), fine);
}

}  // namespace
}  // namespace hetra::train
