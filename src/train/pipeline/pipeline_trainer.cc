#include "train/pipeline/pipeline_trainer.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <tuple>

#include "balance/pipeline_partition.h"
#include "common/errors.h"
#include "common/timeline.h"
#include "device/memory_accounting.h"
#include "train/counting_allocator.h"
#include "train/datasets.h"
#include "train/device_memory.h"
#include "train/models.h"
#include "train/optim.h"
#include "train/pipeline/pipeline_report.h"
#include "train/pipeline/profile.h"
#include "train/pipeline/stage.h"
#include "train/rank_device.h"
#include "train/sampler.h"
#include "train/specs.h"

namespace hetra::train::pipeline {
namespace {

// Rounds of the start-up profile; the fastest of them counts (the first warms the allocator).
constexpr int kProfileRounds = 3;

// What every stage reports about a step, all-gathered as float64.
enum StatField { kLossSum, kStageSeconds, kStepSeconds, kBytesSent, kBytesReceived, kStatFields };

// Chunk sizes of a step: `batch` samples in `chunks` parts as even as possible, the first ones
// one larger where they do not divide.
std::vector<int64_t> chunkSizes(int64_t batch, int64_t chunks) {
  std::vector<int64_t> sizes;
  for (int64_t k = 0; k < chunks; ++k) sizes.push_back(batch / chunks + (k < batch % chunks));
  return sizes;
}

// The step's chunks in sampler order: the step's whole global batch, as one rank's share.
std::vector<Batch> chunksOf(const Dataset& data, GlobalSampler& sampler, int64_t step,
                            const std::vector<int64_t>& sizes) {
  const auto indices = sampler.indices(step, {sampler.globalBatch()}, 0);
  std::vector<Batch> chunks;
  size_t offset = 0;
  device::MemoryScope host(device::MemoryCategory::kHostData);
  for (int64_t n : sizes) {
    chunks.push_back(data.get(
        std::vector<int64_t>(indices.begin() + long(offset), indices.begin() + long(offset + n))));
    offset += size_t(n);
  }
  return chunks;
}

std::shared_ptr<BlockModel> blocksOf(std::shared_ptr<Model> model) {
  auto blocks = std::dynamic_pointer_cast<BlockModel>(model);
  if (!blocks)
    throw ConfigError(
        "parallel.pipeline > 1 needs a model made of named blocks (train/models.h: the built-in "
        "mlp, cnn and transformer are); this model is not a BlockModel");
  return blocks;
}

// Per block: its parameters, their gradients and the optimizer's state copies, in bytes.
std::vector<int64_t> fixedBytesOf(const BlockModel& model, const TrainConfig& train) {
  const int64_t copies = 2 + optimizerStateCopies(train.optimizer, train.momentum);
  std::vector<int64_t> bytes;
  for (size_t b = 0; b < model.blockCount(); ++b) {
    int64_t values = 0;
    for (const auto& p : model.blockParameters(b)) values += p.numel();
    bytes.push_back(copies * values * int64_t(sizeof(float)));
  }
  return bytes;
}

// Every rank's profile and memory cap, all-gathered, as the partitioner's costs. The activations
// of a block are the same on any device; each rank measured them on its own, the largest counts.
balance::PipelineCosts shareCosts(const BlockProfile& mine, int64_t capBytes,
                                  std::vector<int64_t> fixedBytes, int64_t chunks,
                                  comm::Communicator& comm) {
  const size_t blocks = mine.seconds.size(), row = 2 * blocks + 1;
  std::vector<double> report(mine.seconds);
  for (int64_t bytes : mine.activationBytes) report.push_back(double(bytes));
  report.push_back(double(capBytes));
  std::vector<double> all(row * size_t(comm.size()));
  comm.allgather(report.data(), all.data(), std::vector<size_t>(size_t(comm.size()), row),
                 DType::F64)
      ->wait();
  balance::PipelineCosts costs;
  costs.fixedBytes = std::move(fixedBytes);
  costs.activationBytes.assign(blocks, 0);
  costs.chunks = chunks;
  for (int r = 0; r < comm.size(); ++r) {
    const double* at = all.data() + size_t(r) * row;
    costs.seconds.emplace_back(at, at + blocks);
    for (size_t b = 0; b < blocks; ++b)
      costs.activationBytes[b] = std::max(costs.activationBytes[b], int64_t(at[blocks + b]));
    costs.memoryBytes.push_back(int64_t(at[2 * blocks]));
  }
  return costs;
}

// The even partition's predicted step, or 0 where it does not fit (said in the header).
double evenStepSeconds(const balance::PipelineCosts& costs) {
  try {
    return balance::partitionEven(costs).stepSeconds;
  } catch (const ConfigError&) {
    return 0;
  }
}

class PipelineRun {
 public:
  PipelineRun(const RunConfig& config, std::shared_ptr<comm::Communicator> comm,
              const TrainerOptions& options)
      : config_(config),
        comm_(std::move(comm)),
        device_(config, comm_->rank()),
        compute_(int(device_.config.threads)) {
    HETRA_ENFORCE_EQ(int64_t(comm_->size()), config.parallel.pipeline, "one rank per stage");
    makeDataAndModel(options);
    sampler_.emplace(trainData_->size(), config.train.globalBatch, uint64_t(config.train.seed));
    totalSteps_ =
        config.train.steps > 0 ? config.train.steps : sampler_->stepsFor(config.train.epochs);
    schedule_.emplace(scheduleSpecOf(config.train, totalSteps_));
    sizes_ = chunkSizes(config.train.globalBatch, config.parallel.chunks);
    partition();
    keepStageBlocks();
    optimizer_ = makeOptimizer(stageParameters_, optimSpecOf(config.train));
    PipelineReportOptions reportOptions;
    reportOptions.enabled = device_.rank == 0;
    reportOptions.metricsPath = options.metricsPath;
    reportOptions.appendMetrics = options.appendMetrics;
    reportOptions.logEvery = config.train.logEvery;
    reportOptions.totalSteps = totalSteps_;
    reportOptions.globalBatch = config.train.globalBatch;
    reportOptions.chunks = config.parallel.chunks;
    reportOptions.mode = config.parallel.partition;
    report_.emplace(reportOptions);
  }

