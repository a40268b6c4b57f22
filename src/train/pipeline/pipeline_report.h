// What rank 0 tells about a pipeline run: the partition and its predicted step time, a console
// line per train.log_every steps, a table per stage of every pipeline (stage time, idle fraction,
// chunks and activation bytes in flight, bytes sent), the pipelines' shares of the batch,
// re-partitions,
// evaluations, and the metrics file's "pipeline", "pipeline_step", "repartition", "eval" and
// "final" records
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
  int replica = 0;               // the pipeline
  int64_t first = 0, last = 0;   // blocks [first, last)
  double stageSeconds = 0;       // forwards, backwards and the optimizer step
  double stepSeconds = 0;        // the whole step on this stage
  double updateCommSeconds = 0;  // summing gradients over the stage's replicas, ZeRO-1's gather
  int64_t bytesSent = 0, bytesReceived = 0;
  int64_t chunksInFlight = 0;    // the most chunks whose activations were alive at once
  int64_t activationBytes = -1;  // their peak bytes (-1: not counted, ranks sharing a process)
  double idleFraction() const {
    return stepSeconds > 0 ? std::max(0.0, 1.0 - stageSeconds / stepSeconds) : 0.0;
  }
};

struct PipelineStepRecord {
  int64_t step = 0;  // steps done
  double loss = 0;   // mean over the global batch
  double lr = 0;
  double seconds = 0;                   // the slowest stage's step
  std::vector<StageRecord> stages;      // pipeline 0's stages, then pipeline 1's, ...
  std::vector<int64_t> shares;          // each pipeline's samples
  std::vector<double> pipelineSeconds;  // each pipeline's schedule, its slowest stage's
  double balancerIdeal = 0;  // several pipelines: the balancer's ideal_samples_per_s (0: unknown)
  double replicaDrift = -1;  // a re-synchronising step: the largest drift of a replica; else -1
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
  int replicas = 1;  // pipelines
  int zeroStage = 0;
  bool reordered = false;  // the stages' devices are not in [[devices]] order
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
  // Blocks moved after `step` steps: from the stages of `before` (bounds) to `now`'s, with the
  // watch's speed factors and predicted gain (balance/pipeline_rebalance.h).
  void repartition(int64_t step, const std::vector<int64_t>& before, const balance::Partition& now,
                   const std::vector<double>& speedFactors, double gain,
                   const std::vector<std::string>& blockNames);
  void evaluation(int64_t step, double testLoss, double testAccuracy);
  void finish(const TrainResult& result);

 private:
  void printStageTable(const PipelineStepRecord& record);

  PipelineReportOptions options_;
  std::ofstream metrics_;
  PipelineStepRecord last_;
};

}  // namespace hetra::train::pipeline
