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
          {"replica", record.replica},
          {"device", record.device},
          {"stage_s", record.stageSeconds},
          {"step_s", record.stepSeconds},
          {"idle_fraction", record.idleFraction()},
          {"update_comm_s", record.updateCommSeconds},
          {"chunks_in_flight", record.chunksInFlight},
          {"activation_bytes", record.activationBytes >= 0 ? json(record.activationBytes) : json()},
          {"bytes_sent", record.bytesSent},
          {"bytes_recv", record.bytesReceived}};
}

std::string joined(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t v : values) text += str(text.empty() ? "" : "/", v);
  return text;
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
  const int stageCount = chosen.stages();
  if (options_.replicas > 1)
    std::printf(
        "hetra run: %s, %d pipelines of %d stages as data-parallel replicas (zero.stage %d), "
        "%lld chunks per step, partition %s\n",
        what.c_str(), options_.replicas, stageCount, options_.zeroStage, (long long)options_.chunks,
        options_.mode.c_str());
  else
    std::printf("hetra run: %s, pipeline of %d stages, %lld chunks per step, partition %s\n",
                what.c_str(), stageCount, (long long)options_.chunks, options_.mode.c_str());
  json stages = json::array();
  for (int i = 0; i < stageCount; ++i) {
    const int64_t first = chosen.bounds[size_t(i)], last = chosen.bounds[size_t(i) + 1];
    std::string on;
    for (int j = 0; j < options_.replicas; ++j)
      on += str(j ? "," : "", devices[size_t(j * stageCount + i)]);
    std::printf("  stage %d on %-8s blocks %-20s %9.2f ms per chunk (profiled), %s\n", i,
                on.c_str(), blockRange(blockNames, first, last).c_str(),
                1e3 * chosen.stageSeconds[size_t(i)],
                device::readableBytes(chosen.stageBytes[size_t(i)]).c_str());
    stages.push_back({{"stage", i},
                      {"device", devices[size_t(i)]},
                      {"replica_devices", on},
                      {"first_block", first},
                      {"blocks", last - first},
                      {"predicted_stage_s", chosen.stageSeconds[size_t(i)]},
                      {"predicted_bytes", chosen.stageBytes[size_t(i)]}});
  }
  if (options_.reordered)
    std::printf(
        "  (devices reordered: that order's partition is faster, or the only one that "
        "fits their memory)\n");
  std::printf("  predicted step %.2f ms (1F1B: sum + (chunks - 1) x slowest stage)",
              1e3 * chosen.stepSeconds);
  if (even > 0) std::printf("; an even partition: %.2f ms", 1e3 * even);
  std::printf("\n");
  std::fflush(stdout);
  if (metrics_.is_open()) {
    metrics_ << metricsLine("pipeline", {{"partition", options_.mode},
                                         {"chunks", options_.chunks},
                                         {"replicas", options_.replicas},
                                         {"zero_stage", options_.zeroStage},
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
    const size_t perPipeline = record.stages.size() / size_t(std::max(1, options_.replicas));
    for (size_t i = 0; i < record.stages.size(); ++i)
      stages.push_back(stageJson(i % perPipeline, record.stages[i]));
    json step = {{"step", record.step},
                 {"loss", record.loss},
                 {"samples", options_.globalBatch},
                 {"step_time_s", record.seconds},
                 {"samples_per_s", samplesPerSecond},
                 {"lr", record.lr},
                 {"stages", stages}};
    if (options_.replicas > 1) {
      step["shares"] = record.shares;
      step["pipeline_s"] = record.pipelineSeconds;
      step["ideal_samples_per_s"] = record.balancerIdeal > 0 ? json(record.balancerIdeal) : json();
      step["replica_drift"] = record.replicaDrift >= 0 ? json(record.replicaDrift) : json();
    }
    metrics_ << metricsLine("pipeline_step", step);
    metrics_.flush();
  }
  const int64_t every = options_.logEvery;
  const bool last = record.step == options_.totalSteps;
  if (every > 0 && (record.step % every == 0 || last)) {
    std::string idle;
    for (const auto& s : record.stages)
      idle += str(idle.empty() ? "" : "/", int(100 * s.idleFraction() + 0.5));
    const std::string split =
        options_.replicas > 1 ? str("  split ", joined(record.shares)) : std::string();
    std::printf("step %lld/%lld  loss %.4f  lr %.4g  %.0f samples/s  idle %% %s%s\n",
                (long long)record.step, (long long)options_.totalSteps, record.loss, record.lr,
                samplesPerSecond, idle.c_str(), split.c_str());
    std::fflush(stdout);
  }
  if (every > 0 && record.step % (every * 10) == 0 && !last) printStageTable(record);
  last_ = record;
}

void PipelineReport::printStageTable(const PipelineStepRecord& record) {
  if (record.stages.empty()) return;
  std::printf("  %-4s %-6s %-10s %10s %10s %8s %9s %12s %12s\n", "pipe", "stage", "device",
              "stage_s", "step_s", "idle", "in flight", "activations", "sent");
  const size_t stages = record.stages.size() / size_t(std::max(1, options_.replicas));
  for (size_t i = 0; i < record.stages.size(); ++i) {
    const StageRecord& s = record.stages[i];
    const std::string activations =
        s.activationBytes >= 0 ? device::readableBytes(s.activationBytes) : std::string("-");
    std::printf("  %-4d %-6zu %-10s %10.4f %10.4f %7.1f%% %9lld %12s %12s\n", s.replica, i % stages,
                s.device.c_str(), s.stageSeconds, s.stepSeconds, 100.0 * s.idleFraction(),
                (long long)s.chunksInFlight, activations.c_str(),
                device::readableBytes(s.bytesSent).c_str());
  }
  std::fflush(stdout);
}

void PipelineReport::repartition(int64_t step, const std::vector<int64_t>& before,
                                 const balance::Partition& now,
                                 const std::vector<double>& speedFactors, double gain,
                                 const std::vector<std::string>& blockNames) {
  if (!options_.enabled) return;
  const auto counts = [](const std::vector<int64_t>& bounds) {
    std::vector<int64_t> blocks;
    for (size_t i = 0; i + 1 < bounds.size(); ++i) blocks.push_back(bounds[i + 1] - bounds[i]);
    return blocks;
  };
  std::string factors, ranges;
  for (double f : speedFactors) {
    char text[32];
    std::snprintf(text, sizeof text, "%s%.2f", factors.empty() ? "" : "/", f);
    factors += text;
  }
  for (int i = 0; i < now.stages(); ++i)
    ranges += str(i ? ", " : "",
                  blockRange(blockNames, now.bounds[size_t(i)], now.bounds[size_t(i) + 1]));
  std::printf(
      "repartition after step %lld: blocks per stage %s -> %s (%s; stage times %s of the "
      "profile's, predicted gain %.1f%%)\n",
      (long long)step, joined(counts(before)).c_str(), joined(counts(now.bounds)).c_str(),
      ranges.c_str(), factors.c_str(), 100.0 * gain);
  std::fflush(stdout);
  if (metrics_.is_open()) {
    metrics_ << metricsLine("repartition", {{"step", step},
                                            {"blocks_before", counts(before)},
                                            {"blocks", counts(now.bounds)},
                                            {"speed_factors", speedFactors},
                                            {"predicted_gain", gain}});
    metrics_.flush();
  }
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
