#include "train/report.h"

#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

#include "balance/balancer.h"
#include "common/errors.h"
#include "common/logging.h"
#include "train/progress.h"
#include "train/zero_plan.h"

namespace hetra::train {
namespace {

using nlohmann::json;

// Each category's peak by name (docs/memory.md), or null where the rank's memory is unknown.
nlohmann::json memoryJson(const RankStep& rank) {
  if (rank.peakBytes < 0) return nullptr;
  nlohmann::json out = nlohmann::json::object();
  for (size_t c = 0; c < device::kMemoryCategories; ++c)
    out[device::memoryCategoryName(device::MemoryCategory(c))] = rank.memory[c];
  return out;
}

std::string splitText(const std::vector<RankStep>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? "/" : "") + std::to_string(ranks[i].batch);
  return text;
}

// One rank's part of a "step" record (docs/metrics.md).
nlohmann::json rankStepJson(size_t rank, const RankStep& step) {
  return {{"rank", rank},
          {"device", step.device},
          {"batch", step.batch},
          {"micro_batch", step.microBatch},
          {"accum", step.accumSteps},
          {"compute_s", step.computeSeconds},
          {"comm_s", step.commSeconds},
          {"bytes_sent", step.bytesSent},
          {"bytes_recv", step.bytesReceived},
          {"peak_bytes", step.peakBytes},
          {"memory", memoryJson(step)}};
}

}  // namespace

std::string metricsLine(const std::string& event, json fields) {
  fields["event"] = event;
  fields["schema_version"] = kMetricsSchemaVersion;
  return fields.dump() + "\n";
}

bool appendMetricsRecord(const std::string& path, const std::string& event, json fields) {
  std::ofstream out(path, std::ios::app);
  out << metricsLine(event, std::move(fields));
  out.flush();
  return bool(out);
}

Report::Report(ReportOptions options) : options_(std::move(options)) {
  if (!options_.enabled || options_.metricsPath.empty()) return;
  metrics_.open(options_.metricsPath, options_.appendMetrics ? std::ios::app : std::ios::trunc);
  if (!metrics_) throw IoError(str("cannot write --metrics file '", options_.metricsPath, "'"));
}

// Step records reach the file at least once a second (a write per step would cost the fast rank a
// system call per step); every other record at once.
void Report::write(const std::string& event, json fields, bool isStep) {
  if (!metrics_.is_open()) return;
  metrics_ << metricsLine(event, std::move(fields));
  if (!isStep || Clock::now() - lastFlush_ >= std::chrono::seconds(1)) {
    metrics_.flush();
    lastFlush_ = Clock::now();
  }
}

void Report::resumed(const std::string& stepDir, int64_t step) {
  if (!options_.enabled) return;
  std::printf("resumed from %s at step %lld\n", stepDir.c_str(), (long long)step);
  std::fflush(stdout);
}

void Report::start(const RunHeader& header) {
  if (!options_.enabled) return;
  std::printf(
      "hetra run: %s on %s, %d devices, global batch %lld, %lld steps (%.2f epochs of %lld "
      "samples)\n",
      header.model.c_str(), header.data.c_str(), header.devices, (long long)header.globalBatch,
      (long long)header.steps, header.epochs, (long long)header.trainSamples);
  if (!header.globalBatchFrom.empty())
    std::printf("global batch %s\n", header.globalBatchFrom.c_str());
  std::printf("model: %lld parameters; gradient buckets: %zu; transport: %s; balance: %s\n",
              (long long)header.parameters, header.buckets, header.transport.c_str(),
              header.balance.c_str());
  std::fflush(stdout);
}

void Report::shardPlan(int64_t stage, const std::string& shards, int64_t parameters,
                       const std::vector<ShardPlanRow>& rows) {
  if (!options_.enabled) return;
  std::printf(
      "zero: stage %lld, %s shards of %lld parameters; planned per device, before "
      "activations:\n",
      (long long)stage, shards.c_str(), (long long)parameters);
  std::printf("  %-10s %10s %12s %7s %11s %11s %10s %8s\n", "device", "cap", "shard", "share",
              "on device", "offloaded", "offload", "micro");
  json records = json::array();
  for (const ShardPlanRow& row : rows) {
    const bool capped = row.maxMicroBatch < std::numeric_limits<int64_t>::max();
    std::printf("  %-10s %10s %12lld %6.1f%% %11s %11s %10s %8s\n", row.device.c_str(),
                row.capBytes > 0 ? device::readableBytes(row.capBytes).c_str() : "unlimited",
                (long long)row.shardElements,
                100.0 * double(row.shardElements) / double(std::max<int64_t>(1, parameters)),
                device::readableBytes(row.deviceBytes).c_str(),
                device::readableBytes(row.offloadedBytes).c_str(), offloadName(row.offload),
                capped ? std::to_string(row.maxMicroBatch).c_str() : "-");
    records.push_back({{"device", row.device},
                       {"cap_bytes", row.capBytes},
                       {"shard_elements", row.shardElements},
                       {"offload", offloadName(row.offload)},
                       {"device_bytes", row.deviceBytes},
                       {"offloaded_bytes", row.offloadedBytes},
                       {"max_micro_batch", capped ? json(row.maxMicroBatch) : json(nullptr)}});
  }
  std::fflush(stdout);
  write("zero_plan",
        {{"stage", stage}, {"shards", shards}, {"parameters", parameters}, {"ranks", records}});
}

