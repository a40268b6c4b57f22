#include "balance/allocation.h"

#include <algorithm>
#include <limits>
#include <queue>

#include "common/errors.h"

namespace hetra::balance {

int64_t accumSteps(int64_t batch, int64_t cap) {
  return batch <= 0 ? 0 : (batch + cap - 1) / cap;
}

int64_t microBatchSize(int64_t batch, int64_t cap) {
  const int64_t k = accumSteps(batch, cap);
  return k == 0 ? 0 : (batch + k - 1) / k;
}

double predictSeconds(const CostModel& cost, int64_t batch, int64_t cap) {
  return cost.stepSeconds(batch, accumSteps(batch, cap));
}

std::vector<int64_t> equalShares(int64_t globalBatch, size_t ranks) {
  std::vector<int64_t> shares(ranks, globalBatch / int64_t(ranks));
  for (size_t i = 0; i < size_t(globalBatch % int64_t(ranks)); ++i) ++shares[i];
  return shares;
}

namespace {

// sum min(cap_i, level): what the ranks hold when each takes up to `level` samples (level is at
// most the global batch: no overflow).
int64_t filledTo(const std::vector<int64_t>& caps, int64_t level) {
  int64_t sum = 0;
  for (int64_t c : caps) sum += std::min(c, level);
  return sum;
}

}  // namespace

bool capsHoldBatch(const std::vector<int64_t>& caps, int64_t globalBatch) {
  return filledTo(caps, globalBatch) >= globalBatch;
}

std::vector<int64_t> equalSharesWithinCaps(int64_t globalBatch, const std::vector<int64_t>& caps) {
  HETRA_ENFORCE(!caps.empty() && globalBatch >= 0, "ranks ", caps.size(), ", global batch ",
                globalBatch);
  HETRA_ENFORCE(capsHoldBatch(caps, globalBatch), "caps cannot hold ", globalBatch, " samples");
  // Water-filling: the highest level L with sum min(cap_i, L) <= B, then one more sample each to
  // the lowest ranks with room.
  int64_t lo = 0, hi = globalBatch;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (filledTo(caps, mid) <= globalBatch)
      lo = mid;
    else
      hi = mid - 1;
  }
  std::vector<int64_t> shares;
  int64_t left = globalBatch;
  for (int64_t c : caps) left -= shares.emplace_back(std::min(c, lo));
  for (size_t i = 0; i < caps.size() && left > 0; ++i)
    if (shares[i] < caps[i]) ++shares[i], --left;
  return shares;
}

std::vector<int64_t> optimalShares(const std::vector<CostModel>& costs,
                                   const std::vector<int64_t>& caps, int64_t globalBatch,
                                   bool accumulate) {
  const size_t n = costs.size();
  HETRA_ENFORCE_EQ(caps.size(), n, "one cap per rank");
  HETRA_ENFORCE(n > 0 && globalBatch >= 0, "ranks ", n, ", global batch ", globalBatch);
  for (size_t i = 0; i < n; ++i)
    HETRA_ENFORCE(costs[i].known() && caps[i] >= 1, "rank ", i, " has no cost model or cap ",
                  caps[i]);
  HETRA_ENFORCE(accumulate || capsHoldBatch(caps, globalBatch),
                "one micro-batch each: the caps cannot hold ", globalBatch, " samples");
  // Without accumulation a share beyond the cap never ends.
  auto time = [&](size_t i, int64_t b) {
    return !accumulate && b > caps[i] ? std::numeric_limits<double>::infinity()
                                      : predictSeconds(costs[i], b, caps[i]);
  };
  auto fits = [&](size_t i, double level) {
    // 0 when even no sample fits below the level (a step cost above it): such a level fills too
    // little and the bisection moves up.
    int64_t lo = 0, hi = globalBatch;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (time(i, mid) <= level)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  };
  auto total = [&](double level) {
    int64_t sum = 0;
    for (size_t i = 0; i < n; ++i) sum += fits(i, level);
    return sum;
  };

  // Highest level that does not over-fill; the fastest rank alone fits everything at `hi` (without
  // accumulation: every rank fits its cap at the slowest of those times).
  double lo = 0.0, hi = time(0, globalBatch);
  for (size_t i = 1; i < n; ++i) hi = std::min(hi, time(i, globalBatch));
  if (!accumulate) {
    double full = 0.0;
    for (size_t i = 0; i < n; ++i) full = std::max(full, time(i, std::min(caps[i], globalBatch)));
    hi = std::min(hi, full);
  }
  for (int iter = 0; iter < 200; ++iter) {
    const double mid = lo + 0.5 * (hi - lo);
    if (!(mid > lo && mid < hi)) break;
    if (total(mid) <= globalBatch)
      lo = mid;
    else
      hi = mid;
  }
  std::vector<int64_t> shares(n);
  int64_t remaining = globalBatch;
  for (size_t i = 0; i < n; ++i) remaining -= (shares[i] = fits(i, lo));

  using Next =
      std::pair<double, size_t>;  // (time with one more sample, rank): ties to the lower rank
  std::priority_queue<Next, std::vector<Next>, std::greater<Next>> queue;
  for (size_t i = 0; i < n; ++i) queue.push({time(i, shares[i] + 1), i});
  for (; remaining > 0; --remaining) {
    const size_t i = queue.top().second;
    queue.pop();
    ++shares[i];
    queue.push({time(i, shares[i] + 1), i});
  }

  // The greedy may leave a rank at 0 on a tie; give it one sample when that does not raise the step
  // time, taken from the slowest rank that keeps at least one.
  for (size_t i = 0; i < n; ++i) {
    if (shares[i] != 0) continue;
    double slowest = 0.0;
    size_t donor = n;
    for (size_t j = 0; j < n; ++j) {
      const double t = time(j, shares[j]);
      if (t >= slowest) slowest = t;
      if (shares[j] >= 2 && (donor == n || t >= time(donor, shares[donor]))) donor = j;
    }
    if (donor == n || time(i, 1) > slowest) continue;
    --shares[donor];
    shares[i] = 1;
  }
  return shares;
}

}  // namespace hetra::balance