  TrainResult run() {
    std::vector<std::string> devices;
    for (const auto& d : config_.devices) devices.push_back(d.name);
    report_->start(str(modelName_, " on ", trainData_->name()), devices, model_->blockNames(),
                   partition_, evenSeconds_);
    const auto start = Clock::now();
    const int64_t warmup = std::min<int64_t>(5, totalSteps_ / 3);
    double measuredSeconds = 0;
    TrainResult result;
    const int64_t evalEvery = config_.train.evalEvery;
    for (int64_t step = 0; step < totalSteps_; ++step) {
      const double seconds = trainStep(step, result.lastLoss);
      if (step >= warmup) measuredSeconds += seconds;
      if (evalEvery > 0 && (step + 1) % evalEvery == 0 && step + 1 < totalSteps_)
        evaluateAt(step + 1, result);
    }
    evaluateAt(totalSteps_, result);
    result.steps = totalSteps_;
    result.wallSeconds = secondsSince(start);
    const int64_t measured = totalSteps_ - warmup;
    result.samplesPerSecond =
        double(measured * config_.train.globalBatch) / std::max(1e-9, measuredSeconds);
    report_->finish(result);
    return result;
  }

 private:
  void makeDataAndModel(const TrainerOptions& options) {
    std::tie(trainData_, testData_) = loadTrainAndTestData(config_, options);
    // The whole model, in host memory: only the stage's blocks become device memory.
    device::MemoryScope host(device::MemoryCategory::kHostData);
    if (options.makeModel) {
      model_ = blocksOf(options.makeModel());
      modelName_ = "a custom model";
    } else {
      const DatasetGeometry geometry{trainData_->inputShape(), trainData_->classes()};
      model_ = blocksOf(makeModel(modelSpecOf(config_, geometry)));
      modelName_ = config_.model.name;
    }
  }

  // The profile, the all-gather of every rank's, and the partition every rank computes alike.
  void partition() {
    timeline::Span span(timeline::Lane::Compute, "compute", "pipeline profile");
    const std::vector<Batch> first = chunksOf(*trainData_, *sampler_, 0, {sizes_.front()});
    const BlockProfile profile = profileBlocks(*model_, first.front(), compute_,
                                               slowdownAt(device_.config, 0), kProfileRounds);
    // Ranks that are threads of one process share its memory ledger: no cap is enforced there.
    const int64_t cap = device_.memory.enforced() ? device_.config.memoryBytes : 0;
    const auto costs = shareCosts(profile, cap, fixedBytesOf(*model_, config_.train),
                                  config_.parallel.chunks, *comm_);
    partition_ = balance::partitionBy(config_.parallel.partition, costs);
    evenSeconds_ = evenStepSeconds(costs);
    span_.stage = device_.rank;
    span_.stages = comm_->size();
    span_.first = partition_.bounds[size_t(device_.rank)];
    span_.last = partition_.bounds[size_t(device_.rank) + 1];
    if (span_.first > 0) span_.inputShape = profile.outputShapes[size_t(span_.first) - 1];
    stage_.emplace(*model_, span_, *comm_);
  }

