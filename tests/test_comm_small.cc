// The small-message collectives on real ranks, one thread per rank with its own transport: the
// small-slot collectives (algorithms/small_shared.cc) over shm and recursive doubling
// (algorithms/small_tcp.cc) over tcp and shm, over world sizes x dtypes x ops x counts up to each
// one's capacity, with values distinct per (rank, element); plus mismatched calls (also across
// paths), aborts and deadlines.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/algorithms/shared.h"
#include "comm/algorithms/small_shared.h"
#include "comm/algorithms/small_tcp.h"
#include "comm/transport/shm_transport.h"
#include "comm/transport/tcp_transport.h"
#include "common/errors.h"
#include "harness.h"
#include "shm_testing.h"

namespace hetra::comm {
namespace {

using test::runRanks;
using test::runRanksCollect;

const std::vector<int> kWorldSizes = {1, 2, 3, 4, 5, 7};

enum class Link { Shm, Tcp };
const char* linkName(Link link) {
  return link == Link::Shm ? "shm" : "tcp";
}

std::unique_ptr<Transport> connect(Link link, const std::shared_ptr<store::Store>& store, int rank,
                                   int size) {
  if (link == Link::Tcp) {
    TcpOptions options;
    options.timeout = Millis(20000);
    return createTcpTransport(store, rank, size, options);
  }
  ShmOptions options;
  options.timeout = Millis(20000);
  options.slotBytes = 8192;
  return createShmTransport(*store, rank, size, options);
}

Deadline testDeadline() {
  return deadlineAfter(Millis(20000));
}

// Values exact in `dtype` whose sums over `ranks` ranks stay exact (and, for u8, do not wrap):
// value = code - offset with code = (rank * window + index) mod period, so that no two
// (rank, element) pairs among `window` consecutive elements share a value.
double valueOf(DType dtype, int ranks, int rank, size_t index) {
  const int64_t exact = dtype == DType::F16    ? 2048
                        : dtype == DType::BF16 ? 256
                        : dtype == DType::U8   ? 255
                                               : int64_t(1) << 24;
  const int64_t bound = exact / ranks;
  const int64_t period = dtype == DType::U8 ? bound + 1 : 2 * bound + 1;
  const int64_t window = std::max<int64_t>(1, period / ranks);
  const int64_t code = (rank * window + int64_t(index % size_t(period))) % period;
  return double(code - (dtype == DType::U8 ? 0 : bound));
}

// `value` as `dtype` holds it.
double stored(DType dtype, double value) {
  uint64_t storage = 0;
  storeElement(dtype, &storage, 0, value);
  return loadElement(dtype, &storage, 0);
}

// op over every rank's value in double, then rounded to `dtype` as a result would be.
double reference(DType dtype, ReduceOp op, int ranks, size_t index) {
  double acc = valueOf(dtype, ranks, 0, index);
  for (int r = 1; r < ranks; ++r) {
    const double v = valueOf(dtype, ranks, r, index);
    acc = op == ReduceOp::Min ? std::min(acc, v) : op == ReduceOp::Max ? std::max(acc, v) : acc + v;
  }
  return stored(dtype, acc);
}

std::vector<uint8_t> filled(DType dtype, size_t count, int ranks, int rank) {
  std::vector<uint8_t> buffer(std::max<size_t>(count, 1) * dtypeSize(dtype), 0xEE);
  for (size_t i = 0; i < count; ++i)
    storeElement(dtype, buffer.data(), i, valueOf(dtype, ranks, rank, i));
  return buffer;
}

// Counts that matter for a dtype: none, one, an odd one, the largest that `capacity` bytes hold,
// and either side of `boundary` bytes (where an algorithm changes its message size) if given.
std::vector<size_t> countsFor(DType dtype, size_t capacity = smallSharedCapacity(),
                              size_t boundary = 0) {
  std::vector<size_t> counts = {0, 1, 37, capacity / dtypeSize(dtype)};
  if (boundary > 0) {
    counts.push_back(boundary / dtypeSize(dtype));
    counts.push_back(boundary / dtypeSize(dtype) + 1);
  }
  return counts;
}

// A rank's first wrong elements: collected rather than thrown, so that the ranks stay in step, and
// reported together once the rank's sweep is done.
struct Failures {
  std::string text;
  int count = 0;
  void expect(bool ok, const std::function<std::string()>& what) {
    if (!ok && ++count <= 5) text += "\n  " + what();
  }
};

void runGroupOn(Link link, int n, const std::function<void(int, Transport&, Failures&)>& body) {
  auto store = test::newGroupStore();
  runRanks(n, [&](int rank) {
    auto transport = connect(link, store, rank, n);
    Failures failures;
    body(rank, *transport, failures);
    if (failures.count > 0)
      throw std::runtime_error(str(failures.count, " wrong elements:", failures.text));
  });
}

void runGroup(int n, const std::function<void(int, SharedArena&, Failures&)>& body) {
  runGroupOn(Link::Shm, n, [&](int rank, Transport& transport, Failures& failures) {
    body(rank, *transport.sharedArena(), failures);
  });
}

// Every dtype and op, counts up to `capacity` bytes (and either side of `boundary`), in place and
// not, through `allreduce`.
void sweepAllreduce(int n, int rank, size_t capacity, Failures& failures,
                    const std::function<void(const AllreduceArgs&)>& allreduce,
                    size_t boundary = 0) {
  uint64_t seq = 0;
  for (DType dtype : kAllDTypes)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg})
      for (size_t count : countsFor(dtype, capacity, boundary)) {
        auto in = filled(dtype, count, n, rank);
        auto out = std::vector<uint8_t>(in.size(), 0xEE);
        const bool inPlace = seq % 2 == 1;
        const AllreduceArgs args{.in = in.data(),
                                 .out = inPlace ? in.data() : out.data(),
                                 .count = count,
                                 .dtype = dtype,
                                 .op = op,
                                 .seq = seq++,
                                 .deadline = testDeadline()};
        allreduce(args);
        // Avg is reduced as Sum: the caller divides.
        const ReduceOp reduced = op == ReduceOp::Avg ? ReduceOp::Sum : op;
        for (size_t i = 0; i < count; ++i) {
          const double got = loadElement(dtype, args.out, i);
          const double want = reference(dtype, reduced, n, i);
          failures.expect(got == want, [&] {
            return str(dtypeName(dtype), " ", reduceOpName(op), " count ", count, " [", i,
                       "]: got ", got, ", want ", want);
          });
        }
      }
}

