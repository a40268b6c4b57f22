// The hierarchical allreduce against the exact result for every dtype and reduce op, for even and
// uneven island layouts (islands given explicitly, as on one machine every rank shares a host),
// with compression on the level between islands, and the cost model's choice.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "comm/communicator.h"
#include "comm/hierarchy.h"
#include "comm/transport/transport.h"
#include "common/errors.h"
#include "harness.h"

namespace hetra::comm {
namespace {

using test::distinctValue;
using test::runRanks;

GroupOptions hierarchical(std::vector<int> islands) {
  GroupOptions o;
  o.timeout = Millis(20000);
  o.algorithm = "hierarchical";
  o.islands = std::move(islands);
  return o;
}

// Inputs exact in their dtype, distinct per (rank, element), with exact sums over n ranks.
double expected(ReduceOp op, DType dtype, int n, size_t i) {
  double acc = test::reduceOverRanks(op, n, [&](int r) { return distinctValue(dtype, n, r, i); });
  if (op == ReduceOp::Avg) acc = isFloating(dtype) ? acc / n : std::trunc(acc / n);
  return acc;
}

class HierarchyLayouts : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(HierarchyLayouts, EqualsTheExactResultForEveryDtypeAndOp) {
  const std::vector<int> islands = GetParam();
  const int n = int(islands.size());
  auto store = std::make_shared<store::MemoryStore>();
  runRanks(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, hierarchical(islands));
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max}) {
        if (op == ReduceOp::Avg && !isFloating(dtype)) continue;
        for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(70001)}) {
          const size_t es = dtypeSize(dtype);
          std::vector<uint8_t> in(std::max<size_t>(1, count) * es), out(in.size());
          for (size_t i = 0; i < count; ++i)
            storeElement(dtype, in.data(), i, distinctValue(dtype, n, r, i));
          const uint64_t worldBytes = comm->transport().bytesSent();
          comm->allreduce(in.data(), out.data(), count, dtype, op)->wait();
          // Every byte went through the island and cross groups, none through the flat group.
          ASSERT_EQ(comm->transport().bytesSent(), worldBytes);
          for (size_t i = 0; i < count; ++i) {
            const double want = expected(op, dtype, n, i);
            const double got = loadElement(dtype, out.data(), i);
            // Exact but for avg, which rounds its quotient to the dtype.
            const double tolerance = op != ReduceOp::Avg                           ? 0.0
                                     : dtype == DType::F16 || dtype == DType::BF16 ? 0.01
                                                                                   : 1e-6;
            ASSERT_NEAR(got, want, tolerance * std::max(1.0, std::fabs(want)))
                << dtypeName(dtype) << " " << reduceOpName(op) << " count " << count << " element "
                << i << " rank " << r;
          }
        }
      }
    }
    // In place too.
    std::vector<float> buffer(5003);
    for (size_t i = 0; i < buffer.size(); ++i)
      buffer[i] = float(distinctValue(DType::F32, n, r, i));
    comm->allreduce(buffer.data(), buffer.data(), buffer.size(), DType::F32, ReduceOp::Sum)->wait();
    for (size_t i = 0; i < buffer.size(); ++i)
      ASSERT_EQ(buffer[i], float(expected(ReduceOp::Sum, DType::F32, n, i))) << i;
  });
}

// Islands of 2+2, 3+2 (remainder), 1+3+1, 4+1 and three of sizes 2, 1, 2 in interleaved ranks.
INSTANTIATE_TEST_SUITE_P(Islands, HierarchyLayouts,
                         ::testing::Values(std::vector<int>{0, 0, 1, 1},
                                           std::vector<int>{0, 0, 0, 1, 1},
                                           std::vector<int>{0, 1, 1, 1, 2},
                                           std::vector<int>{0, 0, 0, 0, 1},
                                           std::vector<int>{5, 9, 5, 7, 9}));

TEST(Hierarchy, CompressesOnlyTheLevelBetweenIslands) {
  const std::vector<int> islands = {0, 0, 1, 1, 1};
  const int n = 5;
  const size_t count = 100003;
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<std::vector<float>> results(n);
  runRanks(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, hierarchical(islands));
    OpPolicy policy;
    policy.compression = CompressionPolicy(Compression::BF16, 256, 0);
    // No error feedback: the codec sits on the cross level, not on this group's wire.
    EXPECT_EQ(comm->feedbackCodec(OpKind::Allreduce, DType::F32, ReduceOp::Sum, count, policy),
              nullptr);
    std::vector<float> buffer(count);
    for (size_t i = 0; i < count; ++i) buffer[i] = 1.0f + float(r) / 3.0f + float(i % 101) / 7.0f;
    comm->allreduce(buffer.data(), buffer.data(), count, DType::F32, ReduceOp::Sum, policy)->wait();
    results[r] = buffer;
  });
  double worst = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    for (int r = 0; r < n; ++r) exact += 1.0 + r / 3.0 + double(float(i % 101) / 7.0f);
    worst = std::max(worst, std::fabs(results[0][i] - exact) / exact);
  }
  // bf16 rounds once per island sum and once per result: at most ~2 units of 2^-8, and not exact.
  EXPECT_LE(worst, 3 * std::ldexp(1.0, -8));
  EXPECT_GT(worst, 1e-6) << "the cross level was not compressed";
  for (int r = 1; r < n; ++r)
    ASSERT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * sizeof(float)))
        << "rank " << r;
}

