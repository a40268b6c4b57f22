#include "train/trainer.h"

#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>

#include "balance/balancer.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/timeline.h"
#include "device/compute_scope.h"
#include "device/memory_accounting.h"
#include "device/slowdown.h"
#include "train/checkpoint.h"
#include "train/data_parallel.h"
#include "train/datasets.h"
#include "train/device_memory.h"
#include "train/evaluate.h"
#include "train/global_batch.h"
#include "train/models.h"
#include "train/optim.h"
#include "train/periodic_sync.h"
#include "train/pipeline/pipeline_trainer.h"
#include "train/precision.h"
#include "train/rank_device.h"
#include "train/report.h"
#include "train/sampler.h"
#include "train/shard_follower.h"
#include "train/specs.h"
#include "train/tensor_parallel_trainer.h"
#include "train/zero_parallel.h"
#include "train/zero_plan.h"

namespace hetra::train {
namespace {

// What every rank reports about a step, all-gathered as float64: the fixed fields, then up to
// kMaxObservations (micro-batch size, seconds) pairs for the balancer.
constexpr int kMaxObservations = 8;
// Bytes are this step's payload bytes through this rank's transport (after compression).
enum StatField {
  kLossSum,
  kSamples,
  kComputeSeconds,
  kCommSeconds,
  kBytesSent,
  kBytesReceived,
  kObservations,
  kActivationSamples,  // the step's largest micro-batch, its activations and the device's peak
  kActivationBytes,
  kActivationDevicePeak,
  kUpdateElements,  // ZeRO: the shard this step's optimizer updated, and its seconds of compute
  kUpdateSeconds,
  kStepCostSeconds,  // outside the micro-batches, whatever the share: the balancer's step cost
  kReplicaDrift,     // a step that re-synchronised the replicas: how far this one had drifted
  kPeakBytes,  // device memory: the device categories' peak, -1 when unknown; then each category's
  kMemoryFirst,
  kFixedFields = kMemoryFirst + int(device::kMemoryCategories)
};
constexpr size_t kStatFields = kFixedFields + 2 * kMaxObservations;

// Splits b samples into k micro-batches as even as possible (sizes differ by at most one).
std::vector<int64_t> microBatchSizes(int64_t batch, int64_t accum) {
  std::vector<int64_t> sizes;
  if (batch <= 0) return sizes;
  accum = std::max<int64_t>(1, std::min(accum, batch));
  for (int64_t j = 0; j < accum; ++j) sizes.push_back(batch / accum + (j < batch % accum ? 1 : 0));
  return sizes;
}

// The most micro-batches any rank runs under `plan` (ZeRO-3's gathers follow it on every rank).
int64_t mostMicroBatches(const balance::Plan& plan) {
  int64_t most = 0;
  for (const auto& r : plan.ranks)
    most = std::max<int64_t>(most, int64_t(microBatchSizes(r.batch, r.accumSteps).size()));
  return most;
}

std::vector<int64_t> batchesOf(const balance::Plan& plan) {
  std::vector<int64_t> out;
  for (const auto& r : plan.ranks) out.push_back(r.batch);
  return out;
}

// A balancer decision as the timeline's event arguments (common/timeline.h).
std::string planArgs(const balance::Plan& plan) {
  std::string split;
  for (int64_t batch : batchesOf(plan)) split += (split.empty() ? "" : ",") + std::to_string(batch);
  return str("\"version\":", plan.version, ",\"split\":[", split,
             "],\"reason\":", timeline::jsonString(plan.reason));
}

class Run {
 public:
  Run(const RunConfig& config, std::shared_ptr<comm::Communicator> comm,
      const TrainerOptions& options)
      : config_(config),
        comm_(std::move(comm)),
        options_(options),
        device_(config, comm_->rank()),
        computeClocks_(device::ComputeClocks::ofThisProcess(int(device_.config.threads))) {
    HETRA_ENFORCE_EQ(size_t(comm_->size()), config.devices.size(), "one rank per device");
    makeDataAndModel();
    DataParallelOptions parallelOptions;
    parallelOptions.bucketBytes = size_t(config.train.bucketMib * (1 << 20));
    // [comm] compression is the policy of the gradients' allreduce (comm/policy.h).
    parallelOptions.compression = comm::CompressionPolicy(
        comm::parseCompression(config.comm.compression), size_t(config.comm.compressionBlock),
        size_t(config.comm.compressionMinBytes));
    parallelOptions.errorFeedback = config.comm.errorFeedback;
    if (config.zero.stage > 0) {
      makeZero(parallelOptions);
    } else {
      device::MemoryScope buckets(device::MemoryCategory::kCommunication);
      parallel_ = std::make_unique<DataParallel>(model_, comm_, parallelOptions);
    }
    // train.global_batch = 0: the sum of the caps the balancer gets (train/global_batch.h), the
    // same on every rank; from here on config_ holds the resolved batch.
    const std::vector<balance::RankCaps> caps = zero_ ? zeroCaps_ : rankCapsOf(config_, footprint_);
    globalBatch_ = globalBatchOf(config_, caps);
    config_.train.globalBatch = globalBatch_.samples;
    device_.memory.trackGradients(model_->parameters());
    optimizer_ = makeOptimizer(model_->parameters(), optimSpecOf(config_.train));
    sampler_ = std::make_unique<GlobalSampler>(trainData_->size(), config_.train.globalBatch,
                                               uint64_t(config_.train.seed));
    totalSteps_ =
        config_.train.steps > 0 ? config_.train.steps : sampler_->stepsFor(config_.train.epochs);
    resyncEvery_ = resyncEveryOf(config_);
    if (config_.train.syncEvery > 1)
      periodic_ = std::make_unique<PeriodicSync>(
          model_, *optimizer_, comm_, periodicSyncOptionsOf(config_, totalSteps_, parallelOptions));
    schedule_ = std::make_unique<LrSchedule>(scheduleSpecOf(config_.train, totalSteps_));
    balancer_ = std::make_unique<balance::Balancer>(balancerOptionsOf(config_), caps);
    TrainingParts parts{*model_, *optimizer_, *balancer_, parallel_.get()};
    parts.periodic = periodic_.get();
    parts.zero = zero_.get();  // a sharded run saves and resumes its shards (resharding)
    if (zero_) parts.makeReplica = makeReplica_;  // to read a data-parallel checkpoint
    checkpoints_.emplace(config_, *comm_, parts);
    const auto resumed = [&] {
      device::MemoryScope state(device::MemoryCategory::kOptimizerState);  // loaded on resume
      return checkpoints_->start(options.resumeDir);
    }();
    startStep_ = resumed.step;
    if (resumed.dir.empty() && !zero_) parallel_->broadcastParameters();
    followLeftOut();  // a resumed balancer may have left ranks out
    ReportOptions reportOptions;
    reportOptions.enabled = device_.rank == 0 && options.report;
    reportOptions.metricsPath = options.metricsPath;
    reportOptions.appendMetrics = startStep_ > 0 || options.appendMetrics;
    reportOptions.progressBar = options.progressBar;
    reportOptions.logEvery = config_.train.logEvery;
    reportOptions.totalSteps = totalSteps_;
    reportOptions.globalBatch = config_.train.globalBatch;
    report_.emplace(reportOptions);
    if (!resumed.dir.empty()) report_->resumed(resumed.dir, resumed.step);
  }