  // The stage's parameters become device memory (the cap applies); the other blocks' are freed.
  void keepStageBlocks() {
    for (size_t b = 0; b < model_->blockCount(); ++b) {
      const bool mine = int64_t(b) >= span_.first && int64_t(b) < span_.last;
      for (auto p : model_->blockParameters(b)) {
        if (mine) {
          recategorize(p, device::MemoryCategory::kParameters);
          stageParameters_.push_back(p);
        } else {
          torch::NoGradGuard noGrad;
          p.set_data(torch::empty({0}, p.options()));
        }
      }
    }
    device_.memory.trackGradients(stageParameters_);
  }

  // The whole test set through the pipeline in chunks of twice the training chunk (no gradients:
  // that fits the same memory); the last stage's sums reach every rank.
  void evaluateAt(int64_t step, TrainResult& result) {
    timeline::Span span(timeline::Lane::Compute, "eval", "evaluate");
    const int64_t size = std::max<int64_t>(1, std::min<int64_t>(1024, 2 * sizes_.front()));
    std::vector<Batch> chunks;
    {
      device::MemoryScope host(device::MemoryCategory::kHostData);
      for (int64_t start = 0; start < testData_->size(); start += size) {
        std::vector<int64_t> indices;
        for (int64_t i = start; i < std::min(testData_->size(), start + size); ++i)
          indices.push_back(i);
        chunks.push_back(testData_->get(indices));
      }
    }
    device::MemoryScope activations(device::MemoryCategory::kActivations);
    auto [lossSum, correct] = stage_->evaluate(evaluations_++, chunks);
    double sums[2] = {lossSum, correct};
    comm_->allreduce(sums, sums, 2, DType::F64, comm::ReduceOp::Sum)->wait();
    const double samples = std::max<double>(1.0, double(testData_->size()));
    result.testLoss = sums[0] / samples;
    result.testAccuracy = sums[1] / samples;
    report_->evaluation(step, result.testLoss, result.testAccuracy);
  }

  double trainStep(int64_t step, double& lastLoss) {
    const auto start = Clock::now();
    timeline::Span span(timeline::Lane::Compute, "step", "step");
    span.arg("step", step + 1);
    const double slowdown = slowdownAt(device_.config, step);
    const std::vector<Batch> chunks = chunksOf(*trainData_, *sampler_, step, sizes_);
    const uint64_t sent = comm_->bytesSent(), received = comm_->bytesReceived();
    StageStep result;
    {
      device::MemoryScope activations(device::MemoryCategory::kActivations);
      result =
          stage_->run(step, chunks, 1.0 / double(config_.train.globalBatch), compute_, slowdown);
    }
    device_.memory.adoptGradients();
    {
      timeline::Span optimizerSpan(timeline::Lane::Compute, "compute", "optimizer step");
      device::MemoryScope state(device::MemoryCategory::kOptimizerState);
      result.computeSeconds += compute_.compute(slowdown, [&] {
        applyLr(*optimizer_, schedule_->lrAt(step));
        optimizer_->step();
      });
    }
    for (auto& p : stageParameters_) p.mutable_grad().reset();
    const double seconds = secondsSince(start);
    std::vector<double> mine(kStatFields, 0.0), all(size_t(kStatFields) * size_t(comm_->size()));
    mine[kLossSum] = result.lossSum;
    mine[kStageSeconds] = result.computeSeconds;
    mine[kStepSeconds] = seconds;
    mine[kBytesSent] = double(comm_->bytesSent() - sent);
    mine[kBytesReceived] = double(comm_->bytesReceived() - received);
    // Synchronous: a pipeline step ends with every stage flushed anyway.
    comm_
        ->allgather(mine.data(), all.data(),
                    std::vector<size_t>(size_t(comm_->size()), kStatFields), DType::F64)
        ->wait();
    PipelineStepRecord record;
    record.step = step + 1;
    record.lr = schedule_->lrAt(step);
    double lossSum = 0;
    for (int r = 0; r < comm_->size(); ++r) {
      const double* row = all.data() + size_t(r) * kStatFields;
      lossSum += row[kLossSum];
      record.seconds = std::max(record.seconds, row[kStepSeconds]);
      record.stages.push_back({config_.devices[size_t(r)].name, partition_.bounds[size_t(r)],
                               partition_.bounds[size_t(r) + 1], row[kStageSeconds],
                               row[kStepSeconds], int64_t(row[kBytesSent]),
                               int64_t(row[kBytesReceived])});
    }
    record.loss = lastLoss = lossSum / double(config_.train.globalBatch);
    report_->step(record);
    return record.seconds;
  }

