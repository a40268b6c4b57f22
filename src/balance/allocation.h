// Exact integer split of a global batch over ranks under per-rank cost models and memory caps.
//
// Vocabulary:
//   share b_i   samples of the global batch B given to rank i (sum b_i = B).
//   cap_i       the most samples rank i's memory allows in one micro-batch.
//   k_i         accumulation steps: rank i's micro-batches, ceil(b_i / cap_i) (0 when b_i = 0).
//               The fewest micro-batches is always best, since the overhead a_i >= 0 is paid
//               per micro-batch.
//   m_i         micro-batch size ceil(b_i / k_i) <= cap_i: the same k_i micro-batches (same
//               predicted time) but as even as possible, so no needlessly tiny last one.
//   T_i(b)      predicted step time u_i + k_i * a_i + c_i * b (u_i the rank's step cost, paid
//               whatever its share); nondecreasing in b, T_i(0) = u_i.
//   level T     a candidate step time; fits_i(T) = max{b : T_i(b) <= T}.
//
// The least max_i T_i(b_i) is the B-th smallest value of the multiset {T_i(b) : all i, b >= 1}, so
// handing out samples one at a time, each to the rank whose next sample ends soonest (ties to the
// lower rank), is optimal. We get there fast: bisect on T for the highest level with
// sum_i fits_i(T) <= B, start from those fits (the very state the one-at-a-time greedy passes
// through) and hand out the few remaining samples one at a time. Everything is a pure function of
// its inputs, so every rank computes the same split.
#pragma once

#include <cstdint>
#include <vector>

#include "balance/throughput_model.h"

namespace hetra::balance {

int64_t accumSteps(int64_t batch, int64_t cap);
int64_t microBatchSize(int64_t batch, int64_t cap);
double predictSeconds(const CostModel& cost, int64_t batch, int64_t cap);

// Minimises max_i T_i(b_i) subject to sum b_i = globalBatch. A rank gets 0 samples only when even
// one sample would make it the slowest, beyond the optimum. Every cost must be known(). With
// `accumulate` false every b_i is also at most cap_i (one micro-batch each), which needs
// sum cap_i >= globalBatch.
std::vector<int64_t> optimalShares(const std::vector<CostModel>& costs,
                                   const std::vector<int64_t>& caps, int64_t globalBatch,
                                   bool accumulate = true);

// globalBatch / ranks each, the remainder one each to the lowest ranks (as DDP with an even
// sampler).
std::vector<int64_t> equalShares(int64_t globalBatch, size_t ranks);

// Whether one micro-batch each can hold the batch: sum min(cap_i, globalBatch) >= globalBatch.
bool capsHoldBatch(const std::vector<int64_t>& caps, int64_t globalBatch);

// The most even split with every b_i <= cap_i (needs sum cap_i >= globalBatch): equal shares,
// what a capped rank cannot take spread evenly over the others, remainders to the lowest ranks.
std::vector<int64_t> equalSharesWithinCaps(int64_t globalBatch, const std::vector<int64_t>& caps);

}  // namespace hetra::balance
