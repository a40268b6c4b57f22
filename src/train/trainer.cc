#include "train/trainer.h"

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "balance/balancer.h"
#include "common/errors.h"
#include "common/logging.h"
#include "device/slowdown.h"
#include "train/data_parallel.h"
#include "train/datasets.h"
#include "train/models.h"
#include "train/optim.h"
#include "train/sampler.h"

namespace hetra::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

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
  kFixedFields
};
constexpr size_t kStatFields = kFixedFields + 2 * kMaxObservations;

// The shape of one sample and the number of classes, known from the config without loading data.
ModelSpec modelSpecOf(const RunConfig& config) {
  ModelSpec spec;
  spec.name = config.model.name;
  if (config.data.name == "synthetic") {
    spec.sampleShape = {config.data.features};
    spec.classes = config.data.classes;
  } else {
    spec.sampleShape = {1, 28, 28};
    spec.classes = 10;
  }
  spec.hidden = config.model.hidden;
  spec.channels = config.model.channels;
  spec.layers = config.model.layers;
  spec.heads = config.model.heads;
  spec.dim = config.model.dim;
  spec.seqLen = config.model.seqLen;
  spec.seed = uint64_t(config.train.seed);
  return spec;
}

// A device of N threads must use N cores, also inside BLAS: OpenBLAS keeps its own thread pool,
// sized for the whole machine and spinning between calls, which LibTorch's set_num_threads does not
// touch. Looked up at run time, so other BLAS libraries simply skip this.
void setComputeThreads(int threads) {
  torch::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set(threads);
}

double processCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Splits b samples into k micro-batches as even as possible (sizes differ by at most one).
std::vector<int64_t> microBatchSizes(int64_t batch, int64_t accum) {
  std::vector<int64_t> sizes;
  if (batch <= 0) return sizes;
  accum = std::max<int64_t>(1, std::min(accum, batch));
  for (int64_t j = 0; j < accum; ++j) sizes.push_back(batch / accum + (j < batch % accum ? 1 : 0));
  return sizes;
}

std::vector<int64_t> batchesOf(const balance::Plan& plan) {
  std::vector<int64_t> out;
  for (const auto& r : plan.ranks) out.push_back(r.batch);
  return out;
}

std::string splitText(const balance::Plan& plan) {
  std::string text;
  for (size_t i = 0; i < plan.ranks.size(); ++i)
    text += (i ? "/" : "") + std::to_string(plan.ranks[i].batch);
  return text;
}

// Writes `text` to `path` through a temporary file and a rename, so readers never see half a file.
void writeAtomically(const fs::path& path, const std::string& text) {
  writeFileAtomically(path.string(), text);
}