  // An all-gather still in flight (an exception left the loop) writes into pending_: let it end,
  // successfully or with the group's latched error, before its buffers go.
  ~Run() {
    if (pending_ && pending_->work) try {
        pending_->work->wait(deadlineAfter(Millis(60000)));
      } catch (const std::exception&) {
      }
  }

  TrainResult run() {
    TrainResult result;
    const auto start = Clock::now();
    // Throughput is averaged after a warm-up that covers the balancer's profiling.
    const int64_t warmup =
        std::min<int64_t>(std::max<int64_t>(10, config_.balance.profileSteps + 5),
                          std::max<int64_t>(0, (totalSteps_ - startStep_) / 3));
    double measuredSeconds = 0;
    int64_t measuredSamples = 0;
    report_->start(header());
    if (zero_)
      report_->shardPlan(
          config_.zero.stage, config_.zero.shards, zeroBytes_.psi,
          shardPlanRows(config_, zeroBytes_, zero_->layout().shardSizes(), zeroCaps_));
    for (int64_t step = startStep_; step < totalSteps_; ++step) {
      const double seconds = trainStepOrSayWhatFits(step);
      if (step - startStep_ >= warmup) {
        measuredSeconds += seconds;
        measuredSamples += config_.train.globalBatch;
      }
      const bool last = step + 1 == totalSteps_;
      if (config_.train.evalEvery > 0 && ((step + 1) % config_.train.evalEvery == 0) && !last)
        evaluateAt(step + 1, result);
      if (config_.train.checkpointEvery > 0 && (step + 1) % config_.train.checkpointEvery == 0) {
        drain();           // the saved balancer has seen every step before the checkpoint
        catchUpLeftOut();  // rank 0 saves the model and its optimizer's state
        timeline::Span span(timeline::Lane::Compute, "checkpoint", "checkpoint");
        checkpoints_->save(step + 1);
      }
    }
    drain();
    result.lastLoss = lastLoss_;
    evaluateAt(totalSteps_, result);  // brings left-out ranks up to date: every replica ends alike
    result.steps = totalSteps_;
    result.wallSeconds = secondsSince(start);
    result.samplesPerSecond = measuredSeconds > 0
                                  ? double(measuredSamples) / measuredSeconds
                                  : double((totalSteps_ - startStep_) * config_.train.globalBatch) /
                                        std::max(1e-9, result.wallSeconds);
    report_->finish(result);
    return result;
  }

