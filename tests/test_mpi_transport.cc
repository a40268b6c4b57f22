// The MPI transport, one rank per MPI process: run under mpirun (ctest runs it with -np 3 and
// -np 4). Point-to-point transfers (64-bit tags, sizes around the inline limit, per-tag order,
// receives posted before and after their messages, byte counters), the ring algorithms and the
// Communicator over it (uneven counts, compression), a sub-group in reversed order, and faults:
// a timeout, abort, a rank that closed its transport, a mismatched size and a mismatched call.
//
// Every process runs every test in the same order; each test forms its own group under its own
// store prefix, so the group's join keeps the processes in step. Only rank 0 prints the usual
// gtest output; the others print their failures, prefixed with their rank. mpirun's exit code is
// non-zero when any rank fails.
#include <gtest/gtest.h>
// The C API only: MPI's deprecated C++ bindings would need their own library.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <stdlib.h>
#include <unistd.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <thread>

#include "comm/algorithms/ring.h"
#include "comm/communicator.h"
#include "comm/transport/mpi_transport.h"
#include "common/errors.h"
#include "harness.h"
#include "store/file_store.h"
#include "store/store.h"

namespace hetra::comm {
namespace {

using test::distinctValue;

MpiProcess gWorld;
std::string gStoreDir;

// A store shared by the processes (a directory), prefixed per test so groups never meet.
std::shared_ptr<store::Store> testStore(const std::string& name = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string prefix = str(info->test_suite_name(), ".", info->name(), name);
  return std::make_shared<store::PrefixStore>(
      prefix, std::make_shared<store::FileStore>(gStoreDir, Millis(20000)));
}

std::unique_ptr<Transport> worldTransport(Millis timeout = Millis(20000)) {
  MpiOptions options;
  options.timeout = timeout;
  return createMpiTransport(testStore(), gWorld.worldRank, gWorld.worldSize, options);
}

Deadline soon() {
  return deadlineAfter(Millis(20000));
}

// Byte j of message m from `from` to `to`: distinct per pair, message and position.
uint8_t byteOf(int from, int to, size_t m, size_t j) {
  return uint8_t(from * 37 + to * 11 + m * 5 + j * 131 + (j >> 8));
}

TEST(MpiTransport, PointToPointTagsSizesAndCounters) {
  auto t = worldTransport();
  ASSERT_STREQ(t->name(), "mpi");
  const int r = t->rank(), n = t->size();
  ASSERT_EQ(n, gWorld.worldSize);
  // Sizes around the inline limit (4096) and one over a MiB; tags above 2^32 and 2^63.
  const std::vector<size_t> sizes = {0, 1, 7, 4095, 4096, 4097, 65537, (size_t(1) << 20) + 3};
  auto tagOf = [](size_t m) { return (uint64_t(1) << 63) + (uint64_t(m) << 40) + 9; };
  constexpr int kRepeats = 3;  // same tag, three messages: they arrive in send order
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<std::unique_ptr<Request>> requests;
  uint64_t expectedBytes = 0;
  struct Incoming {
    int from;
    size_t m;
    int k;
    size_t index;
  };
  std::vector<Incoming> incoming;
  for (int peer = 0; peer < n; ++peer) {
    if (peer == r) continue;
    // Receives first from lower ranks, after sending to higher ones: both the posted-first and
    // the arrived-first paths run. Receives go in reverse tag order.
    auto postReceives = [&] {
      for (size_t m = sizes.size(); m-- > 0;)
        for (int k = 0; k < kRepeats; ++k) {
          in.emplace_back(sizes[m] + k, 0xEE);
          incoming.push_back({peer, m, k, in.size() - 1});
        }
    };
    auto postSends = [&] {
      for (size_t m = 0; m < sizes.size(); ++m)
        for (int k = 0; k < kRepeats; ++k) {
          std::vector<uint8_t> message(sizes[m] + k);
          for (size_t j = 0; j < message.size(); ++j) message[j] = byteOf(r, peer, m * 8 + k, j);
          out.push_back(std::move(message));
          expectedBytes += sizes[m] + k;
        }
    };
    if (peer < r) {
      postReceives();
      postSends();
    } else {
      postSends();
      postReceives();
    }
  }
  // Buffers are in place (no reallocation below); now post everything.
  size_t sendIndex = 0;
  size_t recvIndex = 0;
  for (int peer = 0; peer < n; ++peer) {
    if (peer == r) continue;
    auto receives = [&] {
      for (; recvIndex < incoming.size() && incoming[recvIndex].from == peer; ++recvIndex) {
        const Incoming& c = incoming[recvIndex];
        auto& buffer = in[c.index];
        requests.push_back(
            t->irecv(peer, tagOf(c.m), buffer.data() ? buffer.data() : nullptr, buffer.size()));
      }
    };
    auto sends = [&] {
      for (size_t m = 0; m < sizes.size(); ++m)
        for (int k = 0; k < kRepeats; ++k, ++sendIndex)
          requests.push_back(
              t->isend(peer, tagOf(m), out[sendIndex].data(), out[sendIndex].size()));
    };
    if (peer < r) {
      receives();
      sends();
    } else {
      sends();
      receives();
    }
  }
  for (auto& request : requests) request->wait(soon());
  for (const Incoming& c : incoming) {
    const auto& buffer = in[c.index];
    ASSERT_EQ(buffer.size(), sizes[c.m] + c.k);
    for (size_t j = 0; j < buffer.size(); ++j)
      ASSERT_EQ(buffer[j], byteOf(c.from, r, c.m * 8 + c.k, j))
          << "from rank " << c.from << " message " << c.m << " copy " << c.k << " byte " << j;
  }
  EXPECT_EQ(t->bytesSent(), expectedBytes);
  EXPECT_EQ(t->bytesReceived(), expectedBytes);  // every rank sends the same sizes to each peer
}

// The group in reversed order (hetra rank = size-1-world rank) and a sub-group without world
// rank 1: MPI_Comm_create_group over any subset, in any order.
TEST(MpiTransport, ReversedGroupAndSubGroup) {
  const int n = gWorld.worldSize, w = gWorld.worldRank;
  {
    MpiOptions options;
    options.timeout = Millis(20000);
    auto t = createMpiTransport(testStore("reversed"), n - 1 - w, n, options);
    const int r = t->rank(), right = (r + 1) % n, left = (r + n - 1) % n;
    int64_t mine = 1000 + w, got = -1;
    auto recv = t->irecv(left, 5, &got, sizeof got);
    t->isend(right, 5, &mine, sizeof mine)->wait(soon());
    recv->wait(soon());
    // left in hetra ranks is world rank n-1-left.
    EXPECT_EQ(got, 1000 + (n - 1 - left));
  }
  if (w == 1) return;
  MpiOptions options;
  options.timeout = Millis(20000);
  const int sub = n - 1, r = w == 0 ? 0 : w - 1;
  auto t = createMpiTransport(testStore("sub"), r, sub, options);
  std::vector<double> data(1001);
  for (size_t i = 0; i < data.size(); ++i) data[i] = distinctValue(r, i, false);
  AllreduceArgs args;
  args.in = args.out = data.data();
  args.count = data.size();
  args.dtype = DType::F64;
  args.deadline = soon();
  allreduceRing(*t, args);
  for (size_t i = 0; i < data.size(); ++i) {
    double expected = 0;
    for (int q = 0; q < sub; ++q) expected += distinctValue(q, i, false);
    ASSERT_EQ(data[i], expected) << "element " << i;
  }
}

TEST(MpiTransport, RingAlgorithms) {
  auto t = worldTransport();
  const int r = t->rank(), n = t->size();
  uint64_t seq = 0;
  for (size_t count : {size_t(1), size_t(13), size_t(100003), (size_t(1) << 20) + 7}) {
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = float(distinctValue(r, i, false));
    AllreduceArgs args;
    args.in = args.out = data.data();
    args.count = count;
    args.dtype = DType::F32;
    args.op = ReduceOp::Sum;
    args.seq = seq++;
    args.deadline = soon();
    allreduceRing(*t, args);
    for (size_t i = 0; i < count; ++i) {
      double expected = 0;
      for (int q = 0; q < n; ++q) expected += float(distinctValue(q, i, false));
      ASSERT_EQ(data[i], float(expected)) << "count " << count << " element " << i;
    }
    // Max of int64, out of place.
    std::vector<int64_t> values(count), result(count, -1);
    for (size_t i = 0; i < count; ++i) values[i] = int64_t((i * 7919 + r * 104729) % 1000003);
    args.in = values.data();
    args.out = result.data();
    args.dtype = DType::I64;
    args.op = ReduceOp::Max;
    args.seq = seq++;
    allreduceRing(*t, args);
    for (size_t i = 0; i < count; ++i) {
      int64_t expected = INT64_MIN;
      for (int q = 0; q < n; ++q)
        expected = std::max(expected, int64_t((i * 7919 + q * 104729) % 1000003));
      ASSERT_EQ(result[i], expected) << "count " << count << " element " << i;
    }
  }
  // Reduce-scatter and allgather with uneven blocks (one empty).
  std::vector<size_t> counts(n);
  for (int b = 0; b < n; ++b) counts[b] = b == 1 ? 0 : size_t(3 * b + 1) + (b == n - 1 ? 70001 : 0);
  std::vector<size_t> offsets(n + 1, 0);
  for (int b = 0; b < n; ++b) offsets[b + 1] = offsets[b] + counts[b];
  std::vector<double> full(offsets[n]);
  for (size_t i = 0; i < full.size(); ++i) full[i] = distinctValue(r, i, false);
  std::vector<double> mine(counts[r] + 1, -7.0);
  ReduceScatterArgs rs;
  rs.in = full.data();
  rs.out = mine.data();
  rs.counts = counts;
  rs.dtype = DType::F64;
  rs.seq = seq++;
  rs.deadline = soon();
  reduceScatterRing(*t, rs);
  for (size_t i = 0; i < counts[r]; ++i) {
    double expected = 0;
    for (int q = 0; q < n; ++q) expected += distinctValue(q, offsets[r] + i, false);
    ASSERT_EQ(mine[i], expected) << "element " << i;
  }
  EXPECT_EQ(mine[counts[r]], -7.0);  // nothing past the block
  std::vector<double> block(counts[r]);
  for (size_t i = 0; i < block.size(); ++i) block[i] = distinctValue(r, i, false) + 0.5;
  std::vector<double> all(offsets[n], -1.0);
  AllgatherArgs ag;
  ag.in = block.data();
  ag.out = all.data();
  ag.counts = counts;
  ag.dtype = DType::F64;
  ag.seq = seq++;
  ag.deadline = soon();
  allgatherRing(*t, ag);
  for (int b = 0; b < n; ++b)
    for (size_t i = 0; i < counts[b]; ++i)
      ASSERT_EQ(all[offsets[b] + i], distinctValue(b, i, false) + 0.5) << "block " << b;
  // Broadcast from the last rank, then a barrier.
  std::vector<int32_t> buf(70003);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = r == n - 1 ? int32_t(i * 3 + 11) : -1;
  BroadcastArgs bc;
  bc.buf = buf.data();
  bc.count = buf.size();
  bc.dtype = DType::I32;
  bc.root = n - 1;
  bc.seq = seq++;
  bc.deadline = soon();
  broadcastPipelined(*t, bc);
  for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], int32_t(i * 3 + 11)) << i;
  BarrierArgs barrier;
  barrier.seq = seq++;
  barrier.deadline = soon();
  barrierDissemination(*t, barrier);
}

