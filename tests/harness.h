// Test helpers: run one thread per rank inside one process (Gloo's test style) and fill buffers
// with a distinct value per rank and element, so misplaced data shows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/reduce.h"
#include "common/dtype.h"
#include "common/errors.h"
#include "common/logging.h"

namespace hetra::test {

// Runs fn(rank) on `size` threads and returns each rank's exception (nullptr where it succeeded).
inline std::vector<std::exception_ptr> runRanksCollect(int size,
                                                       const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      log::setRank(rank);
      try {
        fn(rank);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Runs fn(rank) on `size` threads and rethrows the first failure, prefixed with its rank.
inline void runRanks(int size, const std::function<void(int)>& fn) {
  auto errors = runRanksCollect(size, fn);
  for (int rank = 0; rank < size; ++rank) {
    if (!errors[rank]) continue;
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const std::exception& e) {
      throw std::runtime_error("rank " + std::to_string(rank) + ": " + e.what());
    }
  }
}

// Expects the mismatch on every rank as that rank learns of it: MismatchError where the rank
// compared the calls itself, PeerAbortedError naming the rank that did where that one aborted the
// group; both carry `reason`, and at least one rank saw it first-hand. Any other error, such as
// the TimeoutError of a rank that waited for its deadline, fails the test.
inline void expectMismatchOnEveryRank(const std::vector<std::exception_ptr>& errors,
                                      const std::string& reason) {
  int firstHand = 0;
  for (size_t rank = 0; rank < errors.size(); ++rank) {
    if (!errors[rank]) {
      ADD_FAILURE() << "rank " << rank << " did not fail";
      continue;
    }
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const MismatchError& e) {
      ++firstHand;
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos)
          << "rank " << rank << ": " << e.what();
    } catch (const PeerAbortedError& e) {
      EXPECT_GE(e.rank(), 0) << "rank " << rank << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos)
          << "rank " << rank << ": " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << " failed with " << e.what() << " instead of the mismatch";
    }
  }
  EXPECT_GT(firstHand, 0) << "no rank reported the mismatch itself";
}

// Test values, exact in their dtype, distinct per (rank, element), with sums over `ranks` ranks
// exact too (in any order, so every algorithm's partial sums are). Each element holds
// code - offset, code = (rank * window + index) mod period: over any `window` consecutive elements
// no two (rank, element) pairs share a value, and a misplaced element or block shows. The period
// is odd and coprime with 3, 5 and 7, so it never lines up with how a world of up to 10 ranks cuts
// the buffer into chunks. Wide types (f32, f64, i32, i64) share f32's range (integers below 2^24
// in magnitude, sums included), which makes the window longer than any test's count; f16 (11-bit
// significand), bf16 (8 bits) and u8 (0..255, no wrap) are as distinct as their range allows.
struct DistinctValues {
  int64_t period = 1;
  int64_t window = 1;
  int64_t offset = 0;

  DistinctValues(DType dtype, int ranks) {
    ranks = std::max(ranks, 1);
    const bool isUnsigned = dtype == DType::U8;
    const int64_t exactSum = dtype == DType::F16    ? int64_t(1) << 11
                             : dtype == DType::BF16 ? int64_t(1) << 8
                             : dtype == DType::U8   ? 255
                                                    : int64_t(1) << 24;
    const int64_t bound = exactSum / ranks;  // every value in [-bound, bound] ([0, bound] for u8)
    period = isUnsigned ? bound + 1 : 2 * bound + 1;
    while (period > 1 && std::gcd(period, int64_t(2 * 3 * 5 * 7)) != 1) --period;
    window = std::max<int64_t>(1, period / ranks);
    offset = isUnsigned ? 0 : bound;
  }
  double operator()(int rank, size_t index) const {
    const int64_t code = (int64_t(rank) * window + int64_t(index % size_t(period))) % period;
    return double(code - offset);
  }
};

inline double distinctValue(DType dtype, int ranks, int rank, size_t index) {
  return DistinctValues(dtype, ranks)(rank, index);
}

// The f32 values of a group of up to 8 ranks, or bf16's when `smallRange`: kept for callers not
// yet passing their dtype and world size.
inline double distinctValue(int rank, size_t index, bool smallRange) {
  return distinctValue(smallRange ? DType::BF16 : DType::F32, 8, rank, index);
}

// `op` over value(0), ..., value(n - 1) in double, in rank order (Avg reduced as Sum): the tests'
// own reference, independent of the reduction kernels under test.
template <typename Value>
double reduceOverRanks(comm::ReduceOp op, int n, Value value) {
  double acc = value(0);
  for (int r = 1; r < n; ++r) {
    const double v = value(r);
    acc = op == comm::ReduceOp::Min   ? std::min(acc, v)
          : op == comm::ReduceOp::Max ? std::max(acc, v)
                                      : acc + v;
  }
  return acc;
}

}  // namespace hetra::test