TEST(SmallShared, AllreduceEveryDtypeOpAndCount) {
  for (int n : kWorldSizes) {
    runGroup(n, [n](int rank, SharedArena& arena, Failures& failures) {
      ASSERT_TRUE(smallSharedFits(arena, smallSharedCapacity()));
      EXPECT_FALSE(smallSharedFits(arena, smallSharedCapacity() + 1));
      sweepAllreduce(n, rank, smallSharedCapacity(), failures,
                     [&](const AllreduceArgs& args) { allreduceSmallShared(arena, args); });
    });
  }
}

// The payload of recursive doubling's smallest envelope (small_tcp.cc): counts either side of it
// travel in envelopes of different sizes.
constexpr size_t kFirstEnvelopeClass = 1024;

TEST(RecursiveDoubling, AllreduceEveryDtypeOpAndCount) {
  for (Link link : {Link::Tcp, Link::Shm})
    for (int n : kWorldSizes) {
      SCOPED_TRACE(str(linkName(link), ", ", n, " ranks"));
      runGroupOn(link, n, [n](int rank, Transport& transport, Failures& failures) {
        sweepAllreduce(
            n, rank, recursiveDoublingCapacity(), failures,
            [&](const AllreduceArgs& args) { allreduceRecursiveDoubling(transport, args); },
            kFirstEnvelopeClass);
      });
    }
}

