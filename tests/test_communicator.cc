// The communicator over both transports: transport choice, asynchronous ordered operations,
// average, split into sub-groups, point-to-point, and error latching.
#include <gtest/gtest.h>

#include <numeric>

#include "comm/communicator.h"
#include "comm/transport/transport.h"
#include "common/errors.h"
#include "harness.h"

namespace hetra::comm {
namespace {

using test::runRanks;

GroupOptions optionsFor(const std::string& transport) {
  GroupOptions o;
  o.transport = transport;
  o.timeout = Millis(10000);
  return o;
}

class CommunicatorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CommunicatorTest, ThreadsOfOneProcessGetTheRequestedTransport) {
  auto store = std::make_shared<store::MemoryStore>();
  const std::string transport = GetParam();
  runRanks(3, [&](int rank) {
    auto comm = Communicator::create(store, rank, 3, optionsFor(transport));
    EXPECT_EQ(comm->size(), 3);
    EXPECT_EQ(comm->rank(), rank);
    // auto picks shm: every thread is on this host.
    EXPECT_STREQ(comm->transportName(), transport == "tcp" ? "tcp" : "shm");
  });
}

// Operation k reads operation k-1's output buffer, all issued before any is waited on: only
// running them in issue order gives the checked values (an operation run early reads its input
// buffer's initial contents, which differ per rank). Then the last one is waited on first: every
// earlier one must have completed by then.
TEST_P(CommunicatorTest, ManyOperationsInFlightCompleteInOrder) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kSize = 3;
  const size_t count = 1000 + 3;
  // Once op 0 has summed the ranks' inputs, every rank holds the same S and the others act on it:
  // avg and min and max keep it, sum triples it.
  const std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max,
                                     ReduceOp::Sum, ReduceOp::Min, ReduceOp::Avg};
  const std::vector<double> timesS = {1, 1, 1, 3, 3, 3};
  // Bounded so that op 5's sum before its division, 9 S (27 inputs), stays exact in float32.
  const test::DistinctValues values(DType::F32, kSize * kSize * kSize);
  runRanks(kSize, [&](int rank) {
    auto comm = Communicator::create(store, rank, kSize, optionsFor(GetParam()));
    std::vector<std::vector<float>> bufs(ops.size() + 1, std::vector<float>(count));
    for (size_t k = 0; k < bufs.size(); ++k)
      for (size_t i = 0; i < count; ++i) bufs[k][i] = float(values(rank, i + k * count));
    std::vector<WorkPtr> works;
    for (size_t k = 0; k < ops.size(); ++k)
      works.push_back(
          comm->allreduce(bufs[k].data(), bufs[k + 1].data(), count, DType::F32, ops[k]));
    works.back()->wait();
    for (size_t k = 0; k < ops.size(); ++k)
      EXPECT_TRUE(works[k]->isCompleted()) << "op " << k << " completed after the last one";
    for (size_t k = 0; k < ops.size(); ++k) {
      works[k]->wait();
      for (size_t i = 0; i < count; ++i) {
        double sum = 0;
        for (int r = 0; r < kSize; ++r) sum += values(r, i);
        ASSERT_EQ(bufs[k + 1][i], float(timesS[k] * sum))
            << "op " << k << " (" << reduceOpName(ops[k]) << ") element " << i;
      }
    }
  });
}

TEST_P(CommunicatorTest, PremultipliedSumWeighsEachRanksInput) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kSize = 3;
  const size_t count = 1000 + 3;
  // Powers of two: every scaled value and sum below is exact in float32 and float64.
  const double scales[kSize] = {0.5, 0.25, 2.0};
  const test::DistinctValues values(DType::F32, 64);
  runRanks(kSize, [&](int rank) {
    auto comm = Communicator::create(store, rank, kSize, optionsFor(GetParam()));
    OpPolicy policy;
    policy.inputScale = scales[rank];
    std::vector<float> inPlace(count), in(count), out(count);
    std::vector<double> avg(count);
    for (size_t i = 0; i < count; ++i) {
      inPlace[i] = in[i] = float(values(rank, i));
      avg[i] = values(rank, i + count);
    }
    const std::vector<float> inBefore = in;
    comm->allreduce(inPlace.data(), inPlace.data(), count, DType::F32, ReduceOp::Sum, policy)
        ->wait();
    comm->allreduce(in.data(), out.data(), count, DType::F32, ReduceOp::Sum, policy)->wait();
    comm->allreduce(avg.data(), avg.data(), count, DType::F64, ReduceOp::Avg, policy)->wait();
    EXPECT_EQ(in, inBefore) << "an out-of-place allreduce left its input as it was";
    for (size_t i = 0; i < count; ++i) {
      double sum = 0, sumAvg = 0;
      for (int r = 0; r < kSize; ++r) {
        sum += scales[r] * values(r, i);
        sumAvg += scales[r] * values(r, i + count);
      }
      ASSERT_EQ(inPlace[i], float(sum)) << "in place, element " << i;
      ASSERT_EQ(out[i], float(sum)) << "out of place, element " << i;
      ASSERT_EQ(avg[i], sumAvg / kSize) << "float64 avg, element " << i;
    }
  });
}

