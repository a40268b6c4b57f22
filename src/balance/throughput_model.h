// Per-rank compute-time model, fitted from measured micro-batch times only (never from a
// configured slowdown).
//
// Vocabulary:
//   observation  one micro-batch of m samples whose forward+backward took t seconds.
//   cost model   t(m) = overhead + perSample * m: `overhead` (a >= 0) is paid once per
//                micro-batch (launches, per-call setup), `perSample` (c > 0) per sample. A rank's
//                compute time for b samples run as k micro-batches is T = k * a + c * b; with
//                micro-batches of at most m samples, k = ceil(b / m). Splitting the samples as
//                k-1 full micro-batches plus a smaller last one, or as evenly as possible, gives
//                the same T under this model.
//   point        the median time of one step's observations of one micro-batch size, with their
//                count (the median, not the mean: one slow micro-batch among many does not count).
//   window       the points of the last kWindowSteps steps in which the rank was observed; a
//                point of age g steps weighs count * kDecay^g (exponentially weighted least
//                squares).
//   inlier       a point whose time is within a factor kOutlierRatio of the fit, after
//                normalising by the weighted median of all points' ratios to the fit. Outliers (a
//                5x spike) are dropped. A change of speed makes the new points outliers until they
//                carry the majority of the weight, then the old points become the outliers: the
//                model switches to the new speed in a few steps instead of drifting through the
//                average.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace hetra::balance {

struct CostModel {
  double overhead = 0.0;   // a: seconds per micro-batch
  double perSample = 0.0;  // c: seconds per sample; 0 means "not measured yet"
  // Relative standard error of a prediction near the observed sizes: the relative spread of the
  // points around the fit over the square root of their effective number.
  double relativeError = 0.0;

  bool known() const { return perSample > 0.0; }
  // Predicted compute time of `samples` samples run as `microBatches` micro-batches.
  double seconds(int64_t samples, int64_t microBatches) const {
    return samples <= 0 ? 0.0 : double(microBatches) * overhead + perSample * double(samples);
  }
};

struct ThroughputPoint {
  int64_t step = 0;
  int64_t microBatch = 0;
  double seconds = 0.0;
  int64_t count = 0;
};

class ThroughputModel {
 public:
  static constexpr int kWindowSteps = 24;
  static constexpr double kDecay = 0.9;
  static constexpr double kOutlierRatio = 1.35;
  // Prior on the overhead: a ~ N(0, (kOverheadPrior * t)^2). Its weight against the data is
  // noise^2 / (effective points * kOverheadPrior^2), where the noise is the relative residual
  // spread (pulled toward kNoisePrior by kNoisePriorPoints pseudo-points). So one micro-batch size,
  // or sizes too close together for the noise, give the proportional fit a = 0; clean data at
  // distinct sizes are followed almost exactly.
  static constexpr double kOverheadPrior = 0.3;
  static constexpr double kNoisePrior = 0.05;
  static constexpr double kNoisePriorPoints = 2.0;

  // Adds one step's observations (micro-batch size, seconds) and refits. No observation: no change.
  void addStep(int64_t step, const std::vector<std::pair<int64_t, double>>& observations);

  const CostModel& cost() const { return cost_; }
  const std::vector<ThroughputPoint>& points() const { return points_; }

  nlohmann::json toJson() const;
  static ThroughputModel fromJson(const nlohmann::json& j);

 private:
  void refit(int64_t now);

  std::vector<ThroughputPoint> points_;  // ordered by step
  CostModel cost_;
};

}  // namespace hetra::balance