class Run {
 public:
  Run(const RunConfig& config, std::shared_ptr<comm::Communicator> comm,
      const TrainerOptions& options)
      : config_(config),
        comm_(std::move(comm)),
        options_(options),
        rank_(comm_->rank()),
        device_(config.devices.at(size_t(rank_))) {
    HETRA_ENFORCE_EQ(size_t(comm_->size()), config.devices.size(), "one rank per device");
    setComputeThreads(int(device_.threads));
    if (slowdownAt(device_, 0) > 1.0 || !device_.slowdownSchedule.empty())
      device::SlowdownEmulator::tightenTimerSlack();
    // A program's own data and model (TrainerOptions) replace the config's. A custom model's
    // footprint stays unknown (zero), which rankCaps reads as no cap.
    if (options.makeDataset) {
      trainData_ = options.makeDataset(/*train=*/true);
      testData_ = options.makeDataset(/*train=*/false);
      HETRA_ENFORCE(trainData_ && testData_, "TrainerOptions::makeDataset returned no dataset");
    } else {
      trainData_ = makeDataset(dataSpec(), /*train=*/true);
      testData_ = makeDataset(dataSpec(), /*train=*/false);
    }
    if (options.makeModel) {
      model_ = options.makeModel();
      HETRA_ENFORCE(model_, "TrainerOptions::makeModel returned no model");
    } else {
      ModelSpec spec = modelSpecOf(config);
      if (options.makeDataset) {
        spec.sampleShape = trainData_->inputShape();
        spec.classes = trainData_->classes();
      }
      HETRA_ENFORCE(
          spec.sampleShape == trainData_->inputShape() && spec.classes == trainData_->classes(),
          "dataset shape differs from the one the config implies");
      model_ = makeModel(spec);
      footprint_ = estimateFootprint(spec);
    }
    DataParallelOptions parallelOptions;
    parallelOptions.bucketBytes = size_t(config.train.bucketMib * (1 << 20));
    // [comm] compression is the policy of the gradients' allreduce (comm/policy.h).
    parallelOptions.compression = comm::CompressionPolicy(
        comm::parseCompression(config.comm.compression), size_t(config.comm.compressionBlock),
        size_t(config.comm.compressionMinBytes));
    parallelOptions.errorFeedback = config.comm.errorFeedback;
    parallel_ = std::make_unique<DataParallel>(model_, comm_, parallelOptions);
    optimizer_ = makeOptimizer(model_->parameters(), optimSpec());
    sampler_ = std::make_unique<GlobalSampler>(trainData_->size(), config.train.globalBatch,
                                               uint64_t(config.train.seed));
    totalSteps_ =
        config.train.steps > 0 ? config.train.steps : sampler_->stepsFor(config.train.epochs);
    schedule_ = std::make_unique<LrSchedule>(scheduleSpec());
    balancer_ = std::make_unique<balance::Balancer>(balancerOptions(), rankCaps());
    if (!options.resumeDir.empty())
      resume(options.resumeDir);
    else if (config.train.checkpointEvery > 0)
      refuseEarlierCheckpoints(config.train.checkpointDir);
    if (options.resumeDir.empty()) parallel_->broadcastParameters();
    if (rank_ == 0 && !options.metricsPath.empty()) {
      metrics_.open(options.metricsPath,
                    startStep_ > 0 || options.appendMetrics ? std::ios::app : std::ios::trunc);
      if (!metrics_) throw IoError(str("cannot write --metrics file '", options.metricsPath, "'"));
    }
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
    announce();
    for (int64_t step = startStep_; step < totalSteps_; ++step) {
      const double seconds = trainStep(step);
      if (step - startStep_ >= warmup) {
        measuredSeconds += seconds;
        measuredSamples += config_.train.globalBatch;
      }
      const bool last = step + 1 == totalSteps_;
      if (config_.train.evalEvery > 0 && ((step + 1) % config_.train.evalEvery == 0) && !last)
        evaluate(step + 1, result);
      if (config_.train.checkpointEvery > 0 && (step + 1) % config_.train.checkpointEvery == 0)
        checkpoint(step + 1);
    }
    drain();
    result.lastLoss = lastStats_.loss;
    evaluate(totalSteps_, result);
    result.steps = totalSteps_;
    result.wallSeconds = secondsSince(start);
    result.samplesPerSecond = measuredSeconds > 0
                                  ? double(measuredSamples) / measuredSeconds
                                  : double((totalSteps_ - startStep_) * config_.train.globalBatch) /
                                        std::max(1e-9, result.wallSeconds);
    if (rank_ == 0) {
      writeMetric({{"event", "final"},
                   {"steps", result.steps},
                   {"wall_s", result.wallSeconds},
                   {"samples_per_s", result.samplesPerSecond},
                   {"test_accuracy", result.testAccuracy},
                   {"test_loss", result.testLoss}});
      printDeviceTable(lastStats_);
    }
    return result;
  }

 private:
  struct StepStats {
    double loss = 0;
    double seconds = 0;
    std::vector<std::vector<double>> ranks;  // all-gathered kStatFields per rank
    balance::Plan plan;
  };
  // A step's all-gather of timings in flight; its buffers live here until drain().
  struct PendingGather {
    int64_t step = 0;
    double seconds = 0;
    balance::Plan plan;
    std::vector<double> report, all;
    comm::WorkPtr work;
  };

  DataSpec dataSpec() const {
    DataSpec spec;
    spec.name = config_.data.name;
    spec.path = config_.data.path;
    spec.samples = config_.data.samples;
    spec.testSamples = config_.data.testSamples;
    spec.features = config_.data.features;
    spec.classes = config_.data.classes;
    spec.seed = uint64_t(config_.train.seed);
    return spec;
  }

  OptimSpec optimSpec() const {
    OptimSpec spec;
    spec.name = config_.train.optimizer;
    spec.lr = config_.train.lr;
    spec.momentum = config_.train.momentum;
    spec.nesterov = config_.train.nesterov;
    spec.weightDecay = config_.train.weightDecay;
    spec.beta1 = config_.train.betas.at(0);
    spec.beta2 = config_.train.betas.at(1);
    spec.eps = config_.train.eps;
    return spec;
  }