TEST(Communicator, PremultipliedSumRefusesIntegersAndMinMax) {
  auto store = std::make_shared<store::MemoryStore>();
  auto comm = Communicator::create(store, 0, 1);
  OpPolicy policy;
  policy.inputScale = 2.0;
  float f = 1;
  int32_t k = 1;
  EXPECT_THROW(comm->allreduce(&f, &f, 1, DType::F32, ReduceOp::Max, policy), ConfigError);
  EXPECT_THROW(comm->allreduce(&k, &k, 1, DType::I32, ReduceOp::Sum, policy), ConfigError);
  comm->allreduce(&f, &f, 1, DType::F32, ReduceOp::Sum, policy)->wait();
  EXPECT_EQ(f, 2.0f);
}

TEST_P(CommunicatorTest, SplitFormsIndependentGroups) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kSize = 5;
  runRanks(kSize, [&](int rank) {
    auto world = Communicator::create(store, rank, kSize, optionsFor(GetParam()));
    // Colours 0 (ranks 0, 2, 4) and 1 (ranks 1, 3); key reverses the order inside each group.
    auto group = world->split(rank % 2, -rank, optionsFor(GetParam()));
    ASSERT_NE(group, nullptr);
    const int groupSize = rank % 2 ? 2 : 3;
    EXPECT_EQ(group->size(), groupSize);
    int64_t value = rank + 1;
    group->allreduce(&value, &value, 1, DType::I64, ReduceOp::Sum)->wait();
    EXPECT_EQ(value, rank % 2 ? 2 + 4 : 1 + 3 + 5);
    // Highest old rank first: key = -rank.
    const int expectedRank = rank % 2 ? (rank == 3 ? 0 : 1) : (4 - rank) / 2;
    EXPECT_EQ(group->rank(), expectedRank);
    // The world group still works after the split.
    world->barrier()->wait();
    auto none = world->split(rank == 0 ? -1 : 0, 0, optionsFor(GetParam()));
    EXPECT_EQ(none == nullptr, rank == 0);
  });
}

// Islands given for every rank of the group (two hosts: ranks 0-1 and 2-4) are kept for the
// members of a split (ranks 4, 2 and 0, in that order): one rank of the first host, two of the
// second; the split's group reduces over them.
TEST_P(CommunicatorTest, SplitKeepsTheMembersIslands) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kSize = 5;
  runRanks(kSize, [&](int rank) {
    GroupOptions options = optionsFor(GetParam());
    options.islands = {7, 7, 3, 3, 3};
    auto world = Communicator::create(store, rank, kSize, options);
    EXPECT_EQ(world->groupOptions().islands, options.islands);
    auto group = world->split(rank % 2 ? -1 : 0, -rank, world->groupOptions());
    if (rank % 2) {
      EXPECT_EQ(group, nullptr);
      return;
    }
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->groupOptions().islands, (std::vector<int>{3, 3, 7}));
    EXPECT_EQ(group->groupOptions().transport, options.transport);
    std::vector<double> values(1001);
    for (size_t i = 0; i < values.size(); ++i) values[i] = rank * 1000.0 + double(i);
    group->allreduce(values.data(), values.data(), values.size(), DType::F64, ReduceOp::Sum)
        ->wait();
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(values[i], 6000.0 + 3.0 * double(i)) << "element " << i;
  });
}

TEST_P(CommunicatorTest, SendAndReceiveBetweenPairs) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kSize = 4;
  runRanks(kSize, [&](int rank) {
    auto comm = Communicator::create(store, rank, kSize, optionsFor(GetParam()));
    std::vector<int32_t> out(777), in(777);
    std::iota(out.begin(), out.end(), rank * 1000);
    const int peer = rank ^ 1;
    // Lower rank sends first so the exchange is safe for any transport buffering.
    if (rank < peer) {
      comm->send(out.data(), out.size(), DType::I32, peer, 5)->wait();
      comm->recv(in.data(), in.size(), DType::I32, peer, 5)->wait();
    } else {
      comm->recv(in.data(), in.size(), DType::I32, peer, 5)->wait();
      comm->send(out.data(), out.size(), DType::I32, peer, 5)->wait();
    }
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(in[i], int32_t(peer * 1000 + i));
  });
}