TEST(SmallShared, AllgatherUnevenBlocks) {
  for (int n : kWorldSizes) {
    runGroup(n, [n](int rank, SharedArena& arena, Failures& failures) {
      for (DType dtype : kAllDTypes) {
        // Blocks of 0, 1, odd and the largest counts, rotating over the ranks.
        const auto choices = countsFor(dtype);
        std::vector<size_t> counts(n);
        for (int k = 0; k < n; ++k) counts[k] = choices[size_t(k) % choices.size()];
        size_t total = 0;
        for (size_t c : counts) total += c;
        auto mine = filled(dtype, counts[rank], n, rank);
        std::vector<uint8_t> out(std::max<size_t>(total, 1) * dtypeSize(dtype), 0xEE);
        const AllgatherArgs args{.in = mine.data(),
                                 .out = out.data(),
                                 .counts = counts,
                                 .dtype = dtype,
                                 .deadline = testDeadline()};
        ASSERT_TRUE(smallSharedFits(arena, choices.back() * dtypeSize(dtype)));
        allgatherSmallShared(arena, args);
        size_t at = 0;
        for (int k = 0; k < n; ++k)
          for (size_t i = 0; i < counts[k]; ++i, ++at) {
            const double want = stored(dtype, valueOf(dtype, n, k, i));
            const double got = loadElement(dtype, out.data(), at);
            failures.expect(got == want, [&] {
              return str(dtypeName(dtype), " block ", k, " [", i, "]: got ", got, ", want ", want);
            });
          }
      }
    });
  }
}

TEST(SmallShared, BroadcastEveryRoot) {
  for (int n : kWorldSizes) {
    runGroup(n, [n](int rank, SharedArena& arena, Failures& failures) {
      for (int root = 0; root < n; ++root)
        for (DType dtype : {DType::F32, DType::F16, DType::I64, DType::U8})
          for (size_t count : countsFor(dtype)) {
            auto buf = filled(dtype, count, n, rank);
            const BroadcastArgs args{.buf = buf.data(),
                                     .count = count,
                                     .dtype = dtype,
                                     .root = root,
                                     .deadline = testDeadline()};
            broadcastSmallShared(arena, args);
            for (size_t i = 0; i < count; ++i) {
              const double want = stored(dtype, valueOf(dtype, n, root, i));
              const double got = loadElement(dtype, buf.data(), i);
              failures.expect(got == want, [&] {
                return str("root ", root, " ", dtypeName(dtype), " count ", count, " [", i,
                           "]: got ", got, ", want ", want);
              });
            }
          }
    });
  }
}

TEST(SmallShared, BarrierOrdersRanks) {
  for (int n : kWorldSizes) {
    std::atomic<int> arrived{0};
    runGroup(n, [&](int, SharedArena& arena, Failures& failures) {
      for (int round = 1; round <= 20; ++round) {
        arrived.fetch_add(1);
        BarrierArgs args;
        args.seq = uint64_t(round);
        args.deadline = testDeadline();
        barrierSmallShared(arena, args);
        // Every rank added its arrival for this round before any rank left the barrier.
        const int seen = arrived.load();
        failures.expect(seen >= round * n, [&] {
          return str("round ", round, ": left the barrier after ", seen, " arrivals");
        });
        barrierSmallShared(arena, args);  // nobody arrives at round + 1 before all checked
      }
    });
  }
}

// Runs call(rank, arena, transport) on n ranks and returns what each rank threw.
std::vector<std::exception_ptr> runFailing(
    int n, const std::function<void(int, SharedArena&, Transport&)>& call) {
  auto store = test::newGroupStore();
  return runRanksCollect(n, [&](int rank) {
    auto transport = connect(Link::Shm, store, rank, n);
    call(rank, *transport->sharedArena(), *transport);
  });
}

std::vector<std::exception_ptr> runFailingOnTcp(int n,
                                                const std::function<void(int, Transport&)>& call) {
  auto store = test::newGroupStore();
  return runRanksCollect(n, [&](int rank) {
    auto transport = connect(Link::Tcp, store, rank, n);
    call(rank, *transport);
  });
}

std::vector<int> everyRank(int n) {
  std::vector<int> ranks(n);
  for (int r = 0; r < n; ++r) ranks[r] = r;
  return ranks;
}

// Expects each of `ranks` to have thrown exactly an E whose message contains `needle`.
template <typename E>
void expectThrown(const std::vector<std::exception_ptr>& errors, const std::vector<int>& ranks,
                  const std::string& needle) {
  for (int rank : ranks) {
    bool typed = false;
    std::string message = "nothing";
    if (errors[rank]) {
      try {
        std::rethrow_exception(errors[rank]);
      } catch (const E& e) {
        typed = true;
        message = e.what();
      } catch (const std::exception& e) {
        message = str("another type: ", e.what());
      }
    }
    EXPECT_TRUE(typed && message.find(needle) != std::string::npos)
        << "rank " << rank << " threw " << message;
  }
}

