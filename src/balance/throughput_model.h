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
//   point        the median time of one step's observations of one micro-batch size (the median,
//                not the mean: one slow micro-batch among many does not count). One point is one
//                observation of the curve, whatever the number of micro-batches behind it.
//   window       the points of the last kWindowSteps steps in which the rank was observed; a
//                point of age g steps weighs kDecay^g (exponentially weighted least squares).
//   reference    the micro-batch size the rank ran in its latest step. Points weigh
//                exp(-(ln(m / reference) / kLocality)^2 / 2) more: the line is the curve's tangent
//                near where the rank runs now, not a global average. Real curves are not lines
//                (per-sample cost falls at small micro-batches, caches spill at large ones); a
//                tangent is exact in level where the balancer has to decide, and the split moves it
//                runs are free measurements at new sizes that refit the tangent where it moved.
//   inlier       a point whose time is within a factor kOutlierRatio of the fit, after
//                normalising by the weighted median of all points' ratios to the fit. Outliers (a
//                preempted step, a late sleep) are dropped.
//   change       the last kChangeSteps steps' points all on the same side of the older points'
//                fit, each off by at least a margin (a factor kChangeRatio, and kChangeSigmas times
//                the noise), and within twice that margin of each other: the device's speed
//                changed, so the older points are forgotten and the model is the new speed's after
//                kChangeSteps steps instead of drifting through the average. A spike in one or two
//                steps is not a change, nor are erratic slow steps (interference).
//   shape        the overhead in per-sample costs (a / c): how far the line's zero lies left of
//                the origin. A device that gets faster or slower (a change, a throttled clock, an
//                emulated slowdown) scales a and c alike, so the shape outlives the points: it is
//                taken from the last fit whose points alone bound the overhead (within kShapeError
//                of the time at the reference size), kept when points are forgotten, and the prior
//                pulls the overhead toward shape * c. With points at one size the line then goes
//                through them and the shape's zero; before any fit measured it, shape 0: through
//                the origin. Without it, a rank whose points are all at one small share (after a
//                change, or held there) reads its fixed cost as a per-sample cost, is predicted
//                far too slow at a larger share and is never offered one.
//   noise        the relative spread of one point around the fit (the step-to-step timing noise),
//                pulled toward kNoisePrior by kNoisePriorPoints pseudo-points.
//   uncertainty  the covariance of (overhead, perSample) of the weighted least squares, noise^2
//                times the inverse of the weighted normal matrix: how far the tangent may be off,
//                from which a prediction's standard error at any size follows.
//   step cost    seconds the rank spends once per step, outside its micro-batches, whatever its
//                share, before its next micro-batch can start: data parallelism's optimizer step,
//                which an emulated device's slowdown stretches as it stretches compute (a device
//                four times slower updates the same parameters four times slower). The median of
//                the last kStepCostWindow steps' measurements (forgotten with the points on a
//                change of speed). It adds to every share's time alike, so it moves samples away
//                from ranks whose update is slow; leaving it out equalises the micro-batches'
//                ends while the slow update still delays the slow rank's start.
#pragma once

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace hetra::balance {

struct CostModel {
  double overhead = 0.0;   // a: seconds per micro-batch
  double perSample = 0.0;  // c: seconds per sample; 0 means "not measured yet"
  // Relative standard error of a prediction at the reference size (the fit's uncertainty there).
  double relativeError = 0.0;
  double noise = 0.0;  // relative spread of one step's point around the fit
  // Covariance of the estimates (seconds^2, seconds^2 per sample, seconds^2 per sample^2).
  double overheadVariance = 0.0, covariance = 0.0, perSampleVariance = 0.0;
  double perStep = 0.0;  // u: seconds per step whatever the share (see "step cost")

  bool known() const { return perSample > 0.0; }
  // Predicted compute time of `samples` samples run as `microBatches` micro-batches.
  double seconds(int64_t samples, int64_t microBatches) const {
    return samples <= 0 ? 0.0 : double(microBatches) * overhead + perSample * double(samples);
  }
  // The rank's predicted step: its step cost plus seconds(samples, microBatches).
  double stepSeconds(int64_t samples, int64_t microBatches) const {
    return perStep + seconds(samples, microBatches);
  }
  // Standard error of seconds(samples, microBatches) from the fit's uncertainty (the timing noise
  // of a single future step not included: that is `noise`).
  double standardError(int64_t samples, int64_t microBatches) const;
};

struct ThroughputPoint {
  int64_t step = 0;
  int64_t microBatch = 0;
  double seconds = 0.0;
  int64_t count = 0;
};

class ThroughputModel {
 public:
  static constexpr int kWindowSteps = 40;
  static constexpr double kDecay = 0.95;
  static constexpr double kLocality = 0.6;
  static constexpr double kOutlierRatio = 1.35;
  static constexpr int kChangeSteps = 3;
  static constexpr double kChangeRatio = 1.08;
  static constexpr double kChangeSigmas = 3.0;
  // Prior on the overhead: a ~ N(shape * c, (kOverheadPrior * t)^2). Its weight against the data
  // is noise^2 / (effective points * kOverheadPrior^2). So one micro-batch size, or sizes too
  // close together for the noise, give the line of the remembered shape (proportional, a = 0,
  // before one was measured); clean data at distinct sizes are followed almost exactly.
  static constexpr double kOverheadPrior = 0.3;
  // A fit's shape is remembered when the points alone give its overhead a standard error of at
  // most this fraction of the time at the reference size.
  static constexpr double kShapeError = 0.1;
  static constexpr double kNoisePrior = 0.05;
  static constexpr double kNoisePriorPoints = 2.0;
  static constexpr int kStepCostWindow = 7;

  // keepShape false: the prior stays a = 0 (the line through the origin at one size), as before
  // 2026-12-06; kept to measure the difference.
  explicit ThroughputModel(bool keepShape = true) : keepShape_(keepShape) {}

  // Adds one step's observations (micro-batch size, seconds) and refits. No observation: no change.
  void addStep(int64_t step, const std::vector<std::pair<int64_t, double>>& observations);

  // Adds one step's measured step cost (seconds >= 0) and updates cost().perStep.
  void addStepCost(int64_t step, double seconds);

  // Forgets every point and step cost so far (an outside signal says the speed changed); the
  // fitted line stays until the next addStep refits from the new points alone (with the shape,
  // which stays), the step cost is 0 until the next addStepCost.
  void forgetPoints();

  const CostModel& cost() const { return cost_; }
  const std::vector<ThroughputPoint>& points() const { return points_; }
  // The step of the latest observation; the lowest int64_t before any.
  int64_t lastObserved() const { return lastObserved_; }
  // The remembered shape, a / c in samples (see "shape"); 0 until a fit measured one.
  double shape() const { return shape_; }
  // How many times a change of speed made the model forget its older points.
  int64_t changes() const { return changes_; }

  nlohmann::json toJson() const;
  static ThroughputModel fromJson(const nlohmann::json& j);

 private:
  void refit(int64_t now);
  bool speedChanged() const;

  void updateStepCost();

  std::vector<ThroughputPoint> points_;                // ordered by step
  std::vector<std::pair<int64_t, double>> stepCosts_;  // (step, seconds), the last few steps
  CostModel cost_;
  bool keepShape_ = true;
  double shape_ = 0.0;
  int64_t lastObserved_ = std::numeric_limits<int64_t>::min();
  int64_t changes_ = 0;
};

}  // namespace hetra::balance
