// What rank 0 tells about a run: the console (plain lines or a progress bar, and a table per
// device) and the metrics file, JSON Lines whose schema docs/metrics.md defines. A Report on any
// other rank does nothing, so every rank makes the same calls.
#pragma once

#include <array>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/timing.h"
#include "device/memory_accounting.h"
#include "train/progress.h"
#include "train/trainer.h"

namespace hetra::balance {
struct Plan;
}

namespace hetra::train {

struct ShardPlanRow;

// docs/metrics.md: every record carries it as "schema_version".
constexpr int kMetricsSchemaVersion = 1;

// One line of the metrics file: `fields` with "event" and "schema_version" added, and "\n".
std::string metricsLine(const std::string& event, nlohmann::json fields);

// Appends metricsLine(event, fields) to the file `path` and flushes it, for writers besides the
// trainer's Report (hetra run's restart record). False when the file cannot be written.
bool appendMetricsRecord(const std::string& path, const std::string& event, nlohmann::json fields);

// One rank's part of a step.
struct RankStep {
  std::string device;
  int64_t batch = 0;  // samples of the global batch
  int64_t microBatch = 0;
  int64_t accumSteps = 0;
  double computeSeconds = 0;  // the micro-batches: data, forward, backward
  double commSeconds = 0;     // waiting for the gradient all-reduce after the last backward
  int64_t bytesSent = 0;      // payload bytes through the transport this step
  int64_t bytesReceived = 0;
  // Device memory (docs/memory.md): the peak of the device categories so far, and each
  // category's peak; -1 where unknown (ranks that are threads of one process).
  int64_t peakBytes = -1;
  std::array<int64_t, device::kMemoryCategories> memory{};
  bool leftOut = false;  // the balancer left the device out (balance/balancer.h, "left out")
};

struct StepRecord {
  int64_t step = 0;    // steps done: 1 after the first
  double epoch = 0;    // epochs done
  double loss = 0;     // mean over the global batch
  double seconds = 0;  // this step on rank 0
  double lr = 0;
  int64_t planVersion = 0;
  double idealSamplesPerSecond = 0;  // the balancer's best-split prediction; 0 while it has none
  double regret = 0;  // how far the split in use is from it, predicted (balance::Balancer::regret)
  // A step that re-synchronised the replicas (train.resync_every): the largest difference any
  // rank's parameters had from rank 0's before; -1 on the other steps.
  double replicaDrift = -1;
  std::vector<RankStep> ranks;
};

// What the run's first console lines say.
struct RunHeader {
  std::string model, data, transport, balance;
  int devices = 0;
  int64_t globalBatch = 0, steps = 0, trainSamples = 0, parameters = 0;
  // train.global_batch = 0: where the batch came from (GlobalBatch::text, train/global_batch.h).
  std::string globalBatchFrom;
  double epochs = 0;
  size_t buckets = 0;
};

struct ReportOptions {
  bool enabled = false;     // rank 0
  std::string metricsPath;  // "" = no metrics file
  bool appendMetrics = false;
  bool progressBar = false;
  int64_t logEvery = 0;  // a console line every this many steps (0: none)
  int64_t totalSteps = 0;
  int64_t globalBatch = 0;
};

class Report {
 public:
  // Throws IoError naming the file when the metrics cannot be written.
  explicit Report(ReportOptions options);

  void resumed(const std::string& stepDir, int64_t step);
  void start(const RunHeader& header);
  // ZeRO's plan (train/zero_plan.h), after start(): each device's shard and the bytes it plans on
  // the device and in host memory; a "zero_plan" record.
  void shardPlan(int64_t stage, const std::string& shards, int64_t parameters,
                 const std::vector<ShardPlanRow>& rows);
  void step(const StepRecord& record);
  // The balancer adopted `next` after `step` steps.
  void balanceChange(int64_t step, const balance::Plan& next);
  // ZeRO's shards moved to `shardSizes` (elements per rank) after `step` steps, following the
  // devices' measured speed; a "shards" record.
  void shardsMoved(int64_t step, const std::vector<int64_t>& shardSizes);
  void evaluation(int64_t step, double testLoss, double testAccuracy);
  void finish(const TrainResult& result);

 private:
  void write(const std::string& event, nlohmann::json fields, bool isStep = false);
  void printStepLine(const StepRecord& record);
  void printDeviceTable(const StepRecord& record);

  ReportOptions options_;
  std::ofstream metrics_;
  Clock::time_point lastFlush_ = Clock::now();
  StepRecord last_;
  EtaEstimator eta_;  // the progress bar's time left
};

}  // namespace hetra::train