GroupOptions mpiOptions() {
  GroupOptions o;
  o.transport = "mpi";
  o.timeout = Millis(20000);
  return o;
}

TEST(MpiCommunicator, Collectives) {
  auto comm = Communicator::create(testStore(), gWorld.worldRank, gWorld.worldSize, mpiOptions());
  ASSERT_STREQ(comm->transportName(), "mpi");
  const int r = comm->rank(), n = comm->size();
  const size_t count = 300007;
  std::vector<float> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = float(distinctValue(r, i, false));
  std::vector<float> avg(count);
  comm->allreduce(data.data(), avg.data(), count, DType::F32, ReduceOp::Avg)->wait();
  comm->allreduce(data.data(), data.data(), count, DType::F32, ReduceOp::Sum)->wait();
  for (size_t i = 0; i < count; ++i) {
    double expected = 0;
    for (int q = 0; q < n; ++q) expected += float(distinctValue(q, i, false));
    ASSERT_EQ(data[i], float(expected)) << i;
    ASSERT_NEAR(avg[i], expected / n, 1e-6 * std::fabs(expected)) << i;
  }
  // Uneven reduce-scatter and allgather.
  std::vector<size_t> counts(n);
  for (int b = 0; b < n; ++b) counts[b] = size_t(1000 * b + 17 * (b + 1));
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::vector<int32_t> in(total), mine(counts[r]);
  for (size_t i = 0; i < total; ++i) in[i] = int32_t(i * 13 + r * 100003);
  comm->reduceScatter(in.data(), mine.data(), counts, DType::I32, ReduceOp::Sum)->wait();
  size_t offset = 0;
  for (int b = 0; b < r; ++b) offset += counts[b];
  for (size_t i = 0; i < counts[r]; ++i) {
    int64_t expected = 0;
    for (int q = 0; q < n; ++q) expected += int64_t((offset + i) * 13 + q * 100003);
    ASSERT_EQ(mine[i], int32_t(expected)) << i;
  }
  std::vector<int32_t> all(total, -1);
  comm->allgather(mine.data(), all.data(), counts, DType::I32)->wait();
  for (size_t i = 0; i < total; ++i) {
    int64_t expected = 0;
    for (int q = 0; q < n; ++q) expected += int64_t(i * 13 + q * 100003);
    ASSERT_EQ(all[i], int32_t(expected)) << i;
  }
  std::vector<double> buf(12345, r == 1 ? 0.0 : -1.0);
  if (r == 1)
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = distinctValue(1, i, false);
  comm->broadcast(buf.data(), buf.size(), DType::F64, 1)->wait();
  for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], distinctValue(1, i, false)) << i;
  comm->barrier()->wait();
  EXPECT_GT(comm->bytesSent(), 0u);
}

