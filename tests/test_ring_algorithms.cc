// Ring collectives over the tcp transport: every collective x world size x count x dtype (x reduce
// op), distinct values per rank and element, results checked on every rank. Groups of tcp
// transports are created once per world size and reused, since connecting 8 ranks costs more than
// the tests.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "comm/algorithms/ring.h"
#include "comm/transport/tcp_transport.h"
#include "common/errors.h"
#include "harness.h"
#include "store/store.h"

namespace hetra::comm {
namespace {

using test::distinctValue;
using test::runRanks;

constexpr int kWorldSizes[] = {1, 2, 3, 4, 5, 8};
// With 2 KiB segments (set below), 1000 float32 spans two segments and 5003 (odd) many.
constexpr size_t kCounts[] = {0, 1, 7, 1000, 5003};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max};

Deadline soon() {
  return deadlineAfter(Millis(20000));
}

// Rank `rank`'s element i in a group of n: exact in t, distinct per (rank, element), and sums over
// n ranks stay exact (harness.h), so every result below is compared exactly.
double inputValue(DType t, int n, int rank, size_t i) {
  return distinctValue(t, n, rank, i);
}

// The reduction of element i over n ranks (exact in t: see inputValue).
double expectedReduced(DType t, ReduceOp op, int n, size_t i) {
  return test::reduceOverRanks(op, n, [&](int r) { return inputValue(t, n, r, i); });
}

// Exact for every dtype: the test values and their sums are representable.
#define EXPECT_ELEMENTS(count, actualFn, expectedFn, what)                                         \
  do {                                                                                             \
    size_t bad = 0;                                                                                \
    for (size_t i_ = 0; i_ < (count); ++i_) {                                                      \
      const double got_ = (actualFn)(i_), want_ = (expectedFn)(i_);                                \
      if (got_ != want_ && !(std::isnan(got_) && std::isnan(want_))) {                             \
        if (bad++ == 0)                                                                            \
          ADD_FAILURE() << what << ": element " << i_ << " is " << got_ << ", expected " << want_; \
      }                                                                                            \
    }                                                                                              \
    if (bad > 1) ADD_FAILURE() << what << ": " << bad << " wrong elements in total";               \
  } while (0)

struct Group {
  std::vector<std::unique_ptr<Transport>> ranks;
  uint64_t seq = 0;
};

std::map<int, Group>& groups() {
  static std::map<int, Group> all;
  return all;
}

// Transports are torn down before exit, while gtest still runs, not by static destructors.
class GroupsEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { setenv("HETRA_RING_SEGMENT_BYTES", "2048", 1); }
  void TearDown() override { groups().clear(); }
};
const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new GroupsEnvironment);

Group& group(int n) {
  auto& all = groups();
  auto found = all.find(n);
  if (found != all.end()) return found->second;
  Group& g = all[n];
  g.ranks.resize(n);
  auto memory = std::make_shared<store::MemoryStore>();
  auto prefixed = std::make_shared<store::PrefixStore>(str("ring", n), memory);
  TcpOptions options;
  options.timeout = Millis(20000);
  runRanks(n, [&](int r) { g.ranks[r] = createTcpTransport(prefixed, r, n, options); });
  return g;
}

// Runs body(rank, transport, seq) on every rank of the shared group of n.
void onGroup(int n, const std::function<void(int, Transport&, uint64_t)>& body) {
  Group& g = group(n);
  const uint64_t seq = g.seq++;
  runRanks(n, [&](int r) { body(r, *g.ranks[r], seq); });
}

std::vector<size_t> unevenCounts(size_t count, int n) {
  std::vector<size_t> counts(n);
  for (int b = 0; b < n; ++b) counts[b] = (b % 3 == 1) ? 0 : count + size_t(b) * 3;
  return counts;
}

std::string caseName(const char* op, int n, size_t count, DType t) {
  return str(op, " n=", n, " count=", count, " ", dtypeName(t));
}

using AllreduceFn = void (*)(Transport&, const AllreduceArgs&);

void checkAllreduce(int n, size_t count, DType t, ReduceOp op, bool inPlace,
                    AllreduceFn allreduce = allreduceRing) {
  const size_t es = dtypeSize(t);
  onGroup(n, [&](int r, Transport& transport, uint64_t seq) {
    std::vector<uint8_t> in(count * es + 1), out(count * es + 1, 0xee);
    for (size_t i = 0; i < count; ++i) storeElement(t, in.data(), i, inputValue(t, n, r, i));
    AllreduceArgs args;
    args.in = in.data();
    args.out = inPlace ? in.data() : out.data();
    args.count = count;
    args.dtype = t;
    args.op = op;
    args.seq = seq;
    args.deadline = soon();
    allreduce(transport, args);
    const void* result = args.out;
    EXPECT_ELEMENTS(
        count, [&](size_t i) { return loadElement(t, result, i); },
        [&](size_t i) { return expectedReduced(t, op, n, i); },
        caseName("allreduce", n, count, t)
            << " " << reduceOpName(op) << (inPlace ? " in place" : "") << " rank " << r);
  });
}

