#include "train/pipeline/pipeline_trainer.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>

#include "balance/balancer.h"
#include "balance/pipeline_partition.h"
#include "balance/pipeline_rebalance.h"
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
#include "train/pipeline/stage_update.h"
#include "train/rank_device.h"
#include "train/sampler.h"
#include "train/specs.h"
#include "train/zero_layout.h"

namespace hetra::train::pipeline {
namespace {

// Rounds of the start-up profile; the fastest of them counts (the first warms the allocator).
constexpr int kProfileRounds = 3;

// The part of a device's cap the partition may plan for: the rest is for what the profile does
// not see (backward's transient buffers, the allocator's rounding), as the micro-batch bound of
// data parallelism keeps 5% free (docs/memory.md).
constexpr double kPlannedMemory = 0.95;

// Per block: its input for one chunk of `samples` (the previous block's output), in bytes.
std::vector<int64_t> inputBytesOf(const std::vector<std::vector<int64_t>>& outputShapes,
                                  int64_t samples) {
  std::vector<int64_t> bytes(outputShapes.size(), 0);
  for (size_t b = 1; b < outputShapes.size(); ++b) {
    int64_t values = samples;
    for (int64_t d : outputShapes[b - 1]) values *= d;
    bytes[b] = values * int64_t(sizeof(float));
  }
  return bytes;
}

int64_t plannedCap(int64_t capBytes) {
  return capBytes > 0 ? std::max<int64_t>(1, int64_t(kPlannedMemory * double(capBytes))) : 0;
}

// What every rank reports about a step, all-gathered as float64.
enum StatField {
  kLossSum,
  kStageSeconds,
  kStepSeconds,
  kRunSeconds,
  kUpdateCommSeconds,
  kBytesSent,
  kBytesReceived,
  kChunksInFlight,
  kActivationBytes,
  kForwardBackwardSeconds,
  kSamples,
  kReplicaDrift,  // a step that re-synchronised the stage's replicas: how far this one had drifted
  kStatFields
};

// Chunk sizes of a share: `batch` samples in `chunks` parts as even as possible, the first ones
// one larger where they do not divide; fewer chunks than `chunks` where the share is smaller.
std::vector<int64_t> chunkSizes(int64_t batch, int64_t chunks) {
  chunks = std::min(chunks, batch);
  std::vector<int64_t> sizes;
  for (int64_t k = 0; k < chunks; ++k) sizes.push_back(batch / chunks + (k < batch % chunks));
  return sizes;
}

// The chunks of `indices`, in order.
std::vector<Batch> chunksOf(const Dataset& data, const std::vector<int64_t>& indices,
                            const std::vector<int64_t>& sizes) {
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

// The first chunk of step 0's whole global batch: what the profile runs.
Batch profileChunk(const Dataset& data, GlobalSampler& sampler, int64_t chunks) {
  const auto indices = sampler.indices(0, {sampler.globalBatch()}, 0);
  return chunksOf(data, indices, {chunkSizes(sampler.globalBatch(), chunks).front()}).front();
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

// Every rank's profile and memory cap, all-gathered, as the partitioner's costs for `stages`
// stages: position i's costs are those of the slowest device at position i of the pipelines
// (block by block) and its smallest cap. The activations of a block are the same on any device;
// each rank measured them on its own, the largest counts.
balance::PipelineCosts shareCosts(const BlockProfile& mine, int64_t capBytes,
                                  std::vector<int64_t> fixedBytes, int64_t chunks, int stages,
                                  comm::Communicator& world) {
  const size_t blocks = mine.seconds.size(), row = 2 * blocks + 1;
  std::vector<double> report(mine.seconds);
  for (int64_t bytes : mine.activationBytes) report.push_back(double(bytes));
  report.push_back(double(capBytes));
  std::vector<double> all(row * size_t(world.size()));
  world
      .allgather(report.data(), all.data(), std::vector<size_t>(size_t(world.size()), row),
                 DType::F64)
      ->wait();
  balance::PipelineCosts costs;
  costs.fixedBytes = std::move(fixedBytes);
  costs.activationBytes.assign(blocks, 0);
  costs.chunks = chunks;
  costs.seconds.assign(size_t(stages), std::vector<double>(blocks, 0.0));
  costs.memoryBytes.assign(size_t(stages), 0);
  for (int r = 0; r < world.size(); ++r) {
    const double* at = all.data() + size_t(r) * row;
    const size_t i = size_t(r % stages);
    for (size_t b = 0; b < blocks; ++b) {
      costs.seconds[i][b] = std::max(costs.seconds[i][b], at[b]);
      costs.activationBytes[b] = std::max(costs.activationBytes[b], int64_t(at[blocks + b]));
    }
    const int64_t cap = plannedCap(int64_t(at[2 * blocks]));  // 0: no cap
    if (cap > 0 && (costs.memoryBytes[i] == 0 || cap < costs.memoryBytes[i]))
      costs.memoryBytes[i] = cap;
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

// ZeRO-1's shard of each replica of a stage: equal, or (zero.shards = "memory") in proportion to
// the headroom each replica's device has beside the stage's parameters, gradients and in-flight
// activations, a device without a cap counting as the roomiest of the others (all without: even).
std::vector<int64_t> stageShards(const RunConfig& config, const balance::Partition& partition,
                                 const std::vector<int>& order, int stage, int64_t elements) {
  const int stages = partition.stages();
  const size_t replicas = config.devices.size() / size_t(stages);
  std::vector<double> headroom(replicas, -1.0);
  if (config.zero.shards == "memory") {
    const int64_t optimizerBytes =
        optimizerStateCopies(config.train.optimizer, config.train.momentum) * elements *
        int64_t(sizeof(float));
    const int64_t replicated = partition.stageBytes[size_t(stage)] - optimizerBytes;
    for (size_t j = 0; j < replicas; ++j) {
      const int64_t cap =
          config.devices[j * size_t(stages) + size_t(order[size_t(stage)])].memoryBytes;
      if (cap > 0) headroom[j] = double(std::max<int64_t>(0, cap - replicated));
    }
  }
  const double roomiest = *std::max_element(headroom.begin(), headroom.end());
  for (double& h : headroom)
    if (h < 0) h = roomiest < 0 ? 1.0 : roomiest;
  return proportionalShards(elements, headroom);
}

// "balanced": the least step over every order of the positions (balance::partitionOverOrders);
// "even": equal block counts in the given order.
balance::OrderedPartition choosePartition(const std::string& mode,
                                          const balance::PipelineCosts& costs) {
  if (mode == "balanced") return balance::partitionOverOrders(costs);
  std::vector<int> given(costs.seconds.size());
  std::iota(given.begin(), given.end(), 0);
  return {given, balance::partitionBy(mode, costs)};
}

class PipelineRun {
 public:
  PipelineRun(const RunConfig& config, std::shared_ptr<comm::Communicator> world,
              const TrainerOptions& options)
      : config_(config),
        world_(std::move(world)),
        stages_(int(config.parallel.pipeline)),
        replicas_(world_->size() / stages_),
        replica_(world_->rank() / stages_),
        device_(config, world_->rank()),
        compute_(int(device_.config.threads)) {
    HETRA_ENFORCE(world_->size() % stages_ == 0, world_->size(), " ranks in pipelines of ", stages_,
                  " stages");
    makeDataAndModel(options);
    sampler_.emplace(trainData_->size(), config.train.globalBatch, uint64_t(config.train.seed));
    totalSteps_ =
        config.train.steps > 0 ? config.train.steps : sampler_->stepsFor(config.train.epochs);
    schedule_.emplace(scheduleSpecOf(config.train, totalSteps_));
    // ZeRO-1's replicas cannot drift (one owner per parameter); one pipeline has no replicas.
    resyncEvery_ = config.zero.stage == 0 && replicas_ > 1 ? resyncEveryOf(config) : 0;
    afterOptimizerStep_ = options.afterOptimizerStep;
    if (replicas_ > 1)
      balancer_.emplace(balancerOptionsOf(config),
                        std::vector<balance::RankCaps>(size_t(replicas_)));
    partition();
    keepStageBlocks();
    updateOptions_.optimizer = optimSpecOf(config.train);
    updateOptions_.zeroStage = int(config.zero.stage);
    if (updateOptions_.zeroStage == 1)
      updateOptions_.shardSizes =
          stageShards(config, partition_, order_, span_.stage, stageElements());
    update_.emplace(stageParameters_, stageReplicas_, updateOptions_);
    PipelineReportOptions reportOptions;
    reportOptions.enabled = device_.rank == 0;
    reportOptions.metricsPath = options.metricsPath;
    reportOptions.appendMetrics = options.appendMetrics;
    reportOptions.logEvery = config.train.logEvery;
    reportOptions.totalSteps = totalSteps_;
    reportOptions.globalBatch = config.train.globalBatch;
    reportOptions.chunks = config.parallel.chunks;
    reportOptions.mode = config.parallel.partition;
    reportOptions.replicas = replicas_;
    reportOptions.zeroStage = int(config.zero.stage);
    reportOptions.reordered = !std::is_sorted(order_.begin(), order_.end());
    report_.emplace(reportOptions);
  }

  TrainResult run() {
    std::vector<std::string> devices;  // by pipeline, then stage
    for (int k = 0; k < world_->size(); ++k)
      devices.push_back(config_.devices[size_t(rankAt(k / stages_, k % stages_))].name);
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
    const Batch chunk = profileChunk(*trainData_, *sampler_, config_.parallel.chunks);
    const BlockProfile profile =
        profileBlocks(*model_, chunk, compute_, slowdownAt(device_.config, 0), kProfileRounds);
    // Ranks that are threads of one process share its memory ledger: no cap is enforced there.
    const int64_t cap = device_.memory.enforced() ? device_.config.memoryBytes : 0;
    auto costs = shareCosts(profile, cap, fixedBytesOf(*model_, config_.train),
                            config_.parallel.chunks, stages_, *world_);
    costs.inputBytes = inputBytesOf(profile.outputShapes, chunk.targets.size(0));
    const balance::OrderedPartition chosen = choosePartition(config_.parallel.partition, costs);
    order_ = chosen.order;
    partition_ = chosen.partition;
    evenSeconds_ = evenStepSeconds(costs);
    outputShapes_ = profile.outputShapes;
    // Moving blocks moves their optimizer state; ZeRO-1's shards are laid out over the stage's
    // tensors, so under it the partition stays.
    if (config_.parallel.partition == "balanced" && config_.parallel.repartition &&
        config_.zero.stage == 0)
      watch_.emplace(balance::reordered(costs, order_), chunk.targets.size(0), partition_);
    // This rank's stage (the position of its device in the order), its pipeline (the world
    // itself for one pipeline, so that errors name world ranks; else split, ranked by position)
    // and its stage's replicas.
    const int position = world_->rank() % stages_;
    const int stage = int(std::find(order_.begin(), order_.end(), position) - order_.begin());
    comm::GroupOptions group;
    group.timeout = Millis(int64_t(config_.comm.timeoutS * 1000));
    pipe_ = replicas_ == 1 ? world_ : world_->split(replica_, position, group);
    stageReplicas_ = world_->split(stage, replica_, group);
    span_.stage = stage;
    span_.stages = stages_;
    span_.ranks = order_;  // the pipeline's rank of stage i is its position
    span_.first = partition_.bounds[size_t(span_.stage)];
    span_.last = partition_.bounds[size_t(span_.stage) + 1];
    if (span_.first > 0) span_.inputShape = outputShapes_[size_t(span_.first) - 1];
    stage_.emplace(*model_, span_, *pipe_);
  }

  // The stage's parameters become device memory (the cap applies); the other blocks' are freed.
  void keepStageBlocks() {
    for (size_t b = 0; b < model_->blockCount(); ++b) {
      blockShapes_.emplace_back();
      for (const auto& p : model_->blockParameters(b))
        blockShapes_.back().push_back(p.sizes().vec());
    }
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

  int64_t stageElements() const {
    int64_t elements = 0;
    for (const auto& p : stageParameters_) elements += p.numel();
    return elements;
  }

  // The world rank of `stage` in pipeline `replica`: its device's position there.
  int rankAt(int replica, int stage) const { return replica * stages_ + order_[size_t(stage)]; }

  // What this rank exchanged with its neighbours in the pipeline and with its stage's replicas.
  uint64_t bytesSent() const { return pipe_->bytesSent() + stageReplicas_->bytesSent(); }
  uint64_t bytesReceived() const {
    return pipe_->bytesReceived() + stageReplicas_->bytesReceived();
  }

  // Each pipeline's share of the step's global batch.
  std::vector<int64_t> shares() const {
    if (!balancer_) return {config_.train.globalBatch};
    std::vector<int64_t> batches;
    for (const auto& r : balancer_->plan().ranks) batches.push_back(r.batch);
    return batches;
  }

  // The test set through the pipelines in chunks of twice the largest training chunk (no
  // gradients: that fits the same memory), pipeline j a contiguous j-th of it; the last stages'
  // sums reach every rank.
  void evaluateAt(int64_t step, TrainResult& result) {
    timeline::Span span(timeline::Lane::Compute, "eval", "evaluate");
    const int64_t size = std::max<int64_t>(
        1, std::min<int64_t>(
               1024, 2 * chunkSizes(config_.train.globalBatch, config_.parallel.chunks).front()));
    const int64_t n = testData_->size();
    const int64_t begin = n * replica_ / replicas_, end = n * (replica_ + 1) / replicas_;
    std::vector<Batch> chunks;
    {
      device::MemoryScope host(device::MemoryCategory::kHostData);
      for (int64_t start = begin; start < end; start += size) {
        std::vector<int64_t> indices;
        for (int64_t i = start; i < std::min(end, start + size); ++i) indices.push_back(i);
        chunks.push_back(testData_->get(indices));
      }
    }
    device::MemoryScope activations(device::MemoryCategory::kActivations);
    auto [lossSum, correct] = stage_->evaluate(evaluations_++, chunks);
    double sums[2] = {lossSum, correct};
    world_->allreduce(sums, sums, 2, DType::F64, comm::ReduceOp::Sum)->wait();
    const double samples = std::max<double>(1.0, double(n));
    result.testLoss = sums[0] / samples;
    result.testAccuracy = sums[1] / samples;
    report_->evaluation(step, result.testLoss, result.testAccuracy);
  }

  double trainStep(int64_t step, double& lastLoss) {
    const auto start = Clock::now();
    timeline::Span span(timeline::Lane::Compute, "step", "step");
    span.arg("step", step + 1);
    const double slowdown = slowdownAt(device_.config, step);
    const std::vector<int64_t> batches = shares();
    const int64_t mine = batches[size_t(replica_)];
    const std::vector<Batch> chunks =
        chunksOf(*trainData_, sampler_->indices(step, batches, replica_),
                 chunkSizes(mine, config_.parallel.chunks));
    const uint64_t sent = bytesSent(), received = bytesReceived();
    auto& ledger = device::MemoryLedger::process();
    const int64_t activationsBefore = ledger.usage().liveOf(device::MemoryCategory::kActivations);
    ledger.startWindow();
    StageStep result;
    update_->beginStep();
    const auto runStart = Clock::now();
    {
      device::MemoryScope activations(device::MemoryCategory::kActivations);
      result =
          stage_->run(step, chunks, 1.0 / double(config_.train.globalBatch), compute_, slowdown);
    }
    const double runSeconds = secondsSince(runStart);
    const int64_t activationBytes =
        ledger.window().peakOf(device::MemoryCategory::kActivations) - activationsBefore;
    device_.memory.adoptGradients();
    const double forwardBackward = result.computeSeconds;
    const UpdateSeconds updated = update_->update(schedule_->lrAt(step), compute_, slowdown);
    result.computeSeconds += updated.compute;
    if (afterOptimizerStep_) afterOptimizerStep_(update_->parameters(), step);
    const bool resync = resynchronizesAt(step);
    double drift = 0;
    if (resync) {
      timeline::Span span(timeline::Lane::Compute, "comm", "re-synchronise replicas");
      drift = update_->resynchronize();
    }
    const double seconds = secondsSince(start);
    std::vector<double> report(kStatFields, 0.0), all(size_t(kStatFields) * size_t(world_->size()));
    report[kReplicaDrift] = drift;
    report[kLossSum] = result.lossSum;
    report[kStageSeconds] = result.computeSeconds;
    report[kStepSeconds] = seconds;
    report[kRunSeconds] = runSeconds;
    report[kUpdateCommSeconds] = updated.comm;
    report[kBytesSent] = double(bytesSent() - sent);
    report[kBytesReceived] = double(bytesReceived() - received);
    report[kChunksInFlight] = double(result.peakChunksInFlight);
    // Threads of one process share the ledger: one stage's activations are not told apart there.
    report[kActivationBytes] = device_.memory.enforced() ? double(activationBytes) : -1.0;
    report[kForwardBackwardSeconds] = forwardBackward;
    report[kSamples] = double(mine);
    // Synchronous: a pipeline step ends with every stage flushed anyway.
    world_
        ->allgather(report.data(), all.data(),
                    std::vector<size_t>(size_t(world_->size()), kStatFields), DType::F64)
        ->wait();
    PipelineStepRecord record;
    record.step = step + 1;
    record.lr = schedule_->lrAt(step);
    record.shares = batches;
    double lossSum = 0;
    std::vector<double> pipelineSeconds(size_t(replicas_), 0.0);
    for (int k = 0; k < world_->size(); ++k) {  // pipeline 0's stages in order, then 1's, ...
      const int r = rankAt(k / stages_, k % stages_), stage = k % stages_;
      const double* row = all.data() + size_t(r) * kStatFields;
      lossSum += row[kLossSum];
      record.seconds = std::max(record.seconds, row[kStepSeconds]);
      pipelineSeconds[size_t(k / stages_)] =
          std::max(pipelineSeconds[size_t(k / stages_)], row[kRunSeconds]);
      StageRecord s;
      s.device = config_.devices[size_t(r)].name;
      s.replica = k / stages_;
      s.first = partition_.bounds[size_t(stage)];
      s.last = partition_.bounds[size_t(stage) + 1];
      s.stageSeconds = row[kStageSeconds];
      s.stepSeconds = row[kStepSeconds];
      s.updateCommSeconds = row[kUpdateCommSeconds];
      s.bytesSent = int64_t(row[kBytesSent]);
      s.bytesReceived = int64_t(row[kBytesReceived]);
      s.chunksInFlight = int64_t(row[kChunksInFlight]);
      s.activationBytes = int64_t(row[kActivationBytes]);
      record.stages.push_back(std::move(s));
    }
    record.pipelineSeconds = pipelineSeconds;
    if (resync) {
      record.replicaDrift = 0;
      for (int r = 0; r < world_->size(); ++r)
        record.replicaDrift =
            std::max(record.replicaDrift, all[size_t(r) * kStatFields + kReplicaDrift]);
    }
    record.loss = lastLoss = lossSum / double(config_.train.globalBatch);
    if (balancer_) {
      // A pipeline is one device to the balancer: its share as one micro-batch, its time the
      // slowest of its stages' schedules (the stage replicas' exchange is the same for any split).
      for (int j = 0; j < replicas_; ++j)
        if (batches[size_t(j)] > 0)
          balancer_->observe(j, batches[size_t(j)], pipelineSeconds[size_t(j)]);
      balancer_->endStep(step);
      record.balancerIdeal = balancer_->idealSamplesPerSecond();
    }
    report_->step(record);
    if (watch_) watchPartition(step, all);
    return record.seconds;
  }

  // Whether the first pipeline's stage parameters replace the others' after `step`
  // (train.resync_every).
  bool resynchronizesAt(int64_t step) const {
    return resyncEvery_ > 0 && (step + 1) % resyncEvery_ == 0;
  }

  // The step's forward+backward times per stage position (its slowest replica per sample) to the
  // watch; blocks move when it says so, on every rank at once (they all see the same numbers).
  void watchPartition(int64_t step, const std::vector<double>& all) {
    std::vector<double> seconds(size_t(stages_), 0.0);
    std::vector<int64_t> samples(size_t(stages_), 0);
    for (int k = 0; k < world_->size(); ++k) {
      const double* row = all.data() + size_t(rankAt(k / stages_, k % stages_)) * kStatFields;
      const size_t i = size_t(k % stages_);
      const int64_t n = int64_t(row[kSamples]);
      if (n <= 0) continue;
      if (samples[i] == 0 ||
          row[kForwardBackwardSeconds] / double(n) > seconds[i] / double(samples[i])) {
        seconds[i] = row[kForwardBackwardSeconds];
        samples[i] = n;
      }
    }
    const std::vector<int64_t> before = partition_.bounds;
    const auto next = watch_->observe(step, seconds, samples);
    if (!next) return;
    moveBlocks(*next);
    report_->repartition(step + 1, before, *next, watch_->speedFactors(), watch_->lastGain(),
                         model_->blockNames());
  }

  // Moves blocks to the stages of `next`, between steps: each moved block's parameters and their
  // optimizer state go from its old stage's rank to its new one's in this pipeline. Every rank
  // walks the blocks in the same order and a send completes only with its receive, so no two
  // ranks wait for each other the other way round.
  void moveBlocks(const balance::Partition& next) {
    timeline::Span span(timeline::Lane::Compute, "comm", "re-partition");
    torch::NoGradGuard noGrad;
    const auto ownerIn = [](const std::vector<int64_t>& bounds, int64_t block) {
      return int(std::upper_bound(bounds.begin(), bounds.end(), block) - bounds.begin()) - 1;
    };
    // Tags of their own: bits 60 and 61 set, below the evaluation's bit 62 and above any training
    // step's (those stay below 2^60 for any run shorter than 2^58 chunks).
    const auto tag = [&](size_t block, size_t k, size_t part) {
      return uint64_t(3) << 60 | uint64_t(moves_) << 40 | uint64_t(block) << 16 | k << 4 | part;
    };
    const int me = span_.stage;
    std::map<const void*, ParameterState> arrived;
    for (size_t b = 0; b < model_->blockCount(); ++b) {
      const int from = ownerIn(partition_.bounds, int64_t(b)),
                to = ownerIn(next.bounds, int64_t(b));
      if (from == to || (me != from && me != to)) continue;
      const int fromRank = span_.ranks[size_t(from)], toRank = span_.ranks[size_t(to)];
      const auto& params = model_->blockParameters(b);
      for (size_t k = 0; k < params.size(); ++k) {
        torch::Tensor p = params[k];
        if (me == from) {
          ParameterState state = update_->stateOf(p);
          double header[2] = {double(state.tensors.size()), double(state.steps)};
          pipe_->send(header, 2, DType::F64, toRank, tag(b, k, 0))->wait();
          pipe_->send(p.data_ptr<float>(), size_t(p.numel()), DType::F32, toRank, tag(b, k, 1))
              ->wait();
          for (size_t t = 0; t < state.tensors.size(); ++t) {
            const torch::Tensor x = state.tensors[t].contiguous();
            pipe_
                ->send(x.data_ptr<float>(), size_t(x.numel()), DType::F32, toRank, tag(b, k, 2 + t))
                ->wait();
          }
          p.set_data(torch::empty({0}, p.options()));
          continue;
        }
        double header[2] = {0, 0};
        pipe_->recv(header, 2, DType::F64, fromRank, tag(b, k, 0))->wait();
        torch::Tensor values;
        {
          device::MemoryScope parameters(device::MemoryCategory::kParameters);
          values = torch::empty(blockShapes_[b][k], torch::kFloat32);
        }
        pipe_
            ->recv(values.data_ptr<float>(), size_t(values.numel()), DType::F32, fromRank,
                   tag(b, k, 1))
            ->wait();
        p.set_data(values);
        ParameterState state;
        state.steps = int64_t(header[1]);
        device::MemoryScope optimizerState(device::MemoryCategory::kOptimizerState);
        for (size_t t = 0; t < size_t(header[0]); ++t) {
          torch::Tensor x = torch::empty(blockShapes_[b][k], torch::kFloat32);
          pipe_
              ->recv(x.data_ptr<float>(), size_t(x.numel()), DType::F32, fromRank, tag(b, k, 2 + t))
              ->wait();
          state.tensors.push_back(x);
        }
        arrived[p.unsafeGetTensorImpl()] = std::move(state);
      }
    }
    ++moves_;
    // The stage's new blocks, their state (kept or arrived) in a new optimizer over them.
    partition_ = next;
    span_.first = partition_.bounds[size_t(me)];
    span_.last = partition_.bounds[size_t(me) + 1];
    span_.inputShape =
        span_.first > 0 ? outputShapes_[size_t(span_.first) - 1] : std::vector<int64_t>{};
    std::vector<torch::Tensor> parameters;
    std::vector<ParameterState> states;
    for (int64_t b = span_.first; b < span_.last; ++b)
      for (const auto& p : model_->blockParameters(size_t(b))) {
        parameters.push_back(p);
        const auto found = arrived.find(p.unsafeGetTensorImpl());
        states.push_back(found != arrived.end() ? std::move(found->second) : update_->stateOf(p));
      }
    update_.reset();
    update_.emplace(parameters, stageReplicas_, updateOptions_);
    for (size_t k = 0; k < parameters.size(); ++k) update_->setState(parameters[k], states[k]);
    stageParameters_ = std::move(parameters);
    device_.memory.trackGradients(stageParameters_);
    stage_.emplace(*model_, span_, *pipe_);
  }

  const RunConfig& config_;
  std::shared_ptr<comm::Communicator> world_;
  const int stages_, replicas_, replica_;
  std::vector<int> order_;  // stage i runs on the device at position order_[i] of its pipeline
  std::shared_ptr<comm::Communicator> pipe_;           // this rank's pipeline: rank = stage
  std::shared_ptr<comm::Communicator> stageReplicas_;  // this stage in every pipeline
  RankDevice device_;                                  // before every member that allocates tensors
  EmulatedDevice compute_;
  std::shared_ptr<const Dataset> trainData_, testData_;
  int64_t evaluations_ = 0;
  std::shared_ptr<BlockModel> model_;
  std::string modelName_;
  std::optional<GlobalSampler> sampler_;
  std::optional<LrSchedule> schedule_;
  std::optional<balance::Balancer> balancer_;  // several pipelines
  int64_t totalSteps_ = 0;
  balance::Partition partition_;
  double evenSeconds_ = 0;
  StageSpan span_;
  std::optional<Stage> stage_;
  std::vector<torch::Tensor> stageParameters_;
  StageUpdateOptions updateOptions_;
  std::optional<StageUpdate> update_;
  int64_t resyncEvery_ = 0;  // train.resync_every resolved; 0 where the replicas cannot drift
  std::function<void(const std::vector<torch::Tensor>&, int64_t)> afterOptimizerStep_;
  std::optional<balance::PartitionWatch> watch_;    // partition = "balanced", repartition, no ZeRO
  int64_t moves_ = 0;                               // re-partitions done
  std::vector<std::vector<int64_t>> outputShapes_;  // per block, per sample
  std::vector<std::vector<std::vector<int64_t>>> blockShapes_;  // per block, per parameter
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
  const Batch chunk = profileChunk(*data, sampler, config.parallel.chunks);
  EmulatedDevice here(1);
  const BlockProfile profile = profileBlocks(*model, chunk, here, 1.0, kProfileRounds);
  balance::PipelineCosts costs;
  costs.fixedBytes = fixedBytesOf(*model, config.train);
  costs.activationBytes = profile.activationBytes;
  costs.inputBytes = inputBytesOf(profile.outputShapes, chunk.targets.size(0));
  costs.chunks = config.parallel.chunks;
  // Position i of the pipelines: its slowest device and its smallest cap, as the run does.
  const size_t stages = size_t(config.parallel.pipeline);
  const size_t replicas = config.devices.size() / stages;
  for (size_t i = 0; i < stages; ++i) {
    double slowest = 0;
    int64_t cap = 0;
    for (size_t j = 0; j < replicas; ++j) {
      const DeviceConfig& d = config.devices[j * stages + i];
      slowest = std::max(slowest, slowdownAt(d, 0));
      if (d.memoryBytes > 0 && (cap == 0 || d.memoryBytes < cap)) cap = d.memoryBytes;
    }
    std::vector<double> row;
    for (double t : profile.seconds) row.push_back(t * slowest);
    costs.seconds.push_back(std::move(row));
    costs.memoryBytes.push_back(plannedCap(cap));
  }
  const balance::OrderedPartition ordered = choosePartition(config.parallel.partition, costs);
  const balance::Partition& chosen = ordered.partition;
  const auto deviceAt = [&](size_t replica, size_t stage) -> const DeviceConfig& {
    return config.devices[replica * stages + size_t(ordered.order[stage])];
  };
  const auto names = model->blockNames();
  std::string text = str(
      "# Pipeline: parallel.partition = \"", config.parallel.partition, "\"", ", ", chosen.stages(),
      " stages, ", costs.chunks, " chunks; from a profile of one chunk of ", chunk.targets.size(0),
      " samples on one thread of this host, times each device's ", "slowdown:\n");
  if (replicas > 1)
    text += str("#   ", replicas, " pipelines as data-parallel replicas, each stage sized for the ",
                "slowest device at its position; the balancer splits the global batch between ",
                "the pipelines by their measured step times\n");
  for (int i = 0; i < chosen.stages(); ++i) {
    std::string on;
    for (size_t j = 0; j < replicas; ++j) on += str(j ? ", " : "", deviceAt(j, size_t(i)).name);
    text += str("#   stage ", i, " on ", on, ": blocks ",
                blockRange(names, chosen.bounds[size_t(i)], chosen.bounds[size_t(i) + 1]), " (",
                chosen.blocksOf(i), "), ", formatMillis(chosen.stageSeconds[size_t(i)]),
                " per chunk, ", device::readableBytes(chosen.stageBytes[size_t(i)]), "\n");
  }
  if (!std::is_sorted(ordered.order.begin(), ordered.order.end()))
    text +=
        "#   the stages' devices are not in [[devices]] order: this order's partition is "
        "more than 5% faster than the best in the given order, or the only one that fits\n";
  text += str("#   predicted step time ", formatMillis(chosen.stepSeconds),
              " (1F1B: sum of the stages + (chunks - 1) x the slowest)");
  const double even = evenStepSeconds(costs);
  if (config.parallel.partition != "even")
    text += even > 0 ? str("; an even partition: ", formatMillis(even))
                     : std::string("; an even partition does not fit the memory");
  if (replicas > 1) {
    // Each pipeline's own 1F1B step over the partition with the whole batch, T_j; shares in
    // proportion to 1 / T_j end together at 1 / sum_j (1 / T_j) (stage times taken as
    // proportional to the chunk's samples).
    double rate = 0;
    std::string each;
    for (size_t j = 0; j < replicas; ++j) {
      std::vector<double> w;
      for (size_t i = 0; i < stages; ++i) {
        double seconds = 0;
        for (int64_t b = chosen.bounds[i]; b < chosen.bounds[i + 1]; ++b)
          seconds += profile.seconds[size_t(b)];
        w.push_back(seconds * slowdownAt(deviceAt(j, i), 0));
      }
      const double t = balance::oneFOneBStepSeconds(w, costs.chunks);
      each += str(j ? ", " : "", formatMillis(t));
      rate += 1.0 / t;
    }
    text += str("\n#   each pipeline alone with the whole batch: ", each, "; split by speed, the ",
                replicas, " together: ", formatMillis(1.0 / rate), " a step");
  }
  return text + "\n";
}

}  // namespace hetra::train::pipeline
