// Vocabulary: see pipeline_partition.h. Below, N = blocks, P = stages, a stage (i, s, e) is stage
// i holding blocks [s, e).
#include "balance/pipeline_partition.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>

#include "common/errors.h"

namespace hetra::balance {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Prefix sums, so a stage's time and bytes cost O(1).
struct Prefix {
  std::vector<std::vector<double>> seconds;  // [d][b]: device d, blocks [0, b)
  std::vector<int64_t> fixed, activations, inputs;

  explicit Prefix(const PipelineCosts& c) : inputs(c.inputBytes) {
    inputs.resize(c.fixedBytes.size(), 0);
    for (const auto& row : c.seconds) {
      std::vector<double> p(row.size() + 1, 0.0);
      for (size_t b = 0; b < row.size(); ++b) p[b + 1] = p[b] + row[b];
      seconds.push_back(std::move(p));
    }
    fixed.assign(c.fixedBytes.size() + 1, 0);
    activations.assign(c.activationBytes.size() + 1, 0);
    for (size_t b = 0; b < c.fixedBytes.size(); ++b) fixed[b + 1] = fixed[b] + c.fixedBytes[b];
    for (size_t b = 0; b < c.activationBytes.size(); ++b)
      activations[b + 1] = activations[b] + c.activationBytes[b];
  }
  double stageSeconds(int i, int64_t s, int64_t e) const {
    return seconds[size_t(i)][size_t(e)] - seconds[size_t(i)][size_t(s)];
  }
  int64_t stageBytes(int i, int stages, int64_t chunks, int64_t s, int64_t e) const {
    const int64_t received = s > 0 ? inputs[size_t(s)] : 0;
    const int64_t outputGradient = e < int64_t(inputs.size()) ? inputs[size_t(e)] : 0;
    return fixed[size_t(e)] - fixed[size_t(s)] + outputGradient +
           chunksInFlight(i, stages, chunks) *
               (activations[size_t(e)] - activations[size_t(s)] + received);
  }
};

int64_t blockCount(const PipelineCosts& c) {
  return int64_t(c.fixedBytes.size());
}

void checkShape(const PipelineCosts& c) {
  const int stages = int(c.seconds.size());
  const int64_t blocks = blockCount(c);
  HETRA_ENFORCE_GE(stages, 1, "a pipeline needs at least one stage");
  HETRA_ENFORCE_EQ(c.memoryBytes.size(), size_t(stages), "one memory cap per device");
  HETRA_ENFORCE_EQ(c.activationBytes.size(), size_t(blocks), "activation bytes per block");
  HETRA_ENFORCE(c.inputBytes.empty() || c.inputBytes.size() == size_t(blocks),
                "input bytes per block, or none");
  HETRA_ENFORCE_GE(c.chunks, 1, "a step has at least one chunk");
  for (const auto& row : c.seconds)
    HETRA_ENFORCE_EQ(row.size(), size_t(blocks), "one time per block on every device");
  if (blocks < stages)
    throw ConfigError(str("parallel.pipeline = ", stages, ": the model has only ", blocks,
                          " blocks; every stage needs at least one (use at most ", blocks,
                          " stages)"));
}

bool fits(const PipelineCosts& c, int i, int64_t bytes) {
  return c.memoryBytes[size_t(i)] <= 0 || bytes <= c.memoryBytes[size_t(i)];
}

[[noreturn]] void failNoFit(const PipelineCosts& c, const char* mode) {
  throw ConfigError(str(
      "parallel.partition = \"", mode, "\": no split of the ", blockCount(c), " blocks into ",
      c.seconds.size(), " stages fits every stage in its device's memory (devices[i].memory; ",
      "stage i holds the activations of min(P - i, parallel.chunks) chunks): raise the caps, ",
      "or use fewer chunks", std::string(mode) == "even" ? " or partition = \"balanced\"" : ""));
}

// Least sum of stage times over partitions whose every stage fits and takes at most `cap`
// seconds; empty bounds when there is none.
std::vector<int64_t> leastSumUnder(const PipelineCosts& c, const Prefix& prefix, double cap) {
  const int stages = int(c.seconds.size());
  const int64_t blocks = blockCount(c);
  // best[i][e]: least sum of the first i stages over blocks [0, e); from[i][e]: that start of
  // stage i - 1.
  std::vector<std::vector<double>> best(size_t(stages) + 1,
                                        std::vector<double>(size_t(blocks) + 1, kInfinity));
  std::vector<std::vector<int64_t>> from(size_t(stages) + 1,
                                         std::vector<int64_t>(size_t(blocks) + 1, -1));
  best[0][0] = 0;
  for (int i = 0; i < stages; ++i) {
    // Stage i starts at block >= i and leaves one block to each later stage.
    for (int64_t e = i + 1; e <= blocks - (stages - 1 - i); ++e)
      for (int64_t s = i; s < e; ++s) {
        if (best[size_t(i)][size_t(s)] == kInfinity) continue;
        const double w = prefix.stageSeconds(i, s, e);
        if (w > cap || !fits(c, i, prefix.stageBytes(i, stages, c.chunks, s, e))) continue;
        const double sum = best[size_t(i)][size_t(s)] + w;
        if (sum < best[size_t(i) + 1][size_t(e)]) {
          best[size_t(i) + 1][size_t(e)] = sum;
          from[size_t(i) + 1][size_t(e)] = s;
        }
      }
  }
  if (best[size_t(stages)][size_t(blocks)] == kInfinity) return {};
  std::vector<int64_t> bounds(size_t(stages) + 1, 0);
  bounds[size_t(stages)] = blocks;
  for (int i = stages; i > 0; --i)
    bounds[size_t(i) - 1] = from[size_t(i)][size_t(bounds[size_t(i)])];
  return bounds;
}

}  // namespace