 private:
  // A step's all-gather of timings in flight; its buffers live here until drain().
  struct PendingGather {
    int64_t step = 0;
    double seconds = 0;
    balance::Plan plan;
    std::vector<double> report, all;
    comm::WorkPtr work;
  };

  // A program's own data and model (TrainerOptions) replace the config's. A custom model's
  // footprint stays unknown (zero), which rankCapsOf reads as no cap.
  void makeDataAndModel() {
    std::tie(trainData_, testData_) = loadTrainAndTestData(config_, options_);
    // Under ZeRO the whole model is built in host memory, and only shards reach the device.
    const auto built = config_.zero.stage > 0 ? device::MemoryCategory::kHostData
                                              : device::MemoryCategory::kParameters;
    if (options_.makeModel) {
      device::MemoryScope parameters(built);
      makeReplica_ = options_.makeModel;
      model_ = options_.makeModel();
      HETRA_ENFORCE(model_, "TrainerOptions::makeModel returned no model");
      return;
    }
    const DatasetGeometry loaded{trainData_->inputShape(), trainData_->classes()};
    // A program's own dataset has no geometry in the config; the config's must match what loaded.
    const DatasetGeometry geometry = options_.makeDataset ? loaded : datasetGeometry(config_.data);
    HETRA_ENFORCE(geometry == loaded, "dataset shape differs from the one the config implies");
    const ModelSpec spec = modelSpecOf(config_, geometry);
    makeReplica_ = [spec] { return makeModel(spec); };
    {
      device::MemoryScope parameters(built);
      model_ = makeModel(spec);
    }
    footprint_ = estimateFootprint(spec);  // builds a model of its own: host memory, not counted
  }

  // ZeRO's engine with the plan's shards (train/zero_plan.h); the micro-batch caps that follow.
  void makeZero(const DataParallelOptions& parallelOptions) {
    zeroBytes_ = shardedBytesOf(config_, *model_);
    const ShardedBytes& bytes = zeroBytes_;
    ZeroOptions options;
    options.stage = int(config_.zero.stage);
    options.optimizer = optimSpecOf(config_.train);
    options.prefetch = config_.zero.prefetch;
    options.shardSizes = planShards(config_, bytes, bytes.psi, footprint_.bytesPerSample);
    options.offload = offloadOf(config_, size_t(comm_->rank()));
    options.compression = parallelOptions.compression;  // the gradients', as data parallelism's
    options.errorFeedback = parallelOptions.errorFeedback;
    zero_ = std::make_unique<ZeroParallel>(model_, comm_, options);
    zeroCaps_ = shardedRankCaps(config_, bytes, options.shardSizes, footprint_.bytesPerSample);
    // Error feedback's residuals belong to the pieces each rank encodes: the shards stay put.
    const bool feedback = config_.comm.compression != "none" && config_.comm.errorFeedback;
    if (config_.zero.shards == "memory" && config_.zero.followSpeed && !feedback)
      follower_.emplace(memoryBounds(config_, bytes, options.shardSizes));
  }

  // A step; a rank past its memory cap fails saying what would fit (train/device_memory.h). The
  // plan is still the failing step's: it changes only once the step's timings are in.
  double trainStepOrSayWhatFits(int64_t step) {
    try {
      return trainStep(step);
    } catch (const DeviceOutOfMemoryError& e) {
      throw withWhatFits(e, config_, options_.makeModel, *trainData_,
                         balancer_->plan().ranks[size_t(device_.rank)].microBatch, device_.rank);
    }
  }

