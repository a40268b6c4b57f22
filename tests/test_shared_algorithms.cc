// The shared-memory collectives (algorithms/shared.cc) on real ranks: one thread per rank, each
// with its own shm transport, sweeping world size x count x dtype x op with a distinct value per
// rank and element, plus mismatched calls, aborts and timeouts.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/algorithms/shared.h"
#include "comm/transport/shm_transport.h"
#include "common/errors.h"
#include "harness.h"
#include "shm_testing.h"
#include "store/store.h"

namespace hetra::comm {
namespace {

using test::distinctValue;
using test::runRanks;
using test::runRanksCollect;

// A small slot (pieces of 2 KiB) so that modest counts already take the multi-piece paths.
constexpr size_t kSmallSlot = 8192;
const std::vector<int> kWorldSizes = {1, 2, 3, 4, 5, 8};

std::unique_ptr<Transport> connect(store::Store& store, int rank, int size, size_t slotBytes) {
  ShmOptions options;
  options.timeout = Millis(20000);
  options.slotBytes = slotBytes;
  return createShmTransport(store, rank, size, options);
}

// Rank `rank`'s element `index` in a group of n: exact in dtype, distinct per (rank, element), and
// sums over n ranks stay exact (harness.h), so every result is compared exactly.
double inputValue(DType dtype, int n, int rank, size_t index) {
  return distinctValue(dtype, n, rank, index);
}

// op over every rank's inputValue (Avg is reduced as Sum).
double expectedReduce(DType dtype, ReduceOp op, int n, size_t index) {
  return test::reduceOverRanks(op, n, [&](int r) { return inputValue(dtype, n, r, index); });
}

// Collects the first few wrong elements of one rank instead of throwing, so that the other ranks
// keep running the sweep in step and every failure is reported.
class Checker {
 public:
  // `what` builds the message only for a failure: the sweep checks millions of elements.
  template <typename What>
  void expect(bool ok, const What& what) {
    if (ok || failures_.size() >= 5) return;
    failures_.push_back(what());
  }
  void finish(int rank) {
    if (failures_.empty()) return;
    std::string text = str("rank ", rank, ":");
    for (const auto& f : failures_) text += "\n  " + f;
    throw std::runtime_error(text);
  }

 private:
  std::vector<std::string> failures_;
};

std::vector<uint8_t> bufferOf(DType dtype, size_t count) {
  return std::vector<uint8_t>(std::max<size_t>(count, 1) * dtypeSize(dtype), 0xEE);
}

Deadline testDeadline() {
  return deadlineAfter(Millis(20000));
}

void sweepAllreduce(SharedArena& arena, uint64_t& seq, Checker& check,
                    const std::vector<size_t>& counts, const std::vector<DType>& dtypes,
                    bool inPlace) {
  const int n = arena.size(), me = arena.rank();
  for (DType dtype : dtypes) {
    // Avg is reduced as Sum (the communicator divides afterwards).
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg}) {
      for (size_t count : counts) {
        auto in = bufferOf(dtype, count);
        auto out = bufferOf(dtype, count);
        for (size_t i = 0; i < count; ++i)
          storeElement(dtype, in.data(), i, inputValue(dtype, n, me, i));
        AllreduceArgs args;
        args.in = in.data();
        args.out = inPlace ? in.data() : out.data();
        args.count = count;
        args.dtype = dtype;
        args.op = op;
        args.seq = seq++;
        args.deadline = testDeadline();
        allreduceShared(arena, args);
        for (size_t i = 0; i < count; ++i) {
          const double got = loadElement(dtype, args.out, i),
                       want = expectedReduce(dtype, op, n, i);
          check.expect(got == want, [&] {
            return str("allreduce ", dtypeName(dtype), " ", reduceOpName(op), " count ", count,
                       inPlace ? " in place" : "", " n ", n, ": [", i, "] = ", got, ", want ",
                       want);
          });
        }
      }
    }
  }
}

// counts per rank for reduce-scatter and allgather: even (every rank `count`) or uneven (some
// zero).
std::vector<size_t> blockCounts(int n, size_t count, bool uneven) {
  std::vector<size_t> counts(n, count);
  if (uneven)
    for (int k = 0; k < n; ++k) counts[k] = k % 3 == 1 ? 0 : count + 13 * size_t(k);
  return counts;
}