int64_t chunksInFlight(int stage, int stages, int64_t chunks) {
  return std::min<int64_t>(stages - stage, chunks);
}

double oneFOneBStepSeconds(const std::vector<double>& stageSeconds, int64_t chunks) {
  double sum = 0, slowest = 0;
  for (double w : stageSeconds) {
    sum += w;
    slowest = std::max(slowest, w);
  }
  return sum + double(chunks - 1) * slowest;
}

Partition pricePartition(const PipelineCosts& costs, std::vector<int64_t> bounds) {
  const Prefix prefix(costs);
  Partition p;
  p.bounds = std::move(bounds);
  for (int i = 0; i < p.stages(); ++i) {
    const int64_t s = p.bounds[size_t(i)], e = p.bounds[size_t(i) + 1];
    p.stageSeconds.push_back(prefix.stageSeconds(i, s, e));
    p.stageBytes.push_back(prefix.stageBytes(i, p.stages(), costs.chunks, s, e));
  }
  p.stepSeconds = oneFOneBStepSeconds(p.stageSeconds, costs.chunks);
  return p;
}

Partition partitionBalanced(const PipelineCosts& costs) {
  checkShape(costs);
  const Prefix prefix(costs);
  const int stages = int(costs.seconds.size());
  const int64_t blocks = blockCount(costs);
  // The slowest stage of the optimum is some stage's time: every (i, s, e) that fits is a
  // candidate W.
  std::vector<double> candidates;
  for (int i = 0; i < stages; ++i)
    for (int64_t s = i; s < blocks; ++s)
      for (int64_t e = s + 1; e <= blocks; ++e)
        if (fits(costs, i, prefix.stageBytes(i, stages, costs.chunks, s, e)))
          candidates.push_back(prefix.stageSeconds(i, s, e));
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  const auto unbounded = leastSumUnder(costs, prefix, kInfinity);
  if (unbounded.empty()) failNoFit(costs, "balanced");
  Partition best = pricePartition(costs, unbounded);
  double leastSum = 0;  // of any partition that fits
  for (double w : best.stageSeconds) leastSum += w;
  for (double cap : candidates) {
    // Any partition whose slowest stage takes at least `cap` costs at least this.
    if (leastSum + double(costs.chunks - 1) * cap >= best.stepSeconds) break;
    auto bounds = leastSumUnder(costs, prefix, cap);
    if (bounds.empty()) continue;
    Partition p = pricePartition(costs, std::move(bounds));
    if (p.stepSeconds < best.stepSeconds) best = std::move(p);
  }
  return best;
}

Partition partitionEven(const PipelineCosts& costs) {
  checkShape(costs);
  const int stages = int(costs.seconds.size());
  const int64_t blocks = blockCount(costs);
  std::vector<int64_t> bounds(1, 0);
  for (int i = 0; i < stages; ++i)
    bounds.push_back(bounds.back() + blocks / stages + (i < blocks % stages ? 1 : 0));
  Partition p = pricePartition(costs, std::move(bounds));
  for (int i = 0; i < stages; ++i)
    if (!fits(costs, i, p.stageBytes[size_t(i)])) failNoFit(costs, "even");
  return p;
}

PipelineCosts reordered(const PipelineCosts& costs, const std::vector<int>& order) {
  HETRA_ENFORCE_EQ(order.size(), costs.seconds.size(), "an order of every device");
  PipelineCosts out = costs;
  for (size_t i = 0; i < order.size(); ++i) {
    out.seconds[i] = costs.seconds[size_t(order[i])];
    out.memoryBytes[i] = costs.memoryBytes[size_t(order[i])];
  }
  return out;
}

OrderedPartition partitionOverOrders(const PipelineCosts& costs, double keepGivenWithin) {
  checkShape(costs);
  std::vector<int> order(costs.seconds.size());
  std::iota(order.begin(), order.end(), 0);
  std::optional<OrderedPartition> given, best;
  try {
    given = OrderedPartition{order, partitionBalanced(costs)};
  } catch (const ConfigError&) {
    // no partition fits in the given order; another may
  }
  if (int(order.size()) > kMaxOrderedDevices) {
    if (!given) failNoFit(costs, "balanced");
    return *given;
  }
  do {
    try {
      Partition p = partitionBalanced(reordered(costs, order));
      if (!best || p.stepSeconds < best->partition.stepSeconds)
        best = OrderedPartition{order, std::move(p)};
    } catch (const ConfigError&) {
      // this order fits no partition
    }
  } while (std::next_permutation(order.begin(), order.end()));
  if (!best) failNoFit(costs, "balanced");
  if (given && given->partition.stepSeconds <= (1 + keepGivenWithin) * best->partition.stepSeconds)
    return *given;
  return *best;
}

Partition partitionBy(const std::string& mode, const PipelineCosts& costs) {
  if (mode == "balanced") return partitionBalanced(costs);
  if (mode == "even") return partitionEven(costs);
  throw ConfigError(
      str("parallel.partition = \"", mode, "\" is not a partition; allowed: ", "balanced, even"));
}

}  // namespace hetra::balance
