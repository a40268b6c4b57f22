// What rank 0 tells about a pipeline run: the partition and its predicted step time, a console
// line per train.log_every steps, a table per stage (stage time, idle fraction, bytes sent),
// evaluations, and the metrics file's "pipeline", "pipeline_step", "eval" and "final" records
// (docs/metrics.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "balance/pipeline_partition.h"
#include "train/trainer.h"

namespace hetra::train::pipeline {

// One stage's part of a step.
struct StageRecord {
  std::string device;
  int64_t first = 0, last = 0;  // blocks [first, last)
  double stageSeconds = 0;      // forwards, backwards and the optimizer step
  double stepSeconds = 0;       // the whole step on this stage
  int64_t bytesSent = 0, bytesReceived = 0;
  double idleFraction() const {
    return stepSeconds > 0 ? std::max(0.0, 1.0 - stageSeconds / stepSeconds) : 0.0;
  }
};

struct PipelineStepRecord {
  int64_t step = 0;  // steps done
  double loss = 0;   // mean over the global batch
  double lr = 0;
  double seconds = 0;  // the slowest stage's step
  std::vector<StageRecord> stages;
};

struct PipelineReportOptions {
  bool enabled = false;  // rank 0
  std::string metricsPath;
  bool appendMetrics = false;
  int64_t logEvery = 0;
  int64_t totalSteps = 0;
  int64_t globalBatch = 0;
  int64_t chunks = 0;
  std::string mode;  // parallel.partition
};

// "fc0..fc1" for blocks [first, last) of `names`.
std::string blockRange(const std::vector<std::string>& names, int64_t first, int64_t last);

class PipelineReport {
 public:
  // Throws IoError naming the file when the metrics cannot be written.
  explicit PipelineReport(PipelineReportOptions options);

  // `even` is the even partition's predicted step time (0 when it does not fit).
  void start(const std::string& what, const std::vector<std::string>& devices,
             const std::vector<std::string>& blockNames, const balance::Partition& chosen,
             double even);
  void step(const PipelineStepRecord& record);
  void evaluation(int64_t step, double testLoss, double testAccuracy);
  void finish(const TrainResult& result);

 private:
  void printStageTable(const PipelineStepRecord& record);

  PipelineReportOptions options_;
  std::ofstream metrics_;
  PipelineStepRecord last_;
};

}  // namespace hetra::train::pipeline