void sweepReduceScatter(SharedArena& arena, uint64_t& seq, Checker& check,
                        const std::vector<size_t>& sizes, bool inPlace) {
  const int n = arena.size(), me = arena.rank();
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max}) {
      for (size_t count : sizes) {
        for (bool uneven : {false, true}) {
          const auto counts = blockCounts(n, count, uneven);
          const size_t total = totalCount(counts);
          size_t offset = 0;
          for (int k = 0; k < me; ++k) offset += counts[k];
          auto in = bufferOf(dtype, total);
          auto out = bufferOf(dtype, counts[me]);
          for (size_t i = 0; i < total; ++i)
            storeElement(dtype, in.data(), i, inputValue(dtype, n, me, i));
          ReduceScatterArgs args;
          args.in = in.data();
          // In place as NCCL does it: the output is this rank's block of the input.
          args.out = inPlace ? in.data() + offset * dtypeSize(dtype) : out.data();
          args.counts = counts;
          args.dtype = dtype;
          args.op = op;
          args.seq = seq++;
          args.deadline = testDeadline();
          reduceScatterShared(arena, args);
          for (size_t i = 0; i < counts[me]; ++i) {
            const double got = loadElement(dtype, args.out, i);
            const double want = expectedReduce(dtype, op, n, offset + i);
            check.expect(got == want, [&] {
              return str("reduce-scatter ", dtypeName(dtype), " ", reduceOpName(op), " count ",
                         count, uneven ? " uneven" : "", inPlace ? " in place" : "", " n ", n,
                         ": [", i, "] = ", got, ", want ", want);
            });
          }
        }
      }
    }
  }
}

void sweepAllgather(SharedArena& arena, uint64_t& seq, Checker& check,
                    const std::vector<size_t>& sizes, bool inPlace) {
  const int n = arena.size(), me = arena.rank();
  for (DType dtype : kAllDTypes) {
    for (size_t count : sizes) {
      for (bool uneven : {false, true}) {
        const auto counts = blockCounts(n, count, uneven);
        const size_t total = totalCount(counts);
        std::vector<size_t> offsets(n + 1, 0);
        for (int k = 0; k < n; ++k) offsets[k + 1] = offsets[k] + counts[k];
        auto in = bufferOf(dtype, counts[me]);
        auto out = bufferOf(dtype, total);
        uint8_t* mine = inPlace ? out.data() + offsets[me] * dtypeSize(dtype) : in.data();
        // Element i of rank k's block carries inputValue(k, i): rank and position both show.
        for (size_t i = 0; i < counts[me]; ++i)
          storeElement(dtype, mine, i, inputValue(dtype, n, me, i));
        AllgatherArgs args;
        args.in = mine;
        args.out = out.data();
        args.counts = counts;
        args.dtype = dtype;
        args.seq = seq++;
        args.deadline = testDeadline();
        allgatherShared(arena, args);
        for (int k = 0; k < n; ++k) {
          for (size_t i = 0; i < counts[k]; ++i) {
            const double got = loadElement(dtype, out.data(), offsets[k] + i);
            const double want = inputValue(dtype, n, k, i);
            check.expect(got == want, [&] {
              return str("allgather ", dtypeName(dtype), " count ", count, uneven ? " uneven" : "",
                         inPlace ? " in place" : "", " n ", n, ": block ", k, " [", i, "] = ", got,
                         ", want ", want);
            });
          }
        }
      }
    }
  }
}

void sweepBroadcast(SharedArena& arena, uint64_t& seq, Checker& check,
                    const std::vector<size_t>& sizes) {
  const int n = arena.size(), me = arena.rank();
  for (DType dtype : kAllDTypes) {
    for (size_t count : sizes) {
      for (int root : {0, n - 1, n / 2}) {
        auto buf = bufferOf(dtype, count);
        if (me == root)
          for (size_t i = 0; i < count; ++i)
            storeElement(dtype, buf.data(), i, inputValue(dtype, n, root, i));
        BroadcastArgs args;
        args.buf = buf.data();
        args.count = count;
        args.dtype = dtype;
        args.root = root;
        args.seq = seq++;
        args.deadline = testDeadline();
        broadcastShared(arena, args);
        for (size_t i = 0; i < count; ++i) {
          const double got = loadElement(dtype, buf.data(), i);
          const double want = inputValue(dtype, n, root, i);
          check.expect(got == want, [&] {
            return str("broadcast ", dtypeName(dtype), " count ", count, " root ", root, " n ", n,
                       ": [", i, "] = ", got, ", want ", want);
          });
        }
      }
    }
  }
}