  // The four parts of one data-parallel step (docs/architecture.md); returns its seconds.
  double trainStep(int64_t step) {
    const auto stepStart = Clock::now();
    timeline::Span span(timeline::Lane::Compute, "step", "step");
    span.arg("step", step + 1);
    // 1. This rank's slice of the step's global batch, as the balancer's plan splits it.
    const balance::Plan plan = balancer_->plan();
    const auto& mine = plan.ranks[size_t(device_.rank)];
    if (mine.leftOut) {
      // No samples, no step, no gradients (balance/balancer.h, "left out"): the rank only keeps
      // pace through the timings' all-gather, which every rank joins.
      // Its step lasts until the others' previous one is in: the pace it reports as rank 0.
      drain();
      std::vector<double> report(kStatFields, 0.0);
      report[kStepCostSeconds] = -1.0;
      const double seconds = secondsSince(stepStart);
      shareTimings(step, plan, std::move(report));
      pending_->seconds = seconds;
      return seconds;
    }
    // A local step of periodic averaging (train/periodic_sync.h) takes the same share but
    // all-reduces nothing; its timings reach the balancer with the round's.
    const bool local = periodic_ && periodic_->localAt(step);
    std::vector<double> report(kStatFields, 0.0);
    const bool takesStep = !local || periodic_->takesStep(step);
    if (takesStep) {
      const auto indices = sampler_->indices(step, batchesOf(plan), device_.rank);
      if (zero_)
        zero_->beginStep(int64_t(microBatchSizes(mine.batch, mine.accumSteps).size()),
                         mostMicroBatches(plan));
      // 2. k micro-batches of at most m samples, summed gradients; 3. the last backward
      // all-reduces the gradient buckets as they become ready.
      report = runMicroBatches(indices, mine, slowdownAt(device_.config, step), local);
      if (zero_ && config_.zero.overlapUpdate && zero_->overlapsUpdate(config_.train.gradClip)) {
        overlappedZeroStep(step, report);  // 3. and 4. in one
      } else {
        {
          device::MemoryScope buckets(device::MemoryCategory::kCommunication);
          if (!local) {
            timeline::Span wait(timeline::Lane::Compute, "comm", "wait for gradients");
            report[kCommSeconds] = zero_ ? zero_->finish() : parallel_->finish(1);
          }
          device_.memory.adoptGradients();
        }
        // 4. The optimizer step, then the timings go to the balancer.
        optimizerStep(step, report);
        if (!local && resynchronizesAt(step)) {
          timeline::Span resync(timeline::Lane::Compute, "comm", "re-synchronise replicas");
          report[kReplicaDrift] = parallel_->resynchronize();
        }
      }
      if (local) periodic_->tookStep(mine.batch);
    }
    if (local) {
      addToRound(report, stepStart, takesStep);
      if (!periodic_->endsRound(step)) return secondsSince(stepStart);
      report = std::move(round_.report);
      round_.report.clear();  // the next local step starts the next round
      // The balancer's model is per step: the mean over the steps this rank took (in time mode a
      // slow rank skips some); -1, no observation, where it took none.
      report[kStepCostSeconds] =
          round_.stepsTaken > 0 ? report[kStepCostSeconds] / double(round_.stepsTaken) : -1.0;
      report[kCommSeconds] += periodic_->average();
    }
    if (options_.replicaGroup && options_.replicaGroup->size() > 1)
      options_.replicaGroup->broadcast(report.data(), report.size(), DType::F64, 0)->wait();
    const double seconds = secondsSince(stepStart);
    shareTimings(step, plan, std::move(report));
    pending_->seconds = local ? secondsSince(std::exchange(round_, {}).start) : seconds;
    return seconds;
  }

  void optimizerStep(int64_t step, std::vector<double>& report) {
    const auto start = Clock::now();
    timeline::Span optimizerSpan(timeline::Lane::Compute, "compute", "optimizer step");
    {
      device::MemoryScope state(device::MemoryCategory::kOptimizerState);
      // An offloaded shard is updated by the host's CPU, which the device's slowdown does not
      // stretch.
      const bool onHost = zero_ && zero_->offload() != Offload::kNone;
      device::ComputeScope segment(emulator_, onHost ? 1.0 : slowdownAt(device_.config, step),
                                   computeClocks_);
      if (zero_) {
        zero_->updateShard(schedule_->lrAt(step), config_.train.gradClip);
        segment.end();
        report[kUpdateElements] = double(zero_->ownShard().size());
        report[kUpdateSeconds] = segment.computingSeconds();
      } else {
        if (config_.train.gradClip > 0) clipGradNorm(model_->parameters(), config_.train.gradClip);
        applyLr(*optimizer_, schedule_->lrAt(step));
        optimizer_->step();
        if (options_.afterOptimizerStep) options_.afterOptimizerStep(model_->parameters(), step);
      }
    }
    if (zero_) {
      report[kCommSeconds] += zero_->shareParameters();  // not a compute segment
    } else {
      parallel_->clearGradients();
      // Each rank updates every parameter after the all-reduce and before its next micro-batch,
      // at its own speed: a step cost for the balancer (balance/throughput_model.h). ZeRO's update
      // lies between two collectives instead, where the slowest shard sets everyone's pace and
      // the batch split cannot help (the shard follower does).
      report[kStepCostSeconds] = secondsSince(start);
    }
  }