  LrScheduleSpec scheduleSpec() const {
    LrScheduleSpec spec;
    spec.kind = config_.train.lrSchedule;
    spec.lr = config_.train.lr;
    spec.warmupSteps = config_.train.warmupSteps;
    spec.totalSteps = totalSteps_;
    return spec;
  }

  balance::BalancerOptions balancerOptions() const {
    balance::BalancerOptions o;
    o.mode = balance::parseMode(config_.balance.mode);
    o.globalBatch = config_.train.globalBatch;
    o.rebalanceThreshold = config_.balance.threshold;
    o.minStepsBetweenChanges = int(config_.balance.minStepsBetween);
    o.persistSteps = int(config_.balance.persistSteps);
    o.profileSteps = int(config_.balance.profileSteps);
    return o;
  }

  std::vector<balance::RankCaps> rankCaps() const {
    std::vector<balance::RankCaps> caps;
    for (const auto& device : config_.devices) {
      balance::RankCaps c;
      if (device.memoryBytes > 0 && footprint_.bytesPerSample > 0)  // > 0: footprint known
        c.maxMicroBatch = maxMicroBatch(footprint_, device.memoryBytes);
      if (device.maxMicroBatch > 0)
        c.maxMicroBatch = std::min(c.maxMicroBatch, device.maxMicroBatch);
      caps.push_back(c);
    }
    return caps;
  }

  // An emulated device of slowdown s (device/slowdown.h) takes s times the compute phase's time t
  // and so uses 1/s of its cores. t is the phase's CPU time per thread (at most its wall time):
  // when ranks share cores, wall time includes waiting for a core, which a slower device must not
  // multiply.
  void emulateSlowdown(double slowdown, Clock::time_point start, double cpuSeconds) {
    emulator_.endPhase(slowdown, secondsSince(start), cpuSeconds / double(device_.threads));
  }

  // CPU seconds of the compute phase so far, for the emulation: with one thread, LibTorch and BLAS
  // run the whole phase on this thread, so its own clock leaves out the communicator's progress
  // thread (gradient allreduces, polling), whose work is communication and must not be multiplied
  // by the slowdown. With more threads the process clock is the best we have.
  double computeCpuSeconds() const {
    if (device_.threads > 1) return processCpuSeconds();
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }

  // Runs one step and returns its seconds. The step's timings are all-gathered in the background
  // and reach the balancer at the end of the next step (or at the next drain()): waiting for them
  // at once would add a synchronisation of all ranks, and with it every rank's optimizer step on
  // the critical path, to every step.
  double trainStep(int64_t step) {
    const auto stepStart = Clock::now();
    const balance::Plan plan = balancer_->plan();
    const auto& mine = plan.ranks[size_t(rank_)];
    const auto indices = sampler_->indices(step, batchesOf(plan), rank_);
    const auto sizes = microBatchSizes(mine.batch, mine.accumSteps);
    const double slowdown = slowdownAt(device_, step);

    std::vector<double> report(kStatFields, 0.0);
    double lossSum = 0, computeSeconds = 0;
    int observations = 0;
    size_t offset = 0;
    for (size_t j = 0; j < sizes.size(); ++j) {
      const std::vector<int64_t> part(indices.begin() + long(offset),
                                      indices.begin() + long(offset + sizes[j]));
      offset += size_t(sizes[j]);
      const auto computeStart = Clock::now();
      // Gathering the samples is the host's data loading: timed with the micro-batch, for the
      // balancer, but not part of the device's forward+backward that the emulation slows down.
      Batch batch = trainData_->get(part);
      const auto phaseStart = Clock::now();
      const double cpuStart = computeCpuSeconds();
      auto logits = model_->forward(batch.inputs);
      // Summed over the micro-batch and divided by the global batch B, so the all-reduced sum is
      // the gradient of the mean loss over the global batch, whatever the split: DataParallel then
      // needs no pass over the gradients to divide them (finish(1) below).
      auto loss = torch::nn::functional::cross_entropy(
          logits, batch.targets,
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      if (j + 1 == sizes.size()) parallel_->armLastBackward();
      (loss * (1.0 / double(config_.train.globalBatch))).backward();
      lossSum += loss.item<double>();
      emulateSlowdown(slowdown, phaseStart, computeCpuSeconds() - cpuStart);
      const double seconds = secondsSince(computeStart);
      computeSeconds += seconds;
      if (observations < kMaxObservations) {
        report[kFixedFields + 2 * observations] = double(sizes[j]);
        report[kFixedFields + 2 * observations + 1] = seconds;
        ++observations;
      }
    }
    const double commSeconds = parallel_->finish(1);
    if (config_.train.gradClip > 0) clipGradNorm(model_->parameters(), config_.train.gradClip);
    applyLr(*optimizer_, schedule_->lrAt(step));
    optimizer_->step();
    parallel_->clearGradients();

    report[kLossSum] = lossSum;
    report[kSamples] = double(mine.batch);
    report[kComputeSeconds] = computeSeconds;
    report[kCommSeconds] = commSeconds;
    const uint64_t sent = comm_->bytesSent(), received = comm_->bytesReceived();
    report[kBytesSent] = double(sent - bytesSentBefore_);
    report[kBytesReceived] = double(received - bytesReceivedBefore_);
    bytesSentBefore_ = sent;
    bytesReceivedBefore_ = received;
    report[kObservations] = observations;
    drain();
    auto& gather = pending_.emplace();
    gather.step = step;
    gather.plan = plan;
    gather.report = std::move(report);
    gather.all.resize(kStatFields * size_t(comm_->size()));
    gather.work =
        comm_->allgather(gather.report.data(), gather.all.data(),
                         std::vector<size_t>(size_t(comm_->size()), kStatFields), DType::F64);
    gather.seconds = secondsSince(stepStart);
    return gather.seconds;
  }

  // Feeds the pending step's all-gathered timings to the balancer (identically on every rank) and
  // reports the step.
  void drain() {
    if (!pending_) return;
    pending_->work->wait();
    PendingGather gather = std::move(*pending_);
    pending_.reset();
    StepStats stats;
    stats.plan = std::move(gather.plan);
    stats.seconds = gather.seconds;
    double globalLoss = 0;
    for (int r = 0; r < comm_->size(); ++r) {
      std::vector<double> row(gather.all.begin() + long(r * kStatFields),
                              gather.all.begin() + long((r + 1) * kStatFields));
      globalLoss += row[kLossSum];
      for (int o = 0; o < int(row[kObservations]); ++o)
        balancer_->observe(r, int64_t(row[kFixedFields + 2 * o]), row[kFixedFields + 2 * o + 1]);
      stats.ranks.push_back(std::move(row));
    }
    const bool changed = balancer_->endStep(gather.step);
    stats.loss = globalLoss / double(config_.train.globalBatch);
    if (rank_ == 0) report0(gather.step, stats, changed);
    lastStats_ = std::move(stats);
  }

  void report0(int64_t step, const StepStats& stats, bool changed) {
    const double samplesPerSecond = double(config_.train.globalBatch) / stats.seconds;
    json ranks = json::array();
    for (int r = 0; r < comm_->size(); ++r) {
      const auto& a = stats.plan.ranks[size_t(r)];
      ranks.push_back({{"rank", r},
                       {"device", config_.devices[size_t(r)].name},
                       {"batch", a.batch},
                       {"micro_batch", a.microBatch},
                       {"accum", a.accumSteps},
                       {"compute_s", stats.ranks[size_t(r)][kComputeSeconds]},
                       {"comm_s", stats.ranks[size_t(r)][kCommSeconds]},
                       {"bytes_sent", int64_t(stats.ranks[size_t(r)][kBytesSent])},
                       {"bytes_recv", int64_t(stats.ranks[size_t(r)][kBytesReceived])}});
    }
    writeMetric({{"event", "step"},
                 {"step", step + 1},
                 {"epoch", sampler_->epochsAfter(step + 1)},
                 {"loss", stats.loss},
                 {"samples", config_.train.globalBatch},
                 {"step_time_s", stats.seconds},
                 {"samples_per_s", samplesPerSecond},
                 {"lr", schedule_->lrAt(step)},
                 {"plan_version", stats.plan.version},
                 {"ranks", ranks}},
                /*step=*/true);
    if (changed) {
      const auto& next = balancer_->plan();
      HETRA_INFO("balance", next.summary());
      writeMetric({{"event", "balance"},
                   {"step", step + 1},
                   {"version", next.version},
                   {"split", batchesOf(next)},
                   {"reason", next.reason}});
      if (!options_.progressBar) std::printf("balance: %s\n", next.reason.c_str());
    }
    const int64_t every = config_.train.logEvery;
    const bool last = step + 1 == totalSteps_;
    if (options_.progressBar) {
      const int width = 30;
      const int filled = int(double(width) * double(step + 1) / double(totalSteps_));
      std::printf("\r[%s%s] %lld/%lld loss %.4f %.0f samples/s split %s   ",
                  std::string(size_t(filled), '#').c_str(),
                  std::string(size_t(width - filled), '.').c_str(), (long long)(step + 1),
                  (long long)totalSteps_, stats.loss, samplesPerSecond,
                  splitText(stats.plan).c_str());
      if (last) std::printf("\n");
      std::fflush(stdout);
    } else if (every > 0 && ((step + 1) % every == 0 || last)) {
      std::printf("step %lld/%lld  epoch %.2f  loss %.4f  lr %.4g  %.0f samples/s  split %s\n",
                  (long long)(step + 1), (long long)totalSteps_, sampler_->epochsAfter(step + 1),
                  stats.loss, schedule_->lrAt(step), samplesPerSecond,
                  splitText(stats.plan).c_str());
      std::fflush(stdout);
    }
    if (every > 0 && (step + 1) % (every * 10) == 0 && !last) printDeviceTable(stats);
  }

  void printDeviceTable(const StepStats& stats) {
    if (stats.ranks.empty()) return;
    if (options_.progressBar) std::printf("\n");
    std::printf("  %-10s %7s %12s %12s %10s %10s\n", "device", "share", "micro x acc", "samples/s",
                "compute_s", "comm_s");
    for (int r = 0; r < comm_->size(); ++r) {
      const auto& a = stats.plan.ranks[size_t(r)];
      const auto& row = stats.ranks[size_t(r)];
      const double compute = row[kComputeSeconds];
      std::printf("  %-10s %6.1f%% %5lld x %-4lld %12.0f %10.4f %10.4f\n",
                  config_.devices[size_t(r)].name.c_str(),
                  100.0 * double(a.batch) / double(config_.train.globalBatch),
                  (long long)a.microBatch, (long long)a.accumSteps,
                  compute > 0 ? double(a.batch) / compute : 0.0, compute, row[kCommSeconds]);
    }
    std::fflush(stdout);
  }

  // Each rank evaluates a contiguous part of the test set in proportion to its share of the batch,
  // so fast devices take more of it too; losses and hits are summed over ranks.
  void evaluate(int64_t step, TrainResult& result) {
    drain();  // the split of the test set follows the plan, which must be the same on every rank
    torch::NoGradGuard noGrad;
    const auto& plan = balancer_->plan();
    const int64_t total = testData_->size();
    int64_t begin = 0, end = 0;
    for (int r = 0; r <= rank_; ++r) {
      begin = end;
      end = r + 1 == comm_->size()
                ? total
                : begin + total * plan.ranks[size_t(r)].batch / config_.train.globalBatch;
    }
    const int64_t chunk =
        std::max<int64_t>(1, std::min<int64_t>(1024, plan.ranks[size_t(rank_)].microBatch * 2));
    double sums[3] = {0, 0, 0};  // loss, correct, count
    for (int64_t start = begin; start < end; start += chunk) {
      std::vector<int64_t> idx;
      for (int64_t i = start; i < std::min(end, start + chunk); ++i) idx.push_back(i);
      Batch batch = testData_->get(idx);
      auto logits = model_->forward(batch.inputs);
      sums[0] += torch::nn::functional::cross_entropy(
                     logits, batch.targets,
                     torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                     .item<double>();
      sums[1] += logits.argmax(1).eq(batch.targets).sum().item<double>();
      sums[2] += double(idx.size());
    }
    comm_->allreduce(sums, sums, 3, DType::F64, comm::ReduceOp::Sum)->wait();
    result.testLoss = sums[0] / std::max(1.0, sums[2]);
    result.testAccuracy = sums[1] / std::max(1.0, sums[2]);
    if (rank_ == 0) {
      writeMetric({{"event", "eval"},
                   {"step", step},
                   {"test_loss", result.testLoss},
                   {"test_accuracy", result.testAccuracy}});
      if (options_.progressBar) std::printf("\n");
      std::printf("eval at step %lld: test loss %.4f, test accuracy %.4f\n", (long long)step,
                  result.testLoss, result.testAccuracy);
      std::fflush(stdout);
    }
  }

  // Checkpoint layout: DIR/step-<N>/{model.pt, state.json, MANIFEST}, DIR/latest naming the newest.
  // A step directory is complete and on the disk before `latest` points at it: it is written
  // under a temporary name, checksummed and renamed (commitCheckpoint); the last
  // train.keep_checkpoints stay.
  void checkpoint(int64_t step) {
    drain();                   // the saved balancer has seen every step before the checkpoint
    comm_->barrier()->wait();  // every rank has finished the step
    // Error feedback: every rank's residuals go into the checkpoint (rank 0 writes it), exact.
    torch::Tensor residuals;
    if (feedsBackErrors()) {
      const torch::Tensor mine = parallel_->saveResiduals();
      residuals = torch::empty({comm_->size(), mine.numel()}, torch::kFloat32);
      comm_
          ->allgather(mine.data_ptr(), residuals.data_ptr(),
                      std::vector<size_t>(size_t(comm_->size()), size_t(mine.numel())), DType::F32)
          ->wait();
    }
    if (rank_ == 0) {
      const fs::path dir(config_.train.checkpointDir);
      fs::create_directories(dir);
      const std::string name = str("step-", step);
      const fs::path tmp = dir / (name + ".tmp");
      fs::remove_all(tmp);
      fs::create_directories(tmp);
      saveCheckpoint((tmp / "model.pt").string(), *model_, *optimizer_, CheckpointInfo{step, ""});
      json state = {{"step", step},
                    {"balancer", balancer_->save()},
                    {"devices", deviceNames()},
                    {"config", toToml(config_)}};
      writeAtomically(tmp / "state.json", state.dump(1));
      if (residuals.defined()) torch::save(residuals, (tmp / "residuals.pt").string());
      commitCheckpoint(tmp.string(), (dir / name).string());
      writeAtomically(dir / "latest", name + "\n");
      HETRA_INFO("train", "checkpoint ", (dir / name).string());
      for (const auto& old : pruneCheckpoints(dir.string(), config_.train.keepCheckpoints))
        HETRA_INFO("train", "removed checkpoint ", old);
    }
    comm_->barrier()->wait();
  }

  // A fresh run must not write into another run's checkpoints: keep-K pruning goes by step number,
  // so one would delete the other's, and a later --resume could pick the wrong run. Every rank
  // checks (on one host they see the same directory, so all refuse alike).
  static void refuseEarlierCheckpoints(const std::string& root) {
    std::error_code error;
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(root, error)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory() && name.rfind("step-", 0) == 0 &&
          name.find_first_not_of("0123456789", 5) == std::string::npos && name.size() > 5)
        found.push_back(name);
    }
    if (found.empty()) return;
    std::sort(found.begin(), found.end());
    std::string names;
    for (size_t i = 0; i < found.size() && i < 3; ++i) names += (i ? ", " : "") + found[i];
    if (found.size() > 3) names += ", ...";
    throw ConfigError(str("train.checkpoint_dir = \"", root,
                          "\" already holds checkpoints of an earlier run (", names,
                          "): continue it with --resume ", root,
                          ", or give this run another train.checkpoint_dir"));
  }