void checkReduceScatter(int n, const std::vector<size_t>& counts, DType t, ReduceOp op) {
  const size_t es = dtypeSize(t);
  const size_t total = totalCount(counts);
  onGroup(n, [&](int r, Transport& transport, uint64_t seq) {
    std::vector<uint8_t> in(total * es + 1), out(counts[r] * es + 1, 0xee);
    for (size_t i = 0; i < total; ++i) storeElement(t, in.data(), i, inputValue(t, n, r, i));
    size_t offset = 0;
    for (int b = 0; b < r; ++b) offset += counts[b];
    ReduceScatterArgs args;
    args.in = in.data();
    args.out = out.data();
    args.counts = counts;
    args.dtype = t;
    args.op = op;
    args.seq = seq;
    args.deadline = soon();
    reduceScatterRing(transport, args);
    EXPECT_ELEMENTS(
        counts[r], [&](size_t i) { return loadElement(t, out.data(), i); },
        [&](size_t i) { return expectedReduced(t, op, n, offset + i); },
        caseName("reduce-scatter", n, total, t) << " " << reduceOpName(op) << " rank " << r);
    EXPECT_EQ(out[counts[r] * es], 0xee) << "reduce-scatter wrote past its block on rank " << r;
  });
}

void checkAllgather(int n, const std::vector<size_t>& counts, DType t, bool inPlace) {
  const size_t es = dtypeSize(t);
  const size_t total = totalCount(counts);
  std::vector<size_t> offsets(n, 0);
  for (int b = 1; b < n; ++b) offsets[b] = offsets[b - 1] + counts[b - 1];
  onGroup(n, [&](int r, Transport& transport, uint64_t seq) {
    std::vector<uint8_t> in(counts[r] * es + 1), out(total * es + 1, 0xee);
    void* mine = inPlace ? static_cast<void*>(out.data() + offsets[r] * es) : in.data();
    for (size_t i = 0; i < counts[r]; ++i) storeElement(t, mine, i, inputValue(t, n, r, i));
    AllgatherArgs args;
    args.in = mine;
    args.out = out.data();
    args.counts = counts;
    args.dtype = t;
    args.seq = seq;
    args.deadline = soon();
    allgatherRing(transport, args);
    for (int b = 0; b < n; ++b)
      EXPECT_ELEMENTS(
          counts[b], [&](size_t i) { return loadElement(t, out.data(), offsets[b] + i); },
          [&](size_t i) { return inputValue(t, n, b, i); },
          caseName("allgather", n, total, t)
              << " block " << b << (inPlace ? " in place" : "") << " rank " << r);
    EXPECT_EQ(out[total * es], 0xee) << "allgather wrote past the end on rank " << r;
  });
}

void checkBroadcast(int n, size_t count, DType t, int root) {
  const size_t es = dtypeSize(t);
  onGroup(n, [&](int r, Transport& transport, uint64_t seq) {
    std::vector<uint8_t> buf(count * es + 1, 0xee);
    // Other ranks start with the root's values shifted by one element: none is already right.
    for (size_t i = 0; i < count; ++i)
      storeElement(t, buf.data(), i, inputValue(t, n, root, r == root ? i : i + 1));
    BroadcastArgs args;
    args.buf = buf.data();
    args.count = count;
    args.dtype = t;
    args.root = root;
    args.seq = seq;
    args.deadline = soon();
    broadcastPipelined(transport, args);
    EXPECT_ELEMENTS(
        count, [&](size_t i) { return loadElement(t, buf.data(), i); },
        [&](size_t i) { return inputValue(t, n, root, i); },
        caseName("broadcast", n, count, t) << " root " << root << " rank " << r);
  });
}

class RingWorld : public ::testing::TestWithParam<int> {};

TEST_P(RingWorld, AllreduceEveryDtypeCountAndOp) {
  const int n = GetParam();
  // The ring and the direct exchange, for every count.
  for (AllreduceFn allreduce : {allreduceRing, allreduceDirect})
    for (DType t : kAllDTypes)
      for (size_t count : kCounts)
        for (ReduceOp op : kOps) {
          if (op != ReduceOp::Sum && count != 7 && count != 5003) continue;
          checkAllreduce(n, count, t, op, /*inPlace=*/(count + int(op)) % 2 == 0, allreduce);
        }
  // Larger buffers, in place and not.
  checkAllreduce(n, 20000, DType::F32, ReduceOp::Sum, true);
  checkAllreduce(n, 20001, DType::F64, ReduceOp::Max, false, allreduceDirect);
}

TEST_P(RingWorld, AvgIsReducedAsSum) {
  const int n = GetParam();
  checkAllreduce(n, 7, DType::F32, ReduceOp::Sum, false);
  onGroup(n, [&](int r, Transport& transport, uint64_t seq) {
    std::vector<float> data(9);
    for (size_t i = 0; i < data.size(); ++i) data[i] = float(inputValue(DType::F32, n, r, i));
    AllreduceArgs args;
    args.in = args.out = data.data();
    args.count = data.size();
    args.op = ReduceOp::Avg;
    args.seq = seq;
    args.deadline = soon();
    allreduceRing(transport, args);
    for (size_t i = 0; i < data.size(); ++i)
      EXPECT_EQ(data[i], expectedReduced(DType::F32, ReduceOp::Sum, n, i));
  });
}