// A float32 sum allreduce of `count` elements in place on `buf`.
AllreduceArgs inPlaceArgs(std::vector<float>& buf, size_t count, Deadline deadline) {
  buf.assign(std::max<size_t>(count, 1), 1.0f);
  AllreduceArgs args;
  args.in = args.out = buf.data();
  args.count = count;
  args.deadline = deadline;
  return args;
}

// An allreduce of 16 elements whose arguments `vary(rank, args)` changes on some ranks, run by
// `allreduce`; every rank must throw MismatchError.
using AllreduceOn = std::function<void(Transport&, const AllreduceArgs&)>;
void expectMismatchedAllreduce(Link link, int n, const AllreduceOn& allreduce,
                               const std::function<void(int, AllreduceArgs&)>& vary) {
  auto store = test::newGroupStore();
  auto errors = runRanksCollect(n, [&](int rank) {
    auto transport = connect(link, store, rank, n);
    std::vector<float> buf;
    AllreduceArgs args = inPlaceArgs(buf, 16, testDeadline());
    vary(rank, args);
    buf.resize(args.count * dtypeSize(args.dtype) / sizeof(float) + 1);
    args.in = args.out = buf.data();
    allreduce(*transport, args);
  });
  expectThrown<MismatchError>(errors, everyRank(n), "mismatched collective");
}

// Count, dtype, op and seq each differing on one rank, on group sizes with and without folding.
void expectEveryMismatchCaught(Link link, const AllreduceOn& allreduce) {
  expectMismatchedAllreduce(link, 3, allreduce,
                            [](int rank, AllreduceArgs& a) { a.count = rank == 2 ? 17 : 16; });
  expectMismatchedAllreduce(link, 4, allreduce, [](int rank, AllreduceArgs& a) {
    a.dtype = rank == 0 ? DType::F64 : DType::F32;
  });
  expectMismatchedAllreduce(link, 5, allreduce, [](int rank, AllreduceArgs& a) {
    a.op = rank == 4 ? ReduceOp::Max : ReduceOp::Sum;
  });
  expectMismatchedAllreduce(link, 2, allreduce,
                            [](int rank, AllreduceArgs& a) { a.seq = rank == 1 ? 1 : 0; });
}

TEST(SmallShared, MismatchedCallsFailOnEveryRank) {
  expectEveryMismatchCaught(Link::Shm, [](Transport& transport, const AllreduceArgs& args) {
    allreduceSmallShared(*transport.sharedArena(), args);
  });
}

TEST(RecursiveDoubling, MismatchedCallsFailOnEveryRank) {
  for (Link link : {Link::Tcp, Link::Shm}) {
    SCOPED_TRACE(linkName(link));
    expectEveryMismatchCaught(link, allreduceRecursiveDoubling);
  }
}

TEST(RecursiveDoubling, CallsInDifferentEnvelopeClassesFailOnEveryRank) {
  // Rank 2's call needs the larger envelope: its message to rank 0 (which folds it in) has another
  // size than rank 0's receive, which the transport refuses. Rank 0 aborts the group with that, as
  // the communicator does with a failed operation, so nobody hangs and nobody gets a result.
  for (Link link : {Link::Tcp, Link::Shm}) {
    SCOPED_TRACE(linkName(link));
    auto store = test::newGroupStore();
    auto errors = runRanksCollect(3, [&](int rank) {
      auto transport = connect(link, store, rank, 3);
      std::vector<float> buf;
      const size_t count = rank == 2 ? kFirstEnvelopeClass / sizeof(float) + 1 : 16;
      try {
        allreduceRecursiveDoubling(*transport, inPlaceArgs(buf, count, testDeadline()));
      } catch (const MismatchError& e) {
        transport->abort(e.what());
        throw;
      }
    });
    expectThrown<MismatchError>(errors, {0}, "posted a receive of");
    expectThrown<PeerAbortedError>(errors, {1, 2}, "posted a receive of");
  }
}

