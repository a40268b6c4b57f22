#include "balance/throughput_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace hetra::balance {
namespace {

// A measured time of 0 (a clock too coarse for a tiny micro-batch) would make relative errors
// infinite; a nanosecond is below any real micro-batch.
constexpr double kMinSeconds = 1e-9;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double weightedMedian(const std::vector<double>& values, const std::vector<double>& weights) {
  std::vector<size_t> order(values.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return values[x] != values[y] ? values[x] < values[y] : x < y;
  });
  double total = 0.0;
  for (double w : weights) total += w;
  double cumulative = 0.0;
  for (size_t i : order) {
    cumulative += weights[i];
    if (cumulative >= 0.5 * total) return values[i];
  }
  return values[order.back()];
}

// Weighted least squares of t = a + c*m with a >= 0, c > 0, plus the prior a = shape * c with
// weight `prior` relative to the data (a pseudo-observation of a - shape * c = 0). Sizes are scaled
// to ~1 first so the 2x2 system is well conditioned. With one size the line goes through the point
// and (-shape, 0), exactly: with shape 0, through the origin. The weights are precisions up to the
// factor noise^2 (1 / seconds^2), so the covariance of (a, c) is noise2 times the inverse of the
// normal matrix, the prior included.
CostModel fitLine(const std::vector<ThroughputPoint>& points, const std::vector<double>& weights,
                  const std::vector<bool>& use, double prior, double shape, double noise2) {
  double v = 0.0, vm = 0.0, vt = 0.0;
  for (size_t j = 0; j < points.size(); ++j) {
    if (!use[j]) continue;
    v += weights[j];
    vm += weights[j] * double(points[j].microBatch);
    vt += weights[j] * points[j].seconds;
  }
  const double mScale = vm / v, tScale = vt / v;
  const double k = shape / mScale, p = v * prior;  // the prior's row (1, -k), its weight p
  double s0 = v + p, s1 = -p * k, s2 = p * k * k, r0 = 0.0, r1 = 0.0;
  for (size_t j = 0; j < points.size(); ++j) {
    if (!use[j]) continue;
    const double x = double(points[j].microBatch) / mScale, y = points[j].seconds / tScale;
    s1 += weights[j] * x;
    s2 += weights[j] * x * x;
    r0 += weights[j] * y;
    r1 += weights[j] * x * y;
  }
  const double det = s0 * s2 - s1 * s1;
  double a = (r0 * s2 - s1 * r1) / det;
  double c = (s0 * r1 - s1 * r0) / det;
  // The same information whichever estimate is kept: with one size, the prior alone bounds the
  // overhead, and its variance says so.
  CostModel model;
  model.overheadVariance = noise2 * s2 / det;
  model.covariance = -noise2 * s1 / (det * mScale);
  model.perSampleVariance = noise2 * s0 / (det * mScale * mScale);
  if (!(a >= 0.0 && c > 0.0)) {
    // Unphysical line (time falling with size, or negative overhead): noise or a change of speed
    // between two sizes. Proportional through the origin is the safe reading.
    a = 0.0;
    c = r1 / s2;
  }
  model.overhead = a * tScale;
  model.perSample = std::max(c * tScale / mScale, kMinSeconds);
  return model;
}

// The standard error of the overhead that the points alone give (no prior): infinite when they
// hold one size only. Weights and noise2 as in fitLine.
double dataOverheadError(const std::vector<ThroughputPoint>& points,
                         const std::vector<double>& weights, const std::vector<bool>& use,
                         double noise2) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0;
  for (size_t j = 0; j < points.size(); ++j) {
    if (!use[j]) continue;
    const double m = double(points[j].microBatch);
    s0 += weights[j], s1 += weights[j] * m, s2 += weights[j] * m * m;
  }
  const double det = s0 * s2 - s1 * s1;
  // Sizes all alike (det a rounding error of s0 * s2): the overhead is not measured at all.
  if (!(det > 1e-9 * s0 * s2)) return std::numeric_limits<double>::infinity();
  return std::sqrt(noise2 * s2 / det);
}

struct Fit {
  CostModel cost;
  // The points alone bound the overhead within kShapeError of the time at the reference size:
  // the fit's shape is measured, not the prior's.
  bool shapeMeasured = false;
};