// As tests/test_comm_compressed.cc: inputs spanning a few binades, the exact sum, the bound.
std::vector<float> compressedInput(int rank, size_t count) {
  std::mt19937 rng(1234 + rank);
  std::uniform_real_distribution<float> mantissa(0.5f, 1.0f);
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) {
    const float sign = (i + rank) % 3 == 0 ? -1.0f : 1.0f;
    values[i] = sign * std::ldexp(mantissa(rng), int((i * 7 + rank) % 9) - 4);
  }
  return values;
}

TEST(MpiCommunicator, CompressedAllreduceWithinTheBound) {
  auto comm = Communicator::create(testStore(), gWorld.worldRank, gWorld.worldSize, mpiOptions());
  OpPolicy fp8;
  fp8.compression = CompressionPolicy(Compression::Fp8E4M3, 256, 0);
  const int r = comm->rank(), n = comm->size();
  for (size_t count : {size_t(7), size_t(4099), size_t(150001)}) {
    double scale = 0;
    std::vector<double> exact(count, 0.0);
    for (int q = 0; q < n; ++q) {
      const auto values = compressedInput(q, count);
      double m = 0;
      for (size_t i = 0; i < count; ++i) {
        exact[i] += values[i];
        m = std::max(m, double(std::fabs(values[i])));
      }
      scale += m;
    }
    double exactMax = 0;
    for (double x : exact) exactMax = std::max(exactMax, std::fabs(x));
    const double bound = unitRoundoff(Compression::Fp8E4M3) * (scale + exactMax) + 1e-6 * scale;
    auto in = compressedInput(r, count);
    std::vector<float> out(count, -1.0f);
    comm->allreduce(in.data(), out.data(), count, DType::F32, ReduceOp::Sum, fp8)->wait();
    double worst = 0;
    for (size_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(out[i] - exact[i]));
    EXPECT_LE(worst, bound) << "count " << count;
    if (count > 1000) {
      EXPECT_GT(worst, 0.0) << "the codec did not run";
    }
    // Bitwise identical on every rank: gather the bits as int32 (not compressed).
    std::vector<int32_t> bits(count), allBits(count * size_t(n));
    std::memcpy(bits.data(), out.data(), count * sizeof(float));
    comm->allgather(bits.data(), allBits.data(), std::vector<size_t>(n, count), DType::I32)->wait();
    for (int q = 0; q < n; ++q)
      ASSERT_EQ(0, std::memcmp(allBits.data() + size_t(q) * count, bits.data(), count * 4))
          << "rank " << q << " differs from rank " << r << " (count " << count << ")";
  }
}