TEST(SmallShared, BarrierAgainstAllreduceFailsOnEveryRank) {
  auto errors = runFailing(3, [](int rank, SharedArena& arena, Transport&) {
    BarrierArgs barrier;
    barrier.deadline = testDeadline();
    std::vector<float> buf;
    if (rank == 1)
      barrierSmallShared(arena, barrier);
    else
      allreduceSmallShared(arena, inPlaceArgs(buf, 1, barrier.deadline));
  });
  expectThrown<MismatchError>(errors, everyRank(3), "mismatched collective");
}

TEST(SmallShared, SizeMismatchAcrossPathsFailsOnEveryRank) {
  // Rank 1's count is too large for the small slots, so it takes the pipelined algorithm.
  auto errors = runFailing(3, [](int rank, SharedArena& arena, Transport&) {
    std::vector<float> buf;
    const AllreduceArgs args = inPlaceArgs(buf, rank == 1 ? 100000 : 10, testDeadline());
    if (smallSharedFits(arena, args.count * sizeof(float)))
      allreduceSmallShared(arena, args);
    else
      allreduceShared(arena, args);
  });
  expectThrown<MismatchError>(errors, everyRank(3), "mismatched collective");
}

TEST(SmallShared, MismatchBetweenSmallCallsStillReleasesAPeerOnThePipelinedPath) {
  // Ranks 0 and 1 meet on the small path with different counts and throw there; rank 2 took the
  // pipelined algorithm and waits for their steps: it must get the mismatch too, not a timeout.
  auto errors = runFailing(3, [](int rank, SharedArena& arena, Transport&) {
    std::vector<float> buf;
    const size_t count = rank == 2 ? 100000 : size_t(10 + rank);
    const AllreduceArgs args = inPlaceArgs(buf, count, testDeadline());
    if (smallSharedFits(arena, args.count * sizeof(float)))
      allreduceSmallShared(arena, args);
    else
      allreduceShared(arena, args);
  });
  expectThrown<MismatchError>(errors, everyRank(3), "mismatched collective");
}

// Rank 1 never calls the collective: rank 0 must time out naming it.
void expectMissingRankTimesOut(Link link, const AllreduceOn& allreduce) {
  auto store = test::newGroupStore();
  auto errors = runRanksCollect(2, [&](int rank) {
    auto transport = connect(link, store, rank, 2);
    std::vector<float> buf;
    if (rank == 1)
      std::this_thread::sleep_for(Millis(600));
    else
      allreduce(*transport, inPlaceArgs(buf, 1, deadlineAfter(Millis(300))));
  });
  EXPECT_FALSE(errors[1]);
  expectThrown<TimeoutError>(errors, {0}, "rank 1");
}

TEST(SmallShared, MissingRankTimesOut) {
  expectMissingRankTimesOut(Link::Shm, [](Transport& transport, const AllreduceArgs& args) {
    allreduceSmallShared(*transport.sharedArena(), args);
  });
}

TEST(RecursiveDoubling, MissingRankTimesOut) {
  expectMissingRankTimesOut(Link::Tcp, allreduceRecursiveDoubling);
}

TEST(RecursiveDoubling, AbortWakesEveryRank) {
  auto errors = runFailingOnTcp(4, [](int rank, Transport& transport) {
    std::vector<float> buf;
    if (rank == 1) {
      std::this_thread::sleep_for(Millis(200));
      transport.abort("out of memory in the test");
      return;
    }
    allreduceRecursiveDoubling(transport, inPlaceArgs(buf, 3, testDeadline()));
  });
  expectThrown<PeerAbortedError>(errors, {0, 2, 3}, "out of memory in the test");
}

TEST(SmallShared, AbortWakesEveryRank) {
  auto errors = runFailing(4, [](int rank, SharedArena& arena, Transport& transport) {
    if (rank == 1) {
      std::this_thread::sleep_for(Millis(200));
      transport.abort("out of memory in the test");
      std::this_thread::sleep_for(Millis(300));  // stay mapped until the others have seen it
      return;
    }
    BarrierArgs args;
    args.deadline = testDeadline();
    barrierSmallShared(arena, args);
  });
  expectThrown<PeerAbortedError>(errors, {0, 2, 3}, "out of memory in the test");
}

}  // namespace
}  // namespace hetra::comm