// The fit of `points` (ordered by step) at time `now`, weighted toward `reference`, the overhead
// pulled toward `shape` per-sample costs: the passes of ThroughputModel::refit.
Fit robustFit(const std::vector<ThroughputPoint>& points, int64_t now, int64_t reference,
              double shape) {
  const size_t n = points.size();
  std::vector<double> base(n);
  for (size_t j = 0; j < n; ++j) {
    const double distance =
        std::log(double(points[j].microBatch) / double(reference)) / ThroughputModel::kLocality;
    base[j] = std::pow(ThroughputModel::kDecay, double(now - points[j].step)) *
              std::exp(-0.5 * distance * distance);
  }
  // Start from plain weighted least squares on every point with the prior noise; each pass then
  // drops the outliers of the last fit, weights points by the inverse square of their predicted
  // time (timing noise is relative) and re-estimates the noise that sets the prior's weight. A
  // fixed number of passes keeps the result a pure function of the points.
  std::vector<bool> inlier(n, true);
  std::vector<double> weights = base;
  double noise2 = ThroughputModel::kNoisePrior * ThroughputModel::kNoisePrior;
  auto priorWeight = [&](double effectivePoints) {
    return noise2 /
           (effectivePoints * ThroughputModel::kOverheadPrior * ThroughputModel::kOverheadPrior);
  };
  auto effectivePoints = [&] {  // Kish: (sum w)^2 / sum w^2 over the inliers
    double sum = 0.0, sum2 = 0.0;
    for (size_t j = 0; j < n; ++j)
      if (inlier[j]) sum += base[j], sum2 += base[j] * base[j];
    return sum * sum / sum2;
  };
  CostModel fit = fitLine(points, weights, inlier, priorWeight(effectivePoints()), shape, noise2);
  const double tolerance = std::log(ThroughputModel::kOutlierRatio);
  for (int pass = 0; pass < 4; ++pass) {
    std::vector<double> ratio(n);
    for (size_t j = 0; j < n; ++j) {
      const double predicted = fit.seconds(points[j].microBatch, 1);
      ratio[j] = points[j].seconds / predicted;
      weights[j] = base[j] / (predicted * predicted);
    }
    const double center = weightedMedian(ratio, base);
    double residual = 0.0, total = 0.0;
    for (size_t j = 0; j < n; ++j) {
      inlier[j] = std::abs(std::log(ratio[j] / center)) <= tolerance;
      if (inlier[j]) residual += base[j] * (ratio[j] - 1) * (ratio[j] - 1), total += base[j];
    }
    const double effective = effectivePoints();
    const double prior2 = ThroughputModel::kNoisePrior * ThroughputModel::kNoisePrior;
    noise2 = (effective * residual / total + ThroughputModel::kNoisePriorPoints * prior2) /
             (std::max(effective - 2.0, 0.0) + ThroughputModel::kNoisePriorPoints);
    fit = fitLine(points, weights, inlier, priorWeight(effective), shape, noise2);
  }
  fit.noise = std::sqrt(noise2);
  const double reference1 = fit.seconds(reference, 1);
  fit.relativeError = fit.standardError(reference, 1) / reference1;
  const double overheadError = dataOverheadError(points, weights, inlier, noise2);
  return {fit, overheadError <= ThroughputModel::kShapeError * reference1};
}

// The micro-batch size of the latest step: its most frequent size, the larger on a tie.
int64_t latestSize(const std::vector<ThroughputPoint>& points) {
  const int64_t step = points.back().step;
  int64_t size = 0, count = 0;
  for (size_t j = points.size(); j-- > 0 && points[j].step == step;)
    if (points[j].count > count || (points[j].count == count && points[j].microBatch > size))
      size = points[j].microBatch, count = points[j].count;
  return size;
}

int distinctSteps(const std::vector<ThroughputPoint>& points) {
  int steps = 0;
  for (size_t j = 0; j < points.size(); ++j)
    steps += j == 0 || points[j - 1].step != points[j].step;
  return steps;
}

// Index of the first point of the last `steps` distinct steps (0 when there are not more).
size_t firstOfLastSteps(const std::vector<ThroughputPoint>& points, int steps) {
  int distinct = 0;
  for (size_t j = points.size(); j-- > 0;)
    if (j == 0 || points[j - 1].step != points[j].step)
      if (++distinct == steps) return j;
  return 0;
}

}  // namespace

double CostModel::standardError(int64_t samples, int64_t microBatches) const {
  if (samples <= 0) return 0.0;
  const double k = double(microBatches), b = double(samples);
  return std::sqrt(std::max(
      0.0, k * k * overheadVariance + 2.0 * k * b * covariance + b * b * perSampleVariance));
}

void ThroughputModel::addStep(int64_t step,
                              const std::vector<std::pair<int64_t, double>>& observations) {
  if (observations.empty()) return;
  HETRA_ENFORCE(points_.empty() || points_.back().step < step, "steps must increase: step ", step,
                " after ", points_.back().step);
  std::map<int64_t, std::vector<double>> bySize;  // ordered: points are added in a fixed order
  for (const auto& [microBatch, seconds] : observations)
    bySize[microBatch].push_back(std::max(seconds, kMinSeconds));
  for (auto& [microBatch, times] : bySize)
    points_.push_back({step, microBatch, median(times), int64_t(times.size())});
  lastObserved_ = step;

  if (distinctSteps(points_) > kWindowSteps)
    points_.erase(points_.begin(),
                  points_.begin() + ptrdiff_t(firstOfLastSteps(points_, kWindowSteps)));
  refit(step);
}