  void resume(const std::string& resumeDir) {
    // The newest checkpoint that verifies: a truncated or corrupted newer one is skipped (WARN).
    const fs::path dir(findCheckpoint(resumeDir));
    std::ifstream in(dir / "state.json");
    const json state = json::parse(in);
    loadCheckpoint((dir / "model.pt").string(), *model_, *optimizer_);
    startStep_ = state.at("step").get<int64_t>();
    // The balancer's state is per rank: it applies only to the same devices in the same ranks.
    // After an elastic restart without a device (or a --resume with other devices) the survivors
    // would not even keep their rank numbers, and their speeds change with the freed cores, so
    // the balancer starts afresh (equal split, re-profiling); the split never changes the result.
    // Checkpoints of older hetra versions do not list their devices: the rank count decides.
    auto saved = balance::Balancer::load(state.at("balancer").get<std::string>());
    const bool sameDevices =
        state.contains("devices")
            ? state.at("devices").get<std::vector<std::string>>() == deviceNames()
            : saved.ranks() == comm_->size();
    if (sameDevices) {
      *balancer_ = std::move(saved);
      // This rank's error-feedback residuals, when the run compresses and the checkpoint has them.
      const fs::path residualsFile = dir / "residuals.pt";
      if (feedsBackErrors() && fs::exists(residualsFile)) {
        torch::Tensor all;
        torch::load(all, residualsFile.string());
        HETRA_ENFORCE(all.dim() == 2 && all.size(0) == comm_->size(), "checkpoint ",
                      residualsFile.string(), " holds residuals of ", all.size(0), " ranks, not ",
                      comm_->size());
        parallel_->loadResiduals(all[rank_].contiguous());
      }
    } else {
      // Error-feedback residuals are per rank too: whatever a departed rank owed is dropped.
      parallel_->loadResiduals(torch::Tensor());
      auto list = [](const std::vector<std::string>& names) {
        std::string text;
        for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
        return text;
      };
      if (rank_ == 0)
        HETRA_WARN("train", "checkpoint ", dir.string(), " was written by ", saved.ranks(),
                   " devices",
                   state.contains("devices")
                       ? str(" (", list(state.at("devices").get<std::vector<std::string>>()), ")")
                       : std::string(),
                   ", this run has ", comm_->size(), " (", list(deviceNames()),
                   "): the balancer re-profiles from an equal split",
                   config_.comm.errorFeedback && config_.comm.compression != "none"
                       ? "; error-feedback residuals start at zero"
                       : "");
    }
    if (rank_ == 0)
      std::printf("resumed from %s at step %lld\n", dir.string().c_str(), (long long)startStep_);
  }

