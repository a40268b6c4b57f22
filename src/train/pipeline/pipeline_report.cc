#include "train/pipeline/pipeline_report.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "device/memory_accounting.h"
#include "train/report.h"

namespace hetra::train::pipeline {

using nlohmann::json;

namespace {

// One stage's part of a "pipeline_step" record (docs/metrics.md).
json stageJson(size_t stage, const StageRecord& record) {
  return {{"stage", stage},
          {"device", record.device},
          {"stage_s", record.stageSeconds},
          {"step_s", record.stepSeconds},
          {"idle_fraction", record.idleFraction()},
          {"bytes_sent", record.bytesSent},
          {"bytes_recv", record.bytesReceived}};
}

}  // namespace

std::string blockRange(const std::vector<std::string>& names, int64_t first, int64_t last) {
  if (last - first == 1) return names[size_t(first)];
  return names[size_t(first)] + ".." + names[size_t(last) - 1];
}

PipelineReport::PipelineReport(PipelineReportOptions options) : options_(std::move(options)) {
  if (!options_.enabled || options_.metricsPath.empty()) return;
  metrics_.open(options_.metricsPath, options_.appendMetrics ? std::ios::app : std::ios::trunc);
  if (!metrics_) throw IoError(str("cannot write --metrics file '", options_.metricsPath, "'"));
}

void PipelineReport::start(const std::string& what, const std::vector<std::string>& devices,
                           const std::vector<std::string>& blockNames,
                           const balance::Partition& chosen, double even) {
  if (!options_.enabled) return;
  std::printf("hetra run: %s, pipeline of %d stages, %lld chunks per step, partition %s\n",
              what.c_str(), chosen.stages(), (long long)options_.chunks, options_.mode.c_str());
  json stages = json::array();
  for (int i = 0; i < chosen.stages(); ++i) {
    const int64_t first = chosen.bounds[size_t(i)], last = chosen.bounds[size_t(i) + 1];
    std::printf("  stage %d on %-8s blocks %-20s %9.2f ms per chunk (profiled), %s\n", i,
                devices[size_t(i)].c_str(), blockRange(blockNames, first, last).c_str(),
                1e3 * chosen.stageSeconds[size_t(i)],
                device::readableBytes(chosen.stageBytes[size_t(i)]).c_str());
    stages.push_back({{"stage", i},
                      {"device", devices[size_t(i)]},
                      {"first_block", first},
                      {"blocks", last - first},
                      {"predicted_stage_s", chosen.stageSeconds[size_t(i)]},
                      {"predicted_bytes", chosen.stageBytes[size_t(i)]}});
  }
  std::printf("  predicted step %.2f ms (1F1B: sum + (chunks - 1) x slowest stage)",
              1e3 * chosen.stepSeconds);
  if (even > 0) std::printf("; an even partition: %.2f ms", 1e3 * even);
  std::printf("\n");
  std::fflush(stdout);
  if (metrics_.is_open()) {
    metrics_ << metricsLine("pipeline", {{"partition", options_.mode},
                                         {"chunks", options_.chunks},
                                         {"predicted_step_s", chosen.stepSeconds},
                                         {"even_predicted_step_s", even > 0 ? json(even) : json()},
                                         {"stages", stages}});
    metrics_.flush();
  }
}

void PipelineReport::step(const PipelineStepRecord& record) {
  if (!options_.enabled) return;
  const double samplesPerSecond = double(options_.globalBatch) / record.seconds;
  if (metrics_.is_open()) {
    json stages = json::array();
    for (size_t i = 0; i < record.stages.size(); ++i)
      stages.push_back(stageJson(i, record.stages[i]));
    metrics_ << metricsLine("pipeline_step", {{"step", record.step},
                                              {"loss", record.loss},
                                              {"samples", options_.globalBatch},
                                              {"step_time_s", record.seconds},
                                              {"samples_per_s", samplesPerSecond},
                                              {"lr", record.lr},
                                              {"stages", stages}});
    metrics_.flush();
  }
  const int64_t every = options_.logEvery;
  const bool last = record.step == options_.totalSteps;
  if (every > 0 && (record.step % every == 0 || last)) {
    std::string idle;
    for (const auto& s : record.stages)
      idle += str(idle.empty() ? "" : "/", int(100 * s.idleFraction() + 0.5));
    std::printf("step %lld/%lld  loss %.4f  lr %.4g  %.0f samples/s  idle %% %s\n",
                (long long)record.step, (long long)options_.totalSteps, record.loss, record.lr,
                samplesPerSecond, idle.c_str());
    std::fflush(stdout);
  }
  if (every > 0 && record.step % (every * 10) == 0 && !last) printStageTable(record);
  last_ = record;
}

void PipelineReport::printStageTable(const PipelineStepRecord& record) {
  if (record.stages.empty()) return;
  std::printf("  %-6s %-10s %10s %10s %8s %12s\n", "stage", "device", "stage_s", "step_s", "idle",
              "sent");
  for (size_t i = 0; i < record.stages.size(); ++i) {
    const StageRecord& s = record.stages[i];
    std::printf("  %-6zu %-10s %10.4f %10.4f %7.1f%% %12s\n", i, s.device.c_str(), s.stageSeconds,
                s.stepSeconds, 100.0 * s.idleFraction(),
                device::readableBytes(s.bytesSent).c_str());
  }
  std::fflush(stdout);
}

void PipelineReport::evaluation(int64_t step, double testLoss, double testAccuracy) {
  if (!options_.enabled) return;
  if (metrics_.is_open()) {
    metrics_ << metricsLine(
        "eval", {{"step", step}, {"test_loss", testLoss}, {"test_accuracy", testAccuracy}});
    metrics_.flush();
  }
  std::printf("eval at step %lld: test loss %.4f, test accuracy %.4f\n", (long long)step, testLoss,
              testAccuracy);
  std::fflush(stdout);
}

void PipelineReport::finish(const TrainResult& result) {
  if (!options_.enabled) return;
  if (metrics_.is_open()) {
    metrics_ << metricsLine("final", {{"steps", result.steps},
                                      {"wall_s", result.wallSeconds},
                                      {"samples_per_s", result.samplesPerSecond},
                                      {"test_accuracy", result.testAccuracy},
                                      {"test_loss", result.testLoss}});
    metrics_.flush();
  }
  printStageTable(last_);
}

}  // namespace hetra::train::pipeline
