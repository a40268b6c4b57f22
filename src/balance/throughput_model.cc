#include "balance/throughput_model.h"

#include <algorithm>
#include <cmath>
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

// Weighted least squares of t = a + c*m with a >= 0, c > 0, plus the prior a = 0 with weight
// `prior` relative to the data (a pseudo-point at the origin). Sizes and times are scaled to ~1
// first so the 2x2 system is well conditioned. With one size the line goes through the origin,
// exactly.
CostModel fitLine(const std::vector<ThroughputPoint>& points, const std::vector<double>& weights,
                  const std::vector<bool>& use, double prior) {
  double v = 0.0, vm = 0.0, vt = 0.0;
  for (size_t j = 0; j < points.size(); ++j) {
    if (!use[j]) continue;
    v += weights[j];
    vm += weights[j] * double(points[j].microBatch);
    vt += weights[j] * points[j].seconds;
  }
  const double mScale = vm / v, tScale = vt / v;
  double s0 = v * (1.0 + prior), s1 = 0.0, s2 = 0.0, r0 = 0.0, r1 = 0.0;
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
  if (!(a >= 0.0 && c > 0.0)) {
    // Unphysical line (time falling with size, or negative overhead): noise or a change of speed
    // between two sizes. Proportional through the origin is the safe reading.
    a = 0.0;
    c = r1 / s2;
  }
  CostModel model;
  model.overhead = a * tScale;
  model.perSample = std::max(c * tScale / mScale, kMinSeconds);
  return model;
}

}  // namespace

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

  // Keep the last kWindowSteps distinct steps.
  int distinct = 0;
  size_t keepFrom = 0;
  for (size_t j = points_.size(); j-- > 0;) {
    if (j + 1 == points_.size() || points_[j].step != points_[j + 1].step) {
      if (++distinct > kWindowSteps) {
        keepFrom = j + 1;
        break;
      }
    }
  }
  points_.erase(points_.begin(), points_.begin() + ptrdiff_t(keepFrom));
  refit(step);
}

void ThroughputModel::refit(int64_t now) {
  const size_t n = points_.size();
  std::vector<double> age(n);
  for (size_t j = 0; j < n; ++j)
    age[j] = double(points_[j].count) * std::pow(kDecay, double(now - points_[j].step));

  // Start from plain weighted least squares on every point with the prior noise; each pass then
  // drops the outliers of the last fit, weights points by the inverse square of their predicted
  // time (timing noise is relative) and re-estimates the noise that sets the prior's weight. A
  // fixed number of passes keeps the result a pure function of the points.
  std::vector<bool> inlier(n, true);
  std::vector<double> weights = age;
  double noise2 = kNoisePrior * kNoisePrior;
  auto priorWeight = [&](double effectivePoints) {
    return noise2 / (effectivePoints * kOverheadPrior * kOverheadPrior);
  };
  auto effectivePoints = [&] {  // Kish: (sum w)^2 / sum w^2 over the inliers
    double sum = 0.0, sum2 = 0.0;
    for (size_t j = 0; j < n; ++j)
      if (inlier[j]) sum += age[j], sum2 += age[j] * age[j];
    return sum * sum / sum2;
  };
  CostModel fit = fitLine(points_, weights, inlier, priorWeight(effectivePoints()));
  const double tolerance = std::log(kOutlierRatio);
  for (int pass = 0; pass < 4; ++pass) {
    std::vector<double> ratio(n);
    for (size_t j = 0; j < n; ++j) {
      const double predicted = fit.seconds(points_[j].microBatch, 1);
      ratio[j] = points_[j].seconds / predicted;
      weights[j] = age[j] / (predicted * predicted);
    }
    const double center = weightedMedian(ratio, age);
    double residual = 0.0, total = 0.0;
    for (size_t j = 0; j < n; ++j) {
      inlier[j] = std::abs(std::log(ratio[j] / center)) <= tolerance;
      if (inlier[j]) residual += age[j] * (ratio[j] - 1) * (ratio[j] - 1), total += age[j];
    }
    const double points = effectivePoints();
    noise2 = (points * residual / total + kNoisePriorPoints * kNoisePrior * kNoisePrior) /
             (std::max(points - 2.0, 0.0) + kNoisePriorPoints);
    fit = fitLine(points_, weights, inlier, priorWeight(points));
  }
  cost_ = fit;
  cost_.relativeError = std::sqrt(noise2 / effectivePoints());
}

nlohmann::json ThroughputModel::toJson() const {
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : points_) points.push_back({p.step, p.microBatch, p.seconds, p.count});
  return {{"overhead", cost_.overhead},
          {"per_sample", cost_.perSample},
          {"relative_error", cost_.relativeError},
          {"points", points}};
}

ThroughputModel ThroughputModel::fromJson(const nlohmann::json& j) {
  ThroughputModel model;
  model.cost_.overhead = j.at("overhead").get<double>();
  model.cost_.perSample = j.at("per_sample").get<double>();
  model.cost_.relativeError = j.at("relative_error").get<double>();
  for (const auto& p : j.at("points"))
    model.points_.push_back({p.at(0).get<int64_t>(), p.at(1).get<int64_t>(), p.at(2).get<double>(),
                             p.at(3).get<int64_t>()});
  return model;
}

}  // namespace hetra::balance