TEST_P(RingWorld, ReduceScatterEvenAndUneven) {
  const int n = GetParam();
  for (DType t : kAllDTypes)
    for (size_t count : kCounts)
      for (ReduceOp op : kOps) {
        if (op != ReduceOp::Sum && count != 7 && count != 1000) continue;
        checkReduceScatter(n, std::vector<size_t>(n, count), t, op);
        checkReduceScatter(n, unevenCounts(count, n), t, op);
      }
}

TEST_P(RingWorld, AllgatherEvenAndUnevenInPlaceAndNot) {
  const int n = GetParam();
  for (DType t : kAllDTypes)
    for (size_t count : kCounts) {
      checkAllgather(n, std::vector<size_t>(n, count), t, count % 2 == 0);
      checkAllgather(n, unevenCounts(count, n), t, count % 2 == 1);
    }
}

TEST_P(RingWorld, BroadcastFromAnyRoot) {
  const int n = GetParam();
  for (DType t : kAllDTypes)
    for (size_t count : kCounts)
      for (int root : {0, n - 1, n / 2}) checkBroadcast(n, count, t, root);
}

TEST_P(RingWorld, BarrierWaitsForEveryRank) {
  const int n = GetParam();
  for (int round = 0; round < 5; ++round) {
    std::atomic<int> arrived{0};
    onGroup(n, [&](int r, Transport& transport, uint64_t seq) {
      // Late ranks make a barrier that lets anyone through early fail the check.
      if (r == (round % n)) std::this_thread::sleep_for(Millis(20));
      arrived.fetch_add(1);
      BarrierArgs args;
      args.seq = seq;
      args.deadline = soon();
      barrierDissemination(transport, args);
      EXPECT_EQ(arrived.load(), n) << "rank " << r << " left barrier round " << round << " early";
    });
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RingWorld, ::testing::ValuesIn(kWorldSizes));

// --- mismatched calls: a fresh group each time, since a mismatch fails the group ---

std::vector<std::unique_ptr<Transport>> freshGroup(int n, const std::string& name) {
  auto memory = std::make_shared<store::MemoryStore>();
  auto prefixed = std::make_shared<store::PrefixStore>(name, memory);
  std::vector<std::unique_ptr<Transport>> ranks(n);
  TcpOptions options;
  options.timeout = Millis(20000);
  runRanks(n, [&](int r) { ranks[r] = createTcpTransport(prefixed, r, n, options); });
  return ranks;
}

// Every rank must fail with the mismatch that `reasonText` describes (harness.h); a rank that
// waited for its 30 s deadline instead would throw TimeoutError.
void expectEveryRankFailsWithReason(int n, const std::function<void(int, Transport&)>& call,
                                    const char* reasonText) {
  auto ranks = freshGroup(n, str("mismatch-", reasonText, n));
  auto errors = test::runRanksCollect(n, [&](int r) { call(r, *ranks[r]); });
  test::expectMismatchOnEveryRank(errors, reasonText);
}

TEST(RingMismatch, CountsDifferOnOneRank) {
  for (int n : {2, 5}) {
    expectEveryRankFailsWithReason(
        n,
        [&](int r, Transport& transport) {
          std::vector<float> data(2000, 1.0f);
          AllreduceArgs args;
          args.in = args.out = data.data();
          args.count = r == n / 2 ? 1999 : 2000;  // one rank disagrees
          args.seq = 0;
          args.deadline = deadlineAfter(Millis(30000));
          allreduceRing(transport, args);
        },
        "mismatched collective");
  }
}

TEST(RingMismatch, UnevenCountsAndRootsDiffer) {
  expectEveryRankFailsWithReason(
      4,
      [&](int r, Transport& transport) {
        std::vector<size_t> counts{5, 0, 7, 3};
        if (r == 3) counts = {5, 1, 6, 3};  // same total, different split
        std::vector<int32_t> in(15, r), out(counts[r]);
        ReduceScatterArgs args;
        args.in = in.data();
        args.out = out.data();
        args.counts = counts;
        args.dtype = DType::I32;
        args.deadline = deadlineAfter(Millis(30000));
        reduceScatterRing(transport, args);
      },
      "mismatched collective");
  expectEveryRankFailsWithReason(
      5,
      [&](int r, Transport& transport) {
        std::vector<float> data(100, 1.0f);
        BroadcastArgs args;
        args.buf = data.data();
        args.count = data.size();
        args.root = r == 0 ? 1 : 0;
        args.deadline = deadlineAfter(Millis(30000));
        broadcastPipelined(transport, args);
      },
      "mismatched collective");
}

}  // namespace
}  // namespace hetra::comm