  bool feedsBackErrors() const {
    return config_.comm.errorFeedback && config_.comm.compression != "none";
  }

  std::vector<std::string> deviceNames() const {
    std::vector<std::string> names;
    for (const auto& device : config_.devices) names.push_back(device.name);
    return names;
  }

  void announce() {
    if (rank_ != 0) return;
    std::printf(
        "hetra run: %s on %s, %d devices, global batch %lld, %lld steps (%.2f epochs of %lld "
        "samples)\n",
        options_.makeModel ? "a custom model" : config_.model.name.c_str(),
        trainData_->name().c_str(), comm_->size(), (long long)config_.train.globalBatch,
        (long long)totalSteps_, sampler_->epochsAfter(totalSteps_), (long long)trainData_->size());
    std::printf("model: %lld parameters; gradient buckets: %zu; transport: %s; balance: %s\n",
                (long long)parameterCount(*model_), parallel_->bucketCount(),
                comm_->transportName(), config_.balance.mode.c_str());
    std::fflush(stdout);
  }

  // Step records reach the file at least once a second (a write per step would cost the fast rank
  // a system call per step); every other record at once.
  void writeMetric(const json& record, bool step = false) {
    if (!metrics_.is_open()) return;
    metrics_ << record.dump() << "\n";
    if (!step || Clock::now() - lastFlush_ >= std::chrono::seconds(1)) {
      metrics_.flush();
      lastFlush_ = Clock::now();
    }
  }

