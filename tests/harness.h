// Test helpers: run one thread per rank inside one process (Gloo's test style) and fill buffers
// with a distinct value per rank and element, so misplaced data shows.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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

// A value distinct per (rank, element) that fits exactly in every dtype we test with small counts:
// integers exact; floats exact for float32/float64, small integers for half types.
inline double distinctValue(int rank, size_t index, bool smallRange) {
  if (smallRange) return double((rank * 7 + index * 3) % 61) - 30.0;  // exact in f16/bf16/u8 sums
  return double(rank) * 1000.0 + double(index % 997) + 0.25 * double(index % 3);
}

}  // namespace hetra::test