void Report::step(const StepRecord& record) {
  if (!options_.enabled) return;
  json ranks = json::array();
  for (size_t r = 0; r < record.ranks.size(); ++r)
    ranks.push_back(rankStepJson(r, record.ranks[r]));
  // null rather than absent while unknown: every step record has the same fields.
  const json ideal =
      record.idealSamplesPerSecond > 0 ? json(record.idealSamplesPerSecond) : json(nullptr);
  write("step",
        {{"step", record.step},
         {"epoch", record.epoch},
         {"loss", record.loss},
         {"samples", options_.globalBatch},
         {"step_time_s", record.seconds},
         {"samples_per_s", double(options_.globalBatch) / record.seconds},
         {"ideal_samples_per_s", ideal},
         {"balance_regret", record.idealSamplesPerSecond > 0 ? json(record.regret) : json(nullptr)},
         {"lr", record.lr},
         {"plan_version", record.planVersion},
         {"replica_drift", record.replicaDrift >= 0 ? json(record.replicaDrift) : json(nullptr)},
         {"ranks", ranks}},
        /*isStep=*/true);
  printStepLine(record);
  last_ = record;
}

void Report::printStepLine(const StepRecord& record) {
  const double samplesPerSecond = double(options_.globalBatch) / record.seconds;
  const int64_t every = options_.logEvery, total = options_.totalSteps;
  const bool last = record.step == total;
  if (options_.progressBar) {
    eta_.addStep(record.seconds);
    const ProgressState state{.step = record.step,
                              .totalSteps = total,
                              .epoch = record.epoch,
                              .loss = record.loss,
                              .samplesPerSecond = samplesPerSecond,
                              .secondsLeft = eta_.secondsLeft(total - record.step),
                              .split = splitText(record.ranks)};
    // Carriage return, the line, erase to its end: redrawn in place, shorter lines leave nothing.
    std::printf("\r%s\033[K", progressLine(state, terminalColumns()).c_str());
    if (last) std::printf("\n");
    std::fflush(stdout);
  } else if (every > 0 && (record.step % every == 0 || last)) {
    std::printf("step %lld/%lld  epoch %.2f  loss %.4f  lr %.4g  %.0f samples/s  split %s\n",
                (long long)record.step, (long long)total, record.epoch, record.loss, record.lr,
                samplesPerSecond, splitText(record.ranks).c_str());
    std::fflush(stdout);
  }
  // The bar stays one line: its table comes at the end only.
  if (every > 0 && record.step % (every * 10) == 0 && !last && !options_.progressBar)
    printDeviceTable(record);
}

void Report::printDeviceTable(const StepRecord& record) {
  if (record.ranks.empty()) return;
  if (options_.progressBar) std::printf("\n");
  if (record.idealSamplesPerSecond > 0)
    std::printf(
        "  balancer: ideal %.0f samples/s (compute and update, no communication), split in use "
        "%.1f%% from it\n",
        record.idealSamplesPerSecond, 100.0 * record.regret);
  std::printf("  %-10s %7s %12s %12s %10s %10s %11s\n", "device", "share", "micro x acc",
              "samples/s", "compute_s", "comm_s", "peak mem");
  for (const RankStep& rank : record.ranks) {
    const double compute = rank.computeSeconds;
    const std::string peak = rank.peakBytes < 0 ? "-" : device::readableBytes(rank.peakBytes);
    if (rank.leftOut) {  // no share pays for it (balance/balancer.h, "left out")
      std::printf("  %-10s %7s %12s %12s %10s %10s %11s  left out by the balancer\n",
                  rank.device.c_str(), "out", "-", "-", "-", "-", peak.c_str());
      continue;
    }
    std::printf("  %-10s %6.1f%% %5lld x %-4lld %12.0f %10.4f %10.4f %11s\n", rank.device.c_str(),
                100.0 * double(rank.batch) / double(options_.globalBatch),
                (long long)rank.microBatch, (long long)rank.accumSteps,
                compute > 0 ? double(rank.batch) / compute : 0.0, compute, rank.commSeconds,
                peak.c_str());
  }
  std::fflush(stdout);
}

void Report::balanceChange(int64_t step, const balance::Plan& next) {
  if (!options_.enabled) return;
  HETRA_INFO("balance", next.summary());
  std::vector<int64_t> split;
  for (const auto& rank : next.ranks) split.push_back(rank.batch);
  write("balance",
        {{"step", step}, {"version", next.version}, {"split", split}, {"reason", next.reason}});
  if (!options_.progressBar) std::printf("balance: %s\n", next.reason.c_str());
}

void Report::shardsMoved(int64_t step, const std::vector<int64_t>& shardSizes) {
  if (!options_.enabled) return;
  std::string sizes;
  for (int64_t n : shardSizes) sizes += (sizes.empty() ? "" : "/") + std::to_string(n);
  HETRA_INFO("zero", "shards follow the measured optimizer speeds: ", sizes, " elements");
  write("shards", {{"step", step}, {"shard_elements", shardSizes}});
  if (!options_.progressBar) std::printf("zero: shards moved to %s elements\n", sizes.c_str());
}

void Report::evaluation(int64_t step, double testLoss, double testAccuracy) {
  if (!options_.enabled) return;
  write("eval", {{"step", step}, {"test_loss", testLoss}, {"test_accuracy", testAccuracy}});
  if (options_.progressBar) std::printf("\n");
  std::printf("eval at step %lld: test loss %.4f, test accuracy %.4f\n", (long long)step, testLoss,
              testAccuracy);
  std::fflush(stdout);
}

void Report::finish(const TrainResult& result) {
  if (!options_.enabled) return;
  write("final", {{"steps", result.steps},
                  {"wall_s", result.wallSeconds},
                  {"samples_per_s", result.samplesPerSecond},
                  {"test_accuracy", result.testAccuracy},
                  {"test_loss", result.testLoss}});
  printDeviceTable(last_);
}

}  // namespace hetra::train