// Runs `body` on every world size, each rank with a fresh transport whose slot is `slotBytes`.
void forEachWorld(size_t slotBytes,
                  const std::function<void(SharedArena&, uint64_t&, Checker&)>& body) {
  for (int n : kWorldSizes) {
    SCOPED_TRACE(str("world size ", n));
    auto store = test::newGroupStore();
    runRanks(n, [&](int rank) {
      auto transport = connect(*store, rank, n, slotBytes);
      SharedArena* arena = transport->sharedArena();
      ASSERT_NE(arena, nullptr);
      uint64_t seq = 0;
      Checker check;
      body(*arena, seq, check);
      BarrierArgs done;
      done.seq = seq++;
      done.deadline = testDeadline();
      barrierShared(*arena, done);  // nobody unmaps while a peer still reads its slot
      check.finish(rank);
    });
  }
  EXPECT_TRUE(test::shmSegmentsOfPid(getpid()).empty());
}

// 0, 1, odd, several small pieces (2 KiB) and many pieces.
const std::vector<size_t> kCounts = {0, 1, 7, 1000, 5003};

TEST(SharedAlgorithms, AllreduceEveryDtypeOpAndCount) {
  forEachWorld(kSmallSlot, [](SharedArena& arena, uint64_t& seq, Checker& check) {
    std::vector<DType> dtypes(std::begin(kAllDTypes), std::end(kAllDTypes));
    sweepAllreduce(arena, seq, check, kCounts, dtypes, false);
    sweepAllreduce(arena, seq, check, {7, 1000, 5003}, {DType::F32, DType::BF16}, true);
  });
}

// A premultiplied sum: each rank's input counts its own power-of-two scale, multiplied in as the
// algorithm copies it (small buffer, pieces, own slice); the input stays as it was.
void sweepScaledAllreduce(SharedArena& arena, uint64_t& seq, Checker& check,
                          const std::vector<size_t>& counts) {
  const int n = arena.size(), me = arena.rank();
  const double scales[] = {0.5, 0.25, 2.0, 1.0, 4.0, 0.125, 2.0, 0.5};
  // Values below 2^15 in magnitude: every scaled sum of up to 8 ranks is exact in float32.
  const test::DistinctValues values(DType::F32, 512);
  for (DType dtype : {DType::F32, DType::F64}) {
    for (bool inPlace : {false, true}) {
      for (size_t count : counts) {
        auto in = bufferOf(dtype, count);
        auto out = bufferOf(dtype, count);
        for (size_t i = 0; i < count; ++i) storeElement(dtype, in.data(), i, values(me, i));
        const auto inBefore = in;
        AllreduceArgs args;
        args.in = in.data();
        args.out = inPlace ? in.data() : out.data();
        args.count = count;
        args.dtype = dtype;
        args.seq = seq++;
        args.deadline = testDeadline();
        args.inputScale = scales[me];
        allreduceShared(arena, args);
        for (size_t i = 0; i < count; ++i) {
          double want = 0;
          for (int r = 0; r < n; ++r) want += scales[r] * values(r, i);
          const double got = loadElement(dtype, args.out, i);
          check.expect(got == want, [&] {
            return str("scaled allreduce ", dtypeName(dtype), " count ", count,
                       inPlace ? " in place" : "", " n ", n, ": [", i, "] = ", got, ", want ",
                       want);
          });
        }
        if (!inPlace)
          check.expect(in == inBefore, [&] {
            return str("scaled allreduce ", dtypeName(dtype), " count ", count,
                       " changed its input");
          });
      }
    }
  }
}

TEST(SharedAlgorithms, AllreduceScalesThisRanksInputAsItReadsIt) {
  forEachWorld(kSmallSlot, [](SharedArena& arena, uint64_t& seq, Checker& check) {
    sweepScaledAllreduce(arena, seq, check, {0, 1, 7, 1000, 5003});
  });
  auto store = test::newGroupStore();  // the default slot: a message of a few large pieces
  runRanks(3, [&](int rank) {
    auto transport = connect(*store, rank, 3, 0);
    uint64_t seq = 0;
    Checker check;
    sweepScaledAllreduce(*transport->sharedArena(), seq, check, {300001});
    BarrierArgs done;
    done.seq = seq++;
    done.deadline = testDeadline();
    barrierShared(*transport->sharedArena(), done);
    check.finish(rank);
  });
}

