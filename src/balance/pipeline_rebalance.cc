#include "balance/pipeline_rebalance.h"

#include <algorithm>

#include "common/errors.h"

namespace hetra::balance {

PartitionWatch::PartitionWatch(PipelineCosts profiled, int64_t profiledSamples, Partition current,
                               RepartitionOptions options)
    : profiled_(std::move(profiled)),
      profiledSamples_(profiledSamples),
      current_(std::move(current)),
      options_(options),
      factors_(profiled_.seconds.size(), 1.0),
      recent_(profiled_.seconds.size()),
      gap_(options_.minStepsBetween) {
  HETRA_ENFORCE(profiledSamples_ > 0, "a profile of ", profiledSamples_, " samples");
  HETRA_ENFORCE_EQ(int64_t(current_.stages()), int64_t(profiled_.seconds.size()),
                   "one partition stage per profiled device");
}

PipelineCosts PartitionWatch::repriced() const {
  PipelineCosts costs = profiled_;
  for (size_t i = 0; i < costs.seconds.size(); ++i)
    for (double& t : costs.seconds[i]) t *= factors_[i];
  return costs;
}

std::optional<Partition> PartitionWatch::observe(int64_t step,
                                                 const std::vector<double>& stageSeconds,
                                                 const std::vector<int64_t>& stageSamples) {
  const size_t stages = factors_.size();
  HETRA_ENFORCE(stageSeconds.size() == stages && stageSamples.size() == stages,
                "a measurement per stage position");
  for (size_t i = 0; i < stages; ++i) {
    if (stageSamples[i] <= 0 || !(stageSeconds[i] > 0)) continue;
    const double predicted =
        current_.stageSeconds[i] * double(stageSamples[i]) / double(profiledSamples_);
    if (!(predicted > 0)) continue;
    auto& recent = recent_[i];
    recent.push_back(stageSeconds[i] / predicted);
    if (recent.size() > size_t(kWindow)) recent.erase(recent.begin());
    std::vector<double> sorted(recent);
    std::nth_element(sorted.begin(), sorted.begin() + long(sorted.size() / 2), sorted.end());
    factors_[i] = sorted[sorted.size() / 2];
  }
  const PipelineCosts costs = repriced();
  const Partition now = pricePartition(costs, current_.bounds);
  Partition best;
  try {
    best = partitionBalanced(costs);
  } catch (const ConfigError&) {
    return std::nullopt;  // nothing fits the repriced costs better: keep what runs
  }
  lastGain_ = now.stepSeconds > 0 ? 1 - best.stepSeconds / now.stepSeconds : 0;
  streak_ = lastGain_ > options_.threshold ? streak_ + 1 : 0;
  if (streak_ < options_.persistSteps || step - lastChange_ < gap_ ||
      best.bounds == current_.bounds)
    return std::nullopt;
  streak_ = 0;
  lastChange_ = step;
  gap_ *= 2;
  // The profile's own prices, so that the next measurements compare with the same reference.
  current_ = pricePartition(profiled_, best.bounds);
  return current_;
}

}  // namespace hetra::balance