// The cost model against times worked out by hand from what each link carries (not from the
// model's formula): 4 ranks in 2 islands of 2, B bytes, links given as latency and bandwidth.
// Flat ring: a header round and 2 (n-1) = 6 steps, each rank sends 2 (n-1)/n B = 1.5 B, all over
// the slowest (cross) link. Hierarchy: inside, reduce-scatter + allgather over 2 ranks: 2 steps,
// B/2 + B/2 = B per rank; across, each rank allreduces its half with its partner: 2 steps, B/4 +
// B/4 per rank, so each island's link carries B.
TEST(Hierarchy, CostModelPrefersItOverSlowLinksUnlessIslandsAreSlowToo) {
  const int n = 4;
  const double B = double(size_t(64) << 20);
  struct Case {
    const char* islandLink;
    const char* crossLink;
    double flatSeconds, hierarchicalSeconds;
  };
  const Case cases[] = {
      // Fast islands (8 GB/s, 1 us) and a slow cross link (1 GB/s, 50 us).
      {"1us,8GB/s", "50us,1GB/s", 7 * 50e-6 + 1.5 * B / 1e9,
       2 * 1e-6 + B / 8e9 + 2 * 50e-6 + B / 1e9},
      // Islands as slow as the cross link: the hierarchy moves more bytes, so flat wins.
      {"50us,1GB/s", "50us,1GB/s", 7 * 50e-6 + 1.5 * B / 1e9,
       2 * 50e-6 + B / 1e9 + 2 * 50e-6 + B / 1e9},
  };
  for (const Case& c : cases) {
    auto store = std::make_shared<store::MemoryStore>();
    runRanks(n, [&](int r) {
      // The hierarchy's own model, built directly.
      GroupOptions flat;
      flat.algorithm = "ring";
      auto world = Communicator::create(store, r, n, flat);
      Hierarchy hierarchy(*world, {0, 0, 1, 1}, flat, flat, parseLinkCost(c.islandLink),
                          parseLinkCost(c.crossLink));
      EXPECT_EQ(hierarchy.islands(), 2);
      EXPECT_EQ(hierarchy.largestIsland(), 2);
      EXPECT_NEAR(hierarchy.seconds(OpKind::Allreduce, size_t(B), 1.0), c.hierarchicalSeconds,
                  1e-12 * c.hierarchicalSeconds)
          << c.islandLink << " / " << c.crossLink;
      // The table's choice over tcp (no shared memory) between the flat ring and the hierarchy.
      GroupOptions islands;
      islands.transport = "tcp";
      islands.islands = {0, 0, 1, 1};
      islands.islandLink = c.islandLink;
      islands.crossLink = c.crossLink;
      auto comm = world->split(0, r, islands);
      EXPECT_EQ(comm->providerFor(OpKind::Allreduce, DType::F32, ReduceOp::Sum, size_t(B) / 4),
                c.hierarchicalSeconds < c.flatSeconds ? "hierarchical" : "ring")
          << c.islandLink << " / " << c.crossLink;
    });
  }
}

TEST(LinkCost, ParsesUnitsAndRefusesNonsense) {
  const LinkCost a = parseLinkCost("5us,5GB/s");
  EXPECT_DOUBLE_EQ(a.latencySeconds, 5e-6);
  EXPECT_DOUBLE_EQ(a.bytesPerSecond, 5e9);
  const LinkCost b = parseLinkCost("0.1ms,1gbit");
  EXPECT_DOUBLE_EQ(b.latencySeconds, 1e-4);
  EXPECT_DOUBLE_EQ(b.bytesPerSecond, 125e6);
  EXPECT_THROW(parseLinkCost("5us"), ConfigError);
  EXPECT_THROW(parseLinkCost("5 parsecs,1gbit"), ConfigError);
  EXPECT_THROW(parseLinkCost("5us,0gbit"), ConfigError);
}

}  // namespace
}  // namespace hetra::comm
