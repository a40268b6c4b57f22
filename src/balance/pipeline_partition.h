// Pipeline partitions: which contiguous blocks of a model each stage of a pipeline holds, on plain
// numbers (per-block times and bytes measured by the trainer, train/pipeline/).
//
// Vocabulary:
//   block      one named step of the model's forward (train/models.h), the unit of a partition.
//   stage      a contiguous, never empty run of blocks on one device; stage i runs on the i-th
//              device of the costs (the devices' given order: no reordering).
//   chunk      one micro-batch of a step; a step pushes M chunks through the P stages.
//   w_i        stage i's forward+backward seconds for one chunk: its blocks' times on its device.
//   in flight  chunks whose forward ran on a stage and whose backward has not: at most
//              min(P - i, M) on stage i under 1F1B, each holding that stage's activations and
//              its received input.
//   step time  of 1F1B: sum_i w_i + (M - 1) * max_i w_i. One chunk fills and drains the pipeline
//              (every stage once), the other M - 1 follow at the pace of the slowest stage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hetra::balance {

struct PipelineCosts {
  // seconds[d][b]: forward+backward of block b for one chunk on device d (stage d).
  std::vector<std::vector<double>> seconds;
  std::vector<int64_t> memoryBytes;      // per device: its cap; 0 = unlimited
  std::vector<int64_t> fixedBytes;       // per block: parameters, gradients, optimizer state
  std::vector<int64_t> activationBytes;  // per block: what one chunk in flight holds
  // Per block: its input for one chunk (the previous block's output); empty: none counted. A stage
  // that starts at block s > 0 receives that input and keeps it per chunk in flight; one that
  // ends before the last block e receives the gradient of its output, inputBytes[e], one chunk at
  // a time.
  std::vector<int64_t> inputBytes;
  int64_t chunks = 1;  // M
};

struct Partition {
  std::vector<int64_t> bounds;       // P + 1 entries: stage i holds blocks [bounds[i], bounds[i+1])
  std::vector<double> stageSeconds;  // w_i
  std::vector<int64_t> stageBytes;   // fixed bytes + in-flight activations of each stage
  double stepSeconds = 0;            // the 1F1B step time of stageSeconds
  int stages() const { return int(bounds.size()) - 1; }
  int64_t blocksOf(int stage) const { return bounds[size_t(stage) + 1] - bounds[size_t(stage)]; }
};

// Chunks in flight on `stage` of `stages` under 1F1B: min(stages - stage, chunks).
int64_t chunksInFlight(int stage, int stages, int64_t chunks);

// sum w + (chunks - 1) * max w.
double oneFOneBStepSeconds(const std::vector<double>& stageSeconds, int64_t chunks);

// The partition of least 1F1B step time under which every stage fits its device's memory, with
// one stage per device. Exact: for each candidate slowest-stage time W (ascending, stopping once
// (M - 1) * W alone exceeds the best found) a dynamic programme finds the least sum of stage
// times with every stage at most W. ConfigError when the devices outnumber the blocks or no
// partition fits.
Partition partitionBalanced(const PipelineCosts& costs);

// Block counts as even as possible, the first stages taking one more where they do not divide
// (the usual split, kept for comparison). ConfigError as partitionBalanced, also when it does not
// fit the memory.
Partition partitionEven(const PipelineCosts& costs);

// "balanced" or "even"; ConfigError naming parallel.partition for anything else.
Partition partitionBy(const std::string& mode, const PipelineCosts& costs);

// A partition with the devices in some order: stage i runs on device order[i].
struct OrderedPartition {
  std::vector<int> order;
  Partition partition;  // priced with the costs in that order
};

// Orders searched at most: every order of up to 6 devices (720); beyond, the given order only.
constexpr int kMaxOrderedDevices = 6;

// The balanced partition over every order of the devices (up to kMaxOrderedDevices of them; more
// keep the given order): where caps differ, the device with the most memory tends to go where the
// most activations wait (stage 0: min(P, M) chunks in flight), and a fast device where the heavy
// blocks are. Another order is taken only when it is more than `keepGivenWithin` (relative)
// faster than the given order's partition, or the given order fits no partition. ConfigError when
// no order fits.
OrderedPartition partitionOverOrders(const PipelineCosts& costs, double keepGivenWithin = 0.05);

// `costs` with its devices in `order` (device order[i] as stage i).
PipelineCosts reordered(const PipelineCosts& costs, const std::vector<int>& order);

// The partition with these bounds, priced (stage times, bytes, step time).
Partition pricePartition(const PipelineCosts& costs, std::vector<int64_t> bounds);

}  // namespace hetra::balance