TEST(SharedAlgorithms, ReduceScatterEvenAndUneven) {
  forEachWorld(kSmallSlot, [](SharedArena& arena, uint64_t& seq, Checker& check) {
    sweepReduceScatter(arena, seq, check, {0, 1, 7, 1000}, false);
    sweepReduceScatter(arena, seq, check, {7, 1000}, true);
  });
}

TEST(SharedAlgorithms, AllgatherEvenAndUneven) {
  forEachWorld(kSmallSlot, [](SharedArena& arena, uint64_t& seq, Checker& check) {
    sweepAllgather(arena, seq, check, {0, 1, 7, 1000, 3001}, false);
    sweepAllgather(arena, seq, check, {7, 3001}, true);
  });
}

TEST(SharedAlgorithms, BroadcastEveryRoot) {
  forEachWorld(kSmallSlot, [](SharedArena& arena, uint64_t& seq, Checker& check) {
    sweepBroadcast(arena, seq, check, {0, 1, 7, 1000, 5003});
  });
}

TEST(SharedAlgorithms, DefaultSlotLargeMessages) {
  // With the default slot (pieces of about 330 KiB), messages of a few pieces.
  for (int n : {2, 3, 4}) {
    auto store = test::newGroupStore();
    runRanks(n, [&](int rank) {
      auto transport = connect(*store, rank, n, 0);
      SharedArena& arena = *transport->sharedArena();
      uint64_t seq = 0;
      Checker check;
      sweepAllreduce(arena, seq, check, {4000, 300001}, {DType::F32, DType::BF16}, false);
      sweepAllreduce(arena, seq, check, {300001}, {DType::F64}, true);
      BarrierArgs done;
      done.seq = seq++;
      done.deadline = testDeadline();
      barrierShared(arena, done);
      check.finish(rank);
    });
  }
}

TEST(SharedAlgorithms, EmptyCallsAcceptNullBuffers) {
  for (int n : {1, 3}) {
    auto store = test::newGroupStore();
    runRanks(n, [&](int rank) {
      auto transport = connect(*store, rank, n, kSmallSlot);
      SharedArena& arena = *transport->sharedArena();
      AllreduceArgs ar;
      ar.deadline = testDeadline();
      allreduceShared(arena, ar);
      ReduceScatterArgs rs;
      rs.counts.assign(n, 0);
      rs.deadline = testDeadline();
      reduceScatterShared(arena, rs);
      AllgatherArgs ag;
      ag.counts.assign(n, 0);
      ag.deadline = testDeadline();
      allgatherShared(arena, ag);
      BroadcastArgs bc;
      bc.root = n - 1;
      bc.deadline = testDeadline();
      broadcastShared(arena, bc);
      BarrierArgs done;
      done.deadline = testDeadline();
      barrierShared(arena, done);
    });
  }
}

TEST(SharedAlgorithms, BarrierOrdersRanks) {
  for (int n : kWorldSizes) {
    auto store = test::newGroupStore();
    std::atomic<int> arrived{0};
    runRanks(n, [&](int rank) {
      auto transport = connect(*store, rank, n, kSmallSlot);
      for (int round = 0; round < 20; ++round) {
        arrived.fetch_add(1);
        BarrierArgs args;
        args.seq = uint64_t(round);
        args.deadline = testDeadline();
        barrierShared(*transport->sharedArena(), args);
        // Nobody leaves round r before everyone entered it.
        if (arrived.load() < (round + 1) * n)
          throw std::runtime_error(str("rank ", rank, " left barrier ", round, " early"));
        args.seq = uint64_t(1000 + round);  // a second barrier keeps rounds apart
        barrierShared(*transport->sharedArena(), args);
      }
    });
  }
}

// Runs `call(rank, arena)` on n ranks and expects MismatchError on every rank (a rank that waited
// for its deadline instead would throw TimeoutError).
void expectMismatchEverywhere(int n, const std::function<void(int, SharedArena&)>& call) {
  auto store = test::newGroupStore();
  auto errors = runRanksCollect(n, [&](int rank) {
    auto transport = connect(*store, rank, n, kSmallSlot);
    call(rank, *transport->sharedArena());
  });
  for (int rank = 0; rank < n; ++rank) {
    ASSERT_TRUE(errors[rank]) << "rank " << rank << " did not fail";
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const MismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("mismatched collective"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << " threw " << e.what() << " instead of MismatchError";
    }
  }
  EXPECT_TRUE(test::shmSegmentsOfPid(getpid()).empty());
}