// A receive nobody sends times out at its deadline on rank 0; rank 0 then fails the group, so the
// other ranks, waiting for rank 0 with a long deadline, wake promptly.
TEST(MpiFaults, TimeoutThenPeersWake) {
  auto t = worldTransport();
  const int r = t->rank();
  int64_t value = 0;
  const auto start = Clock::now();
  if (r == 0) {
    auto recv = t->irecv(1, 777, &value, sizeof value);
    try {
      recv->wait(deadlineAfter(Millis(300)));
      FAIL() << "the receive completed";
    } catch (const TimeoutError& e) {
      const double s = secondsSince(start);
      EXPECT_GE(s, 0.29);
      EXPECT_LT(s, 2.0);
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
  } else {
    auto recv = t->irecv(0, 778, &value, sizeof value);
    try {
      recv->wait(deadlineAfter(Millis(15000)));
      FAIL() << "the receive completed";
    } catch (const PeerAbortedError& e) {
      EXPECT_LT(secondsSince(start), 12.0);
      EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
    }
  }
}

TEST(MpiFaults, AbortWakesEveryPeerWithTheCulprit) {
  auto t = worldTransport();
  const int r = t->rank(), n = t->size();
  if (r == n - 1) {
    std::this_thread::sleep_for(Millis(100));
    t->abort("stopped by the test");
    EXPECT_THROW(t->isend(0, 1, nullptr, 0), PeerAbortedError);
    return;
  }
  int64_t value = 0;
  auto recv = t->irecv(n - 1, 3, &value, sizeof value);
  const auto start = Clock::now();
  try {
    recv->wait(deadlineAfter(Millis(15000)));
    FAIL() << "the receive completed";
  } catch (const PeerAbortedError& e) {
    EXPECT_EQ(e.rank(), n - 1);
    EXPECT_NE(std::string(e.what()).find("stopped by the test"), std::string::npos) << e.what();
    EXPECT_LT(secondsSince(start), 12.0);
  }
}

// A rank that destroys its transport cleanly: a receive that waits for it fails at once, naming it.
TEST(MpiFaults, ClosedPeer) {
  auto t = worldTransport();
  const int r = t->rank();
  if (r == 0) {
    t.reset();
    return;
  }
  int64_t value = 0;
  const auto start = Clock::now();
  try {
    t->irecv(0, 4, &value, sizeof value)->wait(deadlineAfter(Millis(15000)));
    FAIL() << "the receive completed";
  } catch (const PeerAbortedError& e) {
    EXPECT_EQ(e.rank(), 0);
    EXPECT_NE(std::string(e.what()).find("closed its transport"), std::string::npos) << e.what();
    EXPECT_LT(secondsSince(start), 12.0);
  }
}

// A receive of another size than its send: MismatchError on the receiver, PeerAbortedError on the
// other ranks once they wait.
TEST(MpiFaults, MismatchedSize) {
  auto t = worldTransport();
  const int r = t->rank(), n = t->size();
  std::vector<uint8_t> buffer(10000, uint8_t(r));
  if (r == 0) {
    // The send may complete before rank 1 looks at it (MPI buffers it); the group fails anyway.
    try {
      t->isend(1, 8, buffer.data(), 9000)->wait(deadlineAfter(Millis(15000)));
    } catch (const PeerAbortedError&) {
    }
    EXPECT_THROW(t->irecv(1, 8, buffer.data(), 1)->wait(deadlineAfter(Millis(15000))),
                 PeerAbortedError);
  } else if (r == 1) {
    try {
      t->irecv(0, 8, buffer.data(), 9001)->wait(deadlineAfter(Millis(15000)));
      FAIL() << "the receive completed";
    } catch (const MismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("9000"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_THROW(t->irecv((r + 1) % n, 9, buffer.data(), 1)->wait(deadlineAfter(Millis(15000))),
                 PeerAbortedError);
  }
}

// Ranks call allreduce with different counts: every rank fails, none hangs.
TEST(MpiFaults, MismatchedCollectiveFailsEveryRank) {
  auto comm = Communicator::create(testStore(), gWorld.worldRank, gWorld.worldSize, mpiOptions());
  const int r = comm->rank(), n = comm->size();
  const size_t count = r == n - 1 ? 1001 : 1000;
  std::vector<float> data(count, float(r));
  const auto start = Clock::now();
  try {
    comm->allreduce(data.data(), data.data(), count, DType::F32, ReduceOp::Sum)
        ->wait(deadlineAfter(Millis(15000)));
    FAIL() << "the mismatched allreduce completed";
  } catch (const MismatchError&) {
  } catch (const PeerAbortedError&) {
  }
  EXPECT_LT(secondsSince(start), 10.0);
}

TEST(MpiCommunicator, RefusesRanksThatShareAProcess) {
  // Two hetra ranks of one group in this one process: refused before any MPI call could hang.
  auto store = testStore(str("/", gWorld.worldRank));
  GroupOptions o = mpiOptions();
  o.timeout = Millis(5000);
  const auto errors =
      test::runRanksCollect(2, [&](int rank) { Communicator::create(store, rank, 2, o); });
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const ConfigError& c) {
      EXPECT_NE(std::string(c.what()).find("same MPI process"), std::string::npos) << c.what();
    }
  }
}

// Prints the failures of a rank other than 0, prefixed with its rank (its usual output would
// interleave with rank 0's).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::cerr << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
              << result.line_number() << ": " << result.summary() << std::endl;
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::cerr << "[rank " << rank_ << "] FAILED " << info.test_suite_name() << "." << info.name()
                << std::endl;
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace hetra::comm

int main(int argc, char** argv) {
  using namespace hetra;
  ::testing::InitGoogleTest(&argc, argv);
  comm::gWorld = comm::initMpi();
  if (comm::gWorld.worldSize < 2) {
    std::cerr << "test_mpi_transport needs at least 2 MPI processes: run it under "
                 "mpirun -np 3 (ctest does)"
              << std::endl;
    return 1;
  }
  // The store directory: made by world rank 0, its name broadcast to the others.
  char dir[256] = {};
  if (comm::gWorld.worldRank == 0) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "hetra-mpi-test-XXXXXX").string();
    if (!mkdtemp(pattern.data())) {
      std::perror("mkdtemp");
      MPI_Abort(MPI_COMM_WORLD, 1);  // the test harness's last resort: nothing can run
    }
    std::snprintf(dir, sizeof dir, "%s", pattern.c_str());
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  comm::gStoreDir = dir;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (comm::gWorld.worldRank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new comm::RankFailurePrinter(comm::gWorld.worldRank));
  }
  const int failed = RUN_ALL_TESTS();
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm::gWorld.worldRank == 0) {
    std::error_code ignored;
    std::filesystem::remove_all(comm::gStoreDir, ignored);
  }
  return failed;
}
