// When to re-partition a running pipeline: the start-up profile priced every block on every stage
// position's device, and the partition was chosen from it (pipeline_partition.h). A device's speed
// can change later (throttling, a neighbour's load, an emulated slowdown schedule). Moving blocks
// moves their parameters and optimizer state between devices, so the watch re-partitions only
// when a measured imbalance persists. Pure logic, deterministic: every rank feeds its own watch
// the same all-gathered numbers and reaches the same decisions at the same steps.
//
// Vocabulary (with pipeline_partition.h's):
//   speed factor  s_i of stage position i: its measured forward+backward seconds in a step over
//                 what the profile predicts for its blocks and samples (sum of the blocks'
//                 profiled seconds per profiled chunk x the step's samples / the profiled chunk's
//                 samples). 1 while the device runs as profiled; the median of the last
//                 kWindow steps' ratios, so one preempted step does not move it.
//   repriced      the profile's per-block seconds of position i times s_i: the costs now.
//   gain          1 - T(best partition) / T(current partition), both 1F1B step times under the
//                 repriced costs (memory caps as at start).
//   streak        consecutive steps whose gain exceeded the threshold.
// A change happens when the streak reaches persistSteps and the gap ran since the start or the
// last change; the streak then restarts from zero and the gap doubles (minStepsBetween, then 2x,
// 4x, ...). Moving blocks costs their state's transfer, and a profile whose per-block costs do
// not add up as measured could otherwise move them back and forth; with the doubling a run of
// n steps re-partitions at most log2(n / minStepsBetween) + 1 times.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "balance/pipeline_partition.h"

namespace hetra::balance {

struct RepartitionOptions {
  double threshold = 0.05;   // least predicted gain worth moving blocks
  int persistSteps = 5;      // steps in a row the gain must exceed it
  int minStepsBetween = 10;  // steps before the first change; doubles after each
};

class PartitionWatch {
 public:
  // `profiled`: the costs the current partition was chosen from, for `profiledSamples` samples a
  // chunk.
  PartitionWatch(PipelineCosts profiled, int64_t profiledSamples, Partition current,
                 RepartitionOptions options = {});

  // Step `step`'s measurement: each stage position's forward+backward seconds and the samples it
  // ran (position i: the slowest of its replicas, samples 0 = it ran none and says nothing).
  // Returns the new partition when the watch decides to change; it is current() from then on.
  std::optional<Partition> observe(int64_t step, const std::vector<double>& stageSeconds,
                                   const std::vector<int64_t>& stageSamples);

  const Partition& current() const { return current_; }
  // s_i, 1 until measured.
  const std::vector<double>& speedFactors() const { return factors_; }
  // The gain at the last observe (0 before any).
  double lastGain() const { return lastGain_; }

  static constexpr int kWindow = 5;

 private:
  PipelineCosts repriced() const;

  PipelineCosts profiled_;
  int64_t profiledSamples_;
  Partition current_;
  RepartitionOptions options_;
  std::vector<double> factors_;
  std::vector<std::vector<double>> recent_;  // per position: the last kWindow ratios
  int streak_ = 0;
  int64_t lastChange_ = 0;
  int64_t gap_;
  double lastGain_ = 0;
};

}  // namespace hetra::balance