  const RunConfig& config_;
  std::shared_ptr<comm::Communicator> comm_;
  RankDevice device_;  // before every member that allocates tensors
  EmulatedDevice compute_;
  std::shared_ptr<const Dataset> trainData_, testData_;
  int64_t evaluations_ = 0;
  std::shared_ptr<BlockModel> model_;
  std::string modelName_;
  std::optional<GlobalSampler> sampler_;
  std::optional<LrSchedule> schedule_;
  int64_t totalSteps_ = 0;
  std::vector<int64_t> sizes_;
  balance::Partition partition_;
  double evenSeconds_ = 0;
  StageSpan span_;
  std::optional<Stage> stage_;
  std::vector<torch::Tensor> stageParameters_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<PipelineReport> report_;
};

}  // namespace

TrainResult train(const RunConfig& config, std::shared_ptr<comm::Communicator> comm,
                  const TrainerOptions& options) {
  PipelineRun run(config, std::move(comm), options);
  return run.run();
}

namespace {

std::string formatMillis(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f ms", 1e3 * seconds);
  return text;
}

}  // namespace

std::string predictedPipeline(const RunConfig& config) {
  if (config.parallel.pipeline <= 1) return "";
  setComputeThreads(1);  // as a device of one thread; LibTorch's default takes every core here
  DeviceMemory memory("print-config", 0);  // counts the profile's activations
  device::MemoryScope host(device::MemoryCategory::kHostData);
  auto data = makeDataset(dataSpecOf(config), /*train=*/true);
  auto model = blocksOf(
      makeModel(modelSpecOf(config, DatasetGeometry{data->inputShape(), data->classes()})));
  GlobalSampler sampler(data->size(), config.train.globalBatch, uint64_t(config.train.seed));
  const auto sizes = chunkSizes(config.train.globalBatch, config.parallel.chunks);
  const auto chunk = chunksOf(*data, sampler, 0, {sizes.front()});
  EmulatedDevice here(1);
  const BlockProfile profile = profileBlocks(*model, chunk.front(), here, 1.0, kProfileRounds);
  balance::PipelineCosts costs;
  costs.fixedBytes = fixedBytesOf(*model, config.train);
  costs.activationBytes = profile.activationBytes;
  costs.chunks = config.parallel.chunks;
  for (const auto& d : config.devices) {
    const double s = slowdownAt(d, 0);
    std::vector<double> row;
    for (double t : profile.seconds) row.push_back(t * s);
    costs.seconds.push_back(std::move(row));
    costs.memoryBytes.push_back(d.memoryBytes);
  }
  const balance::Partition chosen = balance::partitionBy(config.parallel.partition, costs);
  const auto names = model->blockNames();
  std::string text =
      str("# Pipeline: parallel.partition = \"", config.parallel.partition, "\"", ", ",
          chosen.stages(), " stages, ", costs.chunks, " chunks; from a profile of one chunk of ",
          sizes.front(), " samples on one thread of this host, times each device's slowdown:\n");
  for (int i = 0; i < chosen.stages(); ++i)
    text += str("#   stage ", i, " on ", config.devices[size_t(i)].name, ": blocks ",
                blockRange(names, chosen.bounds[size_t(i)], chosen.bounds[size_t(i) + 1]), " (",
                chosen.blocksOf(i), "), ", formatMillis(chosen.stageSeconds[size_t(i)]),
                " per chunk, ", device::readableBytes(chosen.stageBytes[size_t(i)]), "\n");
  text += str("#   predicted step time ", formatMillis(chosen.stepSeconds),
              " (1F1B: sum of the stages + (chunks - 1) x the slowest)");
  const double even = evenStepSeconds(costs);
  if (config.parallel.partition != "even")
    text += even > 0 ? str("; an even partition: ", formatMillis(even))
                     : std::string("; an even partition does not fit the memory");
  return text + "\n";
}

}  // namespace hetra::train::pipeline