  // ZeRO stage 1 without clipping: finish, update and share overlapped
  // (ZeroParallel::finishAndUpdate), each group's update a compute segment of its own, so that an
  // emulated device sleeps its slowdown before the group's all-gather, as after any segment.
  void overlappedZeroStep(int64_t step, std::vector<double>& report) {
    // An offloaded shard is updated by the host's CPU, which the device's slowdown does not
    // stretch.
    const double slowdown =
        zero_->offload() != Offload::kNone ? 1.0 : slowdownAt(device_.config, step);
    OverlappedStep spent;
    {
      device::MemoryScope buckets(device::MemoryCategory::kCommunication);
      timeline::Span wait(timeline::Lane::Compute, "comm", "wait for gradients, update, gather");
      spent = zero_->finishAndUpdate(schedule_->lrAt(step), [&](const std::function<void()>& work) {
        timeline::Span update(timeline::Lane::Compute, "compute", "optimizer step");
        device::MemoryScope state(device::MemoryCategory::kOptimizerState);
        device::ComputeScope segment(emulator_, slowdown, computeClocks_);
        work();
        segment.end();
        return segment.computingSeconds();
      });
      device_.memory.adoptGradients();
    }
    report[kCommSeconds] = spent.waitedSeconds;
    report[kUpdateElements] = double(zero_->ownShard().size());
    report[kUpdateSeconds] = spent.updateSeconds;
  }

  // Sums a local step's report into its round's: the fields, and its observations while there is
  // room for them.
  void addToRound(const std::vector<double>& step, Clock::time_point stepStart, bool taken) {
    auto& total = round_.report;
    if (total.empty()) {
      total.assign(kStatFields, 0.0);
      round_.start = stepStart;
      round_.stepsTaken = 0;
    }
    for (int f : {kLossSum, kSamples, kComputeSeconds, kCommSeconds, kStepCostSeconds})
      total[f] += step[f];
    if (taken) ++round_.stepsTaken;
    // The round's activations are its largest micro-batch's (DeviceMemory::endMicroBatch's rule).
    if (std::pair(step[kActivationSamples], step[kActivationDevicePeak]) >
        std::pair(total[kActivationSamples], total[kActivationDevicePeak]))
      for (int f : {kActivationSamples, kActivationBytes, kActivationDevicePeak})
        total[f] = step[f];
    for (int o = 0; o < int(step[kObservations]) && total[kObservations] < kMaxObservations; ++o) {
      const size_t at = kFixedFields + 2 * size_t(total[kObservations]);
      total[at] = step[kFixedFields + 2 * o];
      total[at + 1] = step[kFixedFields + 2 * o + 1];
      ++total[kObservations];
    }
  }