  const RunConfig& config_;
  std::shared_ptr<comm::Communicator> comm_;
  TrainerOptions options_;
  int rank_;
  const DeviceConfig& device_;
  std::shared_ptr<const Dataset> trainData_, testData_;
  std::shared_ptr<Model> model_;
  MemoryFootprint footprint_;
  std::unique_ptr<DataParallel> parallel_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  device::SlowdownEmulator emulator_;
  std::unique_ptr<GlobalSampler> sampler_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<balance::Balancer> balancer_;
  int64_t totalSteps_ = 0;
  int64_t startStep_ = 0;
  std::ofstream metrics_;
  Clock::time_point lastFlush_ = Clock::now();
  StepStats lastStats_;
  uint64_t bytesSentBefore_ = 0, bytesReceivedBefore_ = 0;  // transport counters at the last step
  std::optional<PendingGather> pending_;
};

}  // namespace

void checkModelFits(const RunConfig& config) {
  const auto footprint = estimateFootprint(modelSpecOf(config));
  checkMemoryCaps(config, footprint.fixedBytes, footprint.bytesPerSample);
}

TrainResult train(const RunConfig& config, std::shared_ptr<comm::Communicator> comm,
                  const TrainerOptions& options) {
  Run run(config, std::move(comm), options);
  return run.run();
}

}  // namespace hetra::train