bool ThroughputModel::speedChanged() const {
  // The older points must stand on their own (as many steps as the recent ones) to judge by.
  if (distinctSteps(points_) < 2 * kChangeSteps) return false;
  const size_t recent = firstOfLastSteps(points_, kChangeSteps);
  const std::vector<ThroughputPoint> older(points_.begin(), points_.begin() + ptrdiff_t(recent));
  const CostModel before = robustFit(older, points_.back().step, latestSize(points_), shape_).cost;
  const double margin = std::max(std::log(kChangeRatio), kChangeSigmas * before.noise);
  int above = 0, below = 0;
  double lowest = std::numeric_limits<double>::infinity(), highest = -lowest;
  for (size_t j = recent; j < points_.size(); ++j) {
    const double offBy = std::log(points_[j].seconds / before.seconds(points_[j].microBatch, 1));
    above += offBy > margin;
    below += offBy < -margin;
    lowest = std::min(lowest, offBy);
    highest = std::max(highest, offBy);
  }
  // A new speed is one level: the recent points agree among themselves as closely as they
  // disagree with the old fit. Interference (a neighbour's burst of work) is erratic: 1.5x, 3x,
  // 1.8x in three steps is outliers, not a device that changed.
  const int recentPoints = int(points_.size() - recent);
  return (above == recentPoints || below == recentPoints) && highest - lowest <= 2.0 * margin;
}

void ThroughputModel::refit(int64_t now) {
  if (speedChanged()) {
    points_.erase(points_.begin(),
                  points_.begin() + ptrdiff_t(firstOfLastSteps(points_, kChangeSteps)));
    // The update runs on the same device: its older costs are the old speed's too.
    const int64_t since = points_.front().step;
    std::erase_if(stepCosts_, [&](const auto& c) { return c.first < since; });
    ++changes_;
  }
  const Fit fit = robustFit(points_, now, latestSize(points_), shape_);
  cost_ = fit.cost;
  if (keepShape_ && fit.shapeMeasured) shape_ = cost_.overhead / cost_.perSample;
  updateStepCost();
}

void ThroughputModel::addStepCost(int64_t step, double seconds) {
  HETRA_ENFORCE(std::isfinite(seconds) && seconds >= 0.0, "step cost ", seconds, "s");
  HETRA_ENFORCE(stepCosts_.empty() || stepCosts_.back().first < step,
                "steps must increase: step cost of step ", step, " after ",
                stepCosts_.back().first);
  stepCosts_.push_back({step, seconds});
  if (stepCosts_.size() > size_t(kStepCostWindow)) stepCosts_.erase(stepCosts_.begin());
  updateStepCost();
}

void ThroughputModel::updateStepCost() {
  std::vector<double> seconds;
  for (const auto& c : stepCosts_) seconds.push_back(c.second);
  cost_.perStep = seconds.empty() ? 0.0 : median(std::move(seconds));
}

void ThroughputModel::forgetPoints() {
  points_.clear();
  stepCosts_.clear();
  cost_.perStep = 0.0;
  ++changes_;
}

nlohmann::json ThroughputModel::toJson() const {
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : points_) points.push_back({p.step, p.microBatch, p.seconds, p.count});
  return {{"cost",
           {cost_.overhead, cost_.perSample, cost_.relativeError, cost_.noise,
            cost_.overheadVariance, cost_.covariance, cost_.perSampleVariance}},
          {"changes", changes_},
          {"keep_shape", keepShape_},
          {"shape", shape_},
          {"last_observed", lastObserved_},
          {"points", points},
          {"step_costs", stepCosts_}};
}

ThroughputModel ThroughputModel::fromJson(const nlohmann::json& j) {
  ThroughputModel model;
  const auto& c = j.at("cost");
  model.cost_ = {c.at(0).get<double>(), c.at(1).get<double>(), c.at(2).get<double>(),
                 c.at(3).get<double>(), c.at(4).get<double>(), c.at(5).get<double>(),
                 c.at(6).get<double>()};
  model.changes_ = j.at("changes").get<int64_t>();
  for (const auto& p : j.at("points"))
    model.points_.push_back({p.at(0).get<int64_t>(), p.at(1).get<int64_t>(), p.at(2).get<double>(),
                             p.at(3).get<int64_t>()});
  model.keepShape_ = j.value("keep_shape", true);  // absent before 2026-12-06, as are the next
  model.shape_ = j.value("shape", 0.0);
  if (j.contains("last_observed"))
    model.lastObserved_ = j.at("last_observed").get<int64_t>();
  else if (!model.points_.empty())
    model.lastObserved_ = model.points_.back().step;
  if (j.contains("step_costs"))  // absent before 2026-12-05
    model.stepCosts_ = j.at("step_costs").get<std::vector<std::pair<int64_t, double>>>();
  model.updateStepCost();
  return model;
}

}  // namespace hetra::balance