  // Forward and backward of `indices` in micro-batches; returns the step's report with every
  // field but the communication's filled in.
  // A local step's loss is divided by this rank's share instead: its gradient is its own mean.
  std::vector<double> runMicroBatches(const std::vector<int64_t>& indices,
                                      const balance::RankAssignment& mine, double slowdown,
                                      bool local) {
    const double lossScale = 1.0 / double(local ? mine.batch : config_.train.globalBatch);
    const auto sizes = microBatchSizes(mine.batch, mine.accumSteps);
    std::vector<double> report(kStatFields, 0.0);
    report[kSamples] = double(mine.batch);
    int observations = 0;
    size_t offset = 0;
    for (size_t j = 0; j < sizes.size(); ++j) {
      const std::vector<int64_t> part(indices.begin() + long(offset),
                                      indices.begin() + long(offset + sizes[j]));
      offset += size_t(sizes[j]);
      const auto computeStart = Clock::now();
      // Stage 3 gathers each block inside forward and backward: waiting there is the slowest
      // rank's pace, not this device's, and would hide every speed difference from the balancer.
      const double waitedBefore = zero_ ? zero_->waitedSeconds() : 0.0;
      // Gathering the samples is the host's data loading: timed with the micro-batch, for the
      // balancer, but not part of the device's forward+backward that the emulation slows down.
      timeline::Span data(timeline::Lane::Compute, "compute", "data");
      Batch batch = trainData_->get(part);
      data.end();
      device::MemoryScope activations(device::MemoryCategory::kActivations);
      device_.memory.startMicroBatch();
      // An emulated device of slowdown s takes s times the segment's work (device/compute_scope.h).
      device::ComputeScope segment(emulator_, slowdown, computeClocks_);
      timeline::Span forward(timeline::Lane::Compute, "compute", "forward");
      forward.arg("micro_batch", int64_t(j)).arg("samples", sizes[j]);
      std::optional<ForwardPrecision> precision(std::in_place, config_.train.precision);
      auto logits = model_->forward(batch.inputs);
      // Summed over the micro-batch and divided by the global batch B, so the all-reduced sum is
      // the gradient of the mean loss over the global batch, whatever the split: DataParallel then
      // needs no pass over the gradients to divide them (finish(1)).
      auto loss = torch::nn::functional::cross_entropy(
          logits, batch.targets,
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      precision.reset();
      forward.end();
      timeline::Span backward(timeline::Lane::Compute, "compute", "backward");
      backward.arg("micro_batch", int64_t(j));
      if (j + 1 == sizes.size() && !local)
        zero_ ? zero_->armLastBackward() : parallel_->armLastBackward();
      (loss * lossScale).backward();
      report[kLossSum] += loss.item<double>();
      backward.end();
      device_.memory.endMicroBatch(sizes[j]);
      segment.end();  // the emulation's sleep, on the timeline as "slowdown sleep"
      const double seconds =
          secondsSince(computeStart) - (zero_ ? zero_->waitedSeconds() - waitedBefore : 0.0);
      report[kComputeSeconds] += seconds;
      if (observations < kMaxObservations) {
        report[kFixedFields + 2 * observations] = double(sizes[j]);
        report[kFixedFields + 2 * observations + 1] = seconds;
        ++observations;
      }
    }
    report[kObservations] = observations;
    const ActivationMeasurement measured = device_.memory.takeMeasurement();
    report[kActivationSamples] = double(measured.samples);
    report[kActivationBytes] = double(measured.bytes);
    report[kActivationDevicePeak] = double(measured.devicePeak);
    return report;
  }

  // Whether rank 0's parameters replace the others' after `step` (train.resync_every): data
  // parallelism only; ZeRO's replicas cannot drift (each parameter is updated by its one owner and
  // all-gathered), and a local step of periodic averaging keeps its own replica by design.
  bool resynchronizesAt(int64_t step) const {
    return resyncEvery_ > 0 && !zero_ && !(periodic_ && periodic_->localAt(step)) &&
           (step + 1) % resyncEvery_ == 0;
  }

  // All-gathers the step's report in the background; it reaches the balancer at the end of the
  // next step (or at the next drain()): waiting for it at once would add a synchronisation of all
  // ranks, and with it every rank's optimizer step on the critical path, to every step.
  void shareTimings(int64_t step, const balance::Plan& plan, std::vector<double> report) {
    const comm::Communicator* group = gradientGroupApart();
    const uint64_t sent = comm_->bytesSent() + (group ? group->bytesSent() : 0);
    const uint64_t received = comm_->bytesReceived() + (group ? group->bytesReceived() : 0);
    report[kBytesSent] = double(sent - bytesSentBefore_);
    report[kBytesReceived] = double(received - bytesReceivedBefore_);
    reportMemory(device_.memory, report.data() + kPeakBytes, report.data() + kMemoryFirst);
    bytesSentBefore_ = sent;
    bytesReceivedBefore_ = received;
    drain();
    auto& gather = pending_.emplace();
    gather.step = step;
    gather.plan = plan;
    gather.report = std::move(report);
    gather.all.resize(kStatFields * size_t(comm_->size()));
    gather.work =
        comm_->allgather(gather.report.data(), gather.all.data(),
                         std::vector<size_t>(size_t(comm_->size()), kStatFields), DType::F64);
  }

  // Feeds the pending step's all-gathered timings to the balancer (identically on every rank) and
  // reports the step.
  void drain() {
    if (!pending_) return;
    pending_->work->wait();
    PendingGather gather = std::move(*pending_);
    pending_.reset();
    StepRecord record;
    record.step = gather.step + 1;
    record.epoch = sampler_->epochsAfter(gather.step + 1);
    record.seconds = gather.seconds;
    record.lr = schedule_->lrAt(gather.step);
    record.planVersion = gather.plan.version;
    double lossSum = 0, samples = 0;  // a round's: every local step's samples
    for (int r = 0; r < comm_->size(); ++r) {
      const double* row = gather.all.data() + size_t(r) * kStatFields;
      lossSum += row[kLossSum];
      samples += row[kSamples];
      for (int o = 0; o < int(row[kObservations]); ++o)
        balancer_->observe(r, int64_t(row[kFixedFields + 2 * o]), row[kFixedFields + 2 * o + 1]);
      if (row[kStepCostSeconds] >= 0.0) balancer_->observeStepCost(r, row[kStepCostSeconds]);
      const auto& share = gather.plan.ranks[size_t(r)];
      record.ranks.push_back({config_.devices[size_t(r)].name, share.batch, share.microBatch,
                              share.accumSteps, row[kComputeSeconds], row[kCommSeconds],
                              int64_t(row[kBytesSent]), int64_t(row[kBytesReceived]),
                              int64_t(row[kPeakBytes])});
      record.ranks.back().leftOut = share.leftOut;
      for (size_t c = 0; c < device::kMemoryCategories; ++c)
        record.ranks.back().memory[c] = int64_t(row[kMemoryFirst + c]);
      // The micro-batch bound follows what the rank measured (the same rows on every rank), from
      // the second step on: the first one's optimizer step allocates the optimizer's state.
      const int64_t bound =
          measuredMicroBatchBound(config_.devices[size_t(r)],
                                  {int64_t(row[kActivationSamples]), int64_t(row[kActivationBytes]),
                                   int64_t(row[kActivationDevicePeak])});
      if (bound > 0 && gather.step > startStep_) balancer_->setMaxMicroBatch(r, bound);
      // The follower measures each rank's optimizer on the shards it holds now, not on those of
      // a step before a move.
      if (follower_ && gather.step > startStep_ &&
          int64_t(row[kUpdateElements]) == zero_->layout().shard(r).size())
        follower_->observe(r, int64_t(row[kUpdateElements]), row[kUpdateSeconds]);
    }
    // The communication no rank's compute hid: what the last rank out of backward still waited
    // (balance/balancer.h, "left out").
    const std::vector<bool> out = gather.plan.leftOut();
    if (!zero_ && std::count(out.begin(), out.end(), false) > 1) {
      double unhidden = std::numeric_limits<double>::infinity();
      for (int r = 0; r < comm_->size(); ++r)
        if (!out[size_t(r)])
          unhidden = std::min(unhidden, gather.all[size_t(r) * kStatFields + kCommSeconds]);
      balancer_->observeCommunication(unhidden);
    }
    if (resynchronizesAt(gather.step)) {
      record.replicaDrift = 0;
      for (int r = 0; r < comm_->size(); ++r)
        record.replicaDrift =
            std::max(record.replicaDrift, gather.all[size_t(r) * kStatFields + kReplicaDrift]);
    }
    const bool changed = balancer_->endStep(gather.step);
    record.loss = lastLoss_ = lossSum / std::max(1.0, samples);
    record.idealSamplesPerSecond = balancer_->idealSamplesPerSecond();
    record.regret = balancer_->regret();
    report_->step(record);
    if (changed) {
      followLeftOut();
      report_->balanceChange(record.step, balancer_->plan());
      if (timeline::active())
        timeline::instant(timeline::Lane::Balance, "balance", "new split",
                          planArgs(balancer_->plan()));
    }
    if (follower_ && record.step < totalSteps_) followSpeed(record.step);  // none after the last
  }

  // ZeRO's shards re-sized by the measured optimizer speeds (train/shard_follower.h). Every rank
  // decides alike, from the all-gathered timings, between two steps.
  void followSpeed(int64_t step) {
    const auto next = follower_->proposal(zero_->layout().shardSizes());
    if (!next) return;
    {
      timeline::Span span(timeline::Lane::Compute, "comm", "move shards");
      zero_->reshard(*next);
    }
    follower_->resharded();
    report_->shardsMoved(step, *next);
  }

  // The gradient group follows the plan's left-out ranks: every rank splits the world alike, at
  // the same drain, when the balancer leaves a rank out (balance/balancer.h, "left out").
  void followLeftOut() {
    const std::vector<bool> out = balancer_->plan().leftOut();
    if (!parallel_ || out == groupLeftOut_) return;
    if (groupLeftOut_.empty() && std::count(out.begin(), out.end(), true) == 0) {
      groupLeftOut_ = out;  // the world itself
      return;
    }
    groupLeftOut_ = out;
    // The world's transport, listen address, islands (the members'), providers and links.
    const comm::GroupOptions& group = comm_->groupOptions();
    const bool mine = out[size_t(device_.rank)];
    // The counters at the last step counted the old group's bytes, which the next step's will not.
    if (const comm::Communicator* old = gradientGroupApart()) {
      bytesSentBefore_ -= old->bytesSent();
      bytesReceivedBefore_ -= old->bytesReceived();
    }
    parallel_->setGradientGroup(comm_->split(mine ? -1 : 0, device_.rank, group));
    if (mine)  // its replica is brought up to date where one is needed (catchUpLeftOut)
      HETRA_INFO("train", "rank ", device_.rank, " (", device_.config.name,
                 ") is left out: it idles until the run ends");
  }

  // The gradient group where it is not the world (ranks left out), else nullptr: its transport's
  // bytes are the rank's too.
  const comm::Communicator* gradientGroupApart() const {
    if (!parallel_ || parallel_->gradientGroup() == comm_) return nullptr;
    return parallel_->gradientGroup().get();
  }

  // A left-out rank's replica stopped at the step it left: the first rank still in the gradient
  // group hands it its parameters, buffers and optimizer state, so that evaluation, checkpoints
  // and the end of the run see the same model on every rank. Collective over the world.
  void catchUpLeftOut() {
    const auto first = std::find(groupLeftOut_.begin(), groupLeftOut_.end(), false);
    if (!parallel_ || std::count(groupLeftOut_.begin(), groupLeftOut_.end(), true) == 0) return;
    const int root = int(first - groupLeftOut_.begin());
    timeline::Span span(timeline::Lane::Compute, "comm", "bring left-out ranks up to date");
    std::vector<torch::Tensor> tensors = model_->parameters();
    for (auto& b : model_->buffers()) tensors.push_back(b);
    adoptRootValues(*comm_, tensors, root);
    adoptRootOptimizerState(*comm_, *optimizer_, root);
  }

  void evaluateAt(int64_t step, TrainResult& result) {
    drain();  // the split of the test set follows the plan, which must be the same on every rank
    catchUpLeftOut();
    timeline::Span span(timeline::Lane::Compute, "eval", "evaluate");
    device::MemoryScope activations(device::MemoryCategory::kActivations);
    const Evaluation e =
        evaluate(*model_, *testData_, balancer_->plan(), config_.train.globalBatch, *comm_,
                 zero_ ? [this] { zero_->forwardWithoutSamples(); } : std::function<void()>());
    result.testLoss = e.loss;
    result.testAccuracy = e.accuracy;
    report_->evaluation(step, e.loss, e.accuracy);
  }

  RunHeader header() const {
    RunHeader h;
    h.model = !options_.makeModel          ? config_.model.name
              : options_.modelName.empty() ? std::string("a custom model")
                                           : options_.modelName;
    h.data = trainData_->name();
    h.transport = comm_->transportName();
    h.balance = config_.balance.mode;
    h.devices = comm_->size();
    h.globalBatch = config_.train.globalBatch;
    if (globalBatch_.fromMemory) h.globalBatchFrom = globalBatch_.text;
    h.steps = totalSteps_;
    h.trainSamples = trainData_->size();
    h.parameters = parameterCount(*model_);
    h.epochs = sampler_->epochsAfter(totalSteps_);
    h.buckets = zero_ ? 0 : parallel_->bucketCount();
    return h;
  }

  RunConfig config_;  // the run's, train.global_batch resolved once the caps are known
  GlobalBatch globalBatch_;
  std::shared_ptr<comm::Communicator> comm_;
  TrainerOptions options_;
  RankDevice device_;  // before every member that allocates tensors
  device::ComputeClocks computeClocks_;
  std::shared_ptr<const Dataset> trainData_, testData_;
  std::shared_ptr<Model> model_;
  std::function<std::shared_ptr<Model>()> makeReplica_;  // another model_, as built at the start
  MemoryFootprint footprint_;
  std::unique_ptr<DataParallel> parallel_;  // zero.stage = 0
  std::unique_ptr<ZeroParallel> zero_;      // zero.stage >= 1 (train/zero_parallel.h)
  ShardedBytes zeroBytes_;                  // the plan of zero_ (train/zero_plan.h)
  std::vector<balance::RankCaps> zeroCaps_;
  std::optional<ShardFollower> follower_;   // ZeRO with shards = "memory" that follow speed
  std::unique_ptr<PeriodicSync> periodic_;  // train.sync_every > 1
  struct RoundReport {
    std::vector<double> report;  // summed over the round's local steps (addToRound)
    Clock::time_point start;     // of its first local step
    int stepsTaken = 0;          // local steps so far in which this rank trained
  } round_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  device::SlowdownEmulator emulator_;
  std::unique_ptr<GlobalSampler> sampler_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<balance::Balancer> balancer_;
  std::optional<RunCheckpoints> checkpoints_;
  std::optional<Report> report_;
  int64_t totalSteps_ = 0;
  int64_t startStep_ = 0;
  int64_t resyncEvery_ = 0;         // train.resync_every resolved (resyncEveryOf)
  std::vector<bool> groupLeftOut_;  // the ranks the gradient group leaves out (followLeftOut)
  double lastLoss_ = 0;
  uint64_t bytesSentBefore_ = 0, bytesReceivedBefore_ = 0;  // transport counters at the last step
  std::optional<PendingGather> pending_;
};

}  // namespace

std::pair<std::shared_ptr<const Dataset>, std::shared_ptr<const Dataset>> loadTrainAndTestData(
    const RunConfig& config, const TrainerOptions& options) {
  if (!options.makeDataset)
    return {makeDataset(dataSpecOf(config), /*train=*/true),
            makeDataset(dataSpecOf(config), /*train=*/false)};
  auto data =
      std::make_pair(options.makeDataset(/*train=*/true), options.makeDataset(/*train=*/false));
  HETRA_ENFORCE(data.first && data.second, "TrainerOptions::makeDataset returned no dataset");
  return data;
}

void checkModelFits(const RunConfig& config) {
  if (config.parallel.pipeline > 1) return;  // a stage holds part of it: the partition checks
  if (config.zero.stage > 0) return;  // shards are planned, and met by the allocator, per rank
  checkDeviceMemory(config);
}

TrainResult train(const RunConfig& config, std::shared_ptr<comm::Communicator> comm,
                  const TrainerOptions& options) {
  if (config.parallel.pipeline > 1) {
    globalBatchOf(config, {});  // refuses train.global_batch = 0, which validation refuses too
    return pipeline::train(config, std::move(comm), options);
  }
  if (config.parallel.tensor > 1) {
    if (options.makeModel)
      throw ConfigError(
          "parallel.tensor splits the built-in transformer; a program's own model "
          "(TrainerOptions::makeModel) is not split");
    return trainTensorParallel(config, std::move(comm), options);
  }
  Run run(config, std::move(comm), options);
  return run.run();
}

}  // namespace hetra::train