TEST(SharedAlgorithms, MismatchedCallsFailOnEveryRank) {
  // Counts differ, one of them on the pipelined path: nobody may hang or overrun.
  expectMismatchEverywhere(3, [](int rank, SharedArena& arena) {
    const size_t count = rank == 1 ? 100000 : 10;
    std::vector<float> in(count, 1.0f), out(count);
    AllreduceArgs args;
    args.in = in.data();
    args.out = out.data();
    args.count = count;
    args.deadline = testDeadline();
    allreduceShared(arena, args);
  });
  // Same count, different dtype.
  expectMismatchEverywhere(2, [](int rank, SharedArena& arena) {
    std::vector<double> in(64, 1.0), out(64);
    AllreduceArgs args;
    args.in = in.data();
    args.out = out.data();
    args.count = 64;
    args.dtype = rank == 0 ? DType::F32 : DType::F64;
    args.deadline = testDeadline();
    allreduceShared(arena, args);
  });
  // Reduce-scatter with different counts vectors of the same total.
  expectMismatchEverywhere(4, [](int rank, SharedArena& arena) {
    std::vector<size_t> counts = {5, 5, 5, 5};
    if (rank == 3) counts = {4, 6, 5, 5};
    std::vector<float> in(20, 1.0f), out(6);
    ReduceScatterArgs args;
    args.in = in.data();
    args.out = out.data();
    args.counts = counts;
    args.deadline = testDeadline();
    reduceScatterShared(arena, args);
  });
  // Broadcast roots differ; a barrier against an allreduce.
  expectMismatchEverywhere(3, [](int rank, SharedArena& arena) {
    std::vector<int32_t> buf(3000, rank);
    BroadcastArgs args;
    args.buf = buf.data();
    args.count = buf.size();
    args.dtype = DType::I32;
    args.root = rank == 2 ? 1 : 0;
    args.deadline = testDeadline();
    broadcastShared(arena, args);
  });
  expectMismatchEverywhere(2, [](int rank, SharedArena& arena) {
    if (rank == 0) {
      BarrierArgs args;
      args.deadline = testDeadline();
      barrierShared(arena, args);
    } else {
      float x = 1, y = 0;
      AllreduceArgs args;
      args.in = &x;
      args.out = &y;
      args.count = 1;
      args.deadline = testDeadline();
      allreduceShared(arena, args);
    }
  });
}

TEST(SharedAlgorithms, MissingRankTimesOut) {
  auto store = test::newGroupStore();
  const auto start = Clock::now();
  auto errors = runRanksCollect(2, [&](int rank) {
    auto transport = connect(*store, rank, 2, kSmallSlot);
    if (rank == 1) {
      std::this_thread::sleep_for(Millis(600));  // never calls the collective
      return;
    }
    std::vector<float> in(5000, 1.0f), out(5000);
    AllreduceArgs args;
    args.in = in.data();
    args.out = out.data();
    args.count = in.size();
    args.deadline = deadlineAfter(Millis(300));
    allreduceShared(*transport->sharedArena(), args);
  });
  // The call's 300 ms deadline, not the transport's 20 s timeout, ended the wait: a bound with
  // room for a sanitizer build on busy cores.
  EXPECT_LT(secondsSince(start), 10.0);
  EXPECT_FALSE(errors[1]);
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << e.what() << " instead of TimeoutError";
  }
}

TEST(SharedAlgorithms, AbortWakesEveryRank) {
  const int n = 4;
  auto store = test::newGroupStore();
  auto errors = runRanksCollect(n, [&](int rank) {
    auto transport = connect(*store, rank, n, kSmallSlot);
    if (rank == 1) {
      std::this_thread::sleep_for(Millis(200));
      transport->abort("out of memory in the test");
      // Stay mapped until the others have seen it.
      std::this_thread::sleep_for(Millis(300));
      return;
    }
    std::vector<float> in(10000, 1.0f), out(10000);
    AllreduceArgs args;
    args.in = in.data();
    args.out = out.data();
    args.count = in.size();
    args.deadline = testDeadline();
    allreduceShared(*transport->sharedArena(), args);
  });
  // A rank that slept through the abort until its deadline would throw TimeoutError instead.
  for (int rank : {0, 2, 3}) {
    ASSERT_TRUE(errors[rank]) << "rank " << rank;
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const PeerAbortedError& e) {
      EXPECT_EQ(e.rank(), 1);
      EXPECT_NE(std::string(e.what()).find("out of memory in the test"), std::string::npos)
          << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << " threw " << e.what() << " instead of PeerAbortedError";
    }
  }
}

}  // namespace
}  // namespace hetra::comm