// User tags are 64-bit, as the transport's, up to the algorithms' range at 2^63.
TEST_P(CommunicatorTest, SendAndReceiveTakeWideTagsAndRefuseTheAlgorithmsRange) {
  auto store = std::make_shared<store::MemoryStore>();
  runRanks(2, [&](int rank) {
    auto comm = Communicator::create(store, rank, 2, optionsFor(GetParam()));
    const uint64_t wide = (uint64_t(1) << 40) + 3;
    int32_t value = rank == 0 ? 41 : 0;
    if (rank == 0)
      comm->send(&value, 1, DType::I32, 1, wide)->wait();
    else
      comm->recv(&value, 1, DType::I32, 0, wide)->wait();
    EXPECT_EQ(value, 41);
    EXPECT_THROW(comm->send(&value, 1, DType::I32, 1 - rank, uint64_t(1) << 63), ConfigError);
  });
}

TEST_P(CommunicatorTest, MismatchFailsEveryRankAndIsLatched) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kSize = 3;
  std::vector<std::exception_ptr> failed(kSize), later(kSize);
  auto errors = test::runRanksCollect(kSize, [&](int rank) {
    auto comm = Communicator::create(store, rank, kSize, optionsFor(GetParam()));
    std::vector<float> buf(100);
    const size_t count = rank == 1 ? 50 : 100;  // rank 1 disagrees
    try {
      comm->allreduce(buf.data(), buf.data(), count, DType::F32, ReduceOp::Sum)->wait();
    } catch (...) {
      failed[rank] = std::current_exception();
    }
    try {
      comm->barrier()->wait();
    } catch (...) {
      later[rank] = std::current_exception();
    }
  });
  for (auto& e : errors) EXPECT_EQ(e, nullptr);
  test::expectMismatchOnEveryRank(failed, "mismatched collective");
  // Every later operation reports the same failure.
  for (int rank = 0; rank < kSize; ++rank) {
    if (!failed[rank]) continue;
    ASSERT_TRUE(later[rank]) << "rank " << rank << ": the barrier after the mismatch succeeded";
    auto whatOf = [](const std::exception_ptr& e) -> std::string {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        return x.what();
      } catch (...) {
        return "(not a std::exception)";
      }
    };
    EXPECT_EQ(whatOf(later[rank]), whatOf(failed[rank])) << "rank " << rank;
  }
  test::expectMismatchOnEveryRank(later, "mismatched collective");
}

INSTANTIATE_TEST_SUITE_P(Transports, CommunicatorTest, ::testing::Values("auto", "tcp"));

TEST(Communicator, RefusesUnknownTransport) {
  auto store = std::make_shared<store::MemoryStore>();
  try {
    Communicator::create(store, 0, 1, optionsFor("carrier-pigeon"));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("carrier-pigeon"), std::string::npos);
  }
}

TEST(Communicator, WaitTimesOutWhileAPeerIsMissing) {
  auto store = std::make_shared<store::MemoryStore>();
  // Two ranks form the group, then only rank 0 calls barrier: the group's 1.5 s timeout ends it
  // (the bound leaves a sanitizer build on busy cores room, and is far below the wait's 60 s).
  auto errors = test::runRanksCollect(2, [&](int rank) {
    GroupOptions o = optionsFor("auto");
    o.timeout = Millis(1500);
    auto comm = Communicator::create(store, rank, 2, o);
    if (rank == 0) {
      const auto start = Clock::now();
      try {
        comm->barrier()->wait(deadlineAfter(Millis(60000)));
        ADD_FAILURE() << "the barrier without rank 1 completed";
      } catch (const TimeoutError& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
      }
      EXPECT_LT(secondsSince(start), 30.0);
    }
  });
  for (auto& e : errors) EXPECT_EQ(e, nullptr);
}

#ifndef HETRA_WITH_MPI
TEST(Communicator, MpiTransportNeedsAnMpiBuild) {
  auto store = std::make_shared<store::MemoryStore>();
  GroupOptions options;
  options.transport = "mpi";
  try {
    Communicator::create(store, 0, 1, options);
    FAIL() << "transport mpi was accepted by a build without MPI";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not built with MPI support"), std::string::npos)
        << e.what();
  }
}
#endif

}  // namespace
}  // namespace hetra::comm
