// The communicator's per-operation path: the remembered provider choices
// (providers/choice_cache.h), the failure latch the tcp and MPI transports share
// (transport/failure_latch.h), and operations whose Work blocks are taken on one thread and
// released on another (work_queue.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/codec/codec.h"
#include "comm/communicator.h"
#include "comm/providers/choice_cache.h"
#include "comm/transport/failure_latch.h"
#include "common/errors.h"
#include "harness.h"
#include "store/store.h"

namespace hetra::comm {
namespace {

// Operations that differ in exactly one field of their shape, and sizes that share low bits.
std::vector<Operation> shapes() {
  std::vector<Operation> all;
  for (OpKind kind : kOpKinds)
    for (DType dtype : {DType::F32, DType::F64, DType::U8})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
        for (BufferPlace place : {BufferPlace::Host, BufferPlace::Cuda})
          for (size_t bytes : {size_t(0), size_t(8), size_t(1) << 20, (size_t(1) << 20) + 8}) {
            Operation o;
            o.kind = kind;
            o.dtype = dtype;
            o.op = op;
            o.place = place;
            o.bytes = bytes;
            all.push_back(o);
          }
  return all;
}

TEST(ChoiceCache, AnswersOnlyForTheShapeItRemembered) {
  const std::vector<Operation> all = shapes();
  ChoiceCache cache;
  for (const Operation& o : all) EXPECT_EQ(cache.find(o), 0) << "nothing remembered yet";
  // Shape i gets provider 1 + i % 250: a cache that mixed up two shapes would answer with the
  // other's id.
  for (size_t i = 0; i < all.size(); ++i) {
    const uint8_t id = uint8_t(1 + i % 250);
    cache.remember(all[i], id);
    EXPECT_EQ(cache.find(all[i]), id) << "shape " << i;
    for (size_t j = 0; j < all.size(); ++j) {
      const uint8_t found = cache.find(all[j]);
      if (found != 0) {
        EXPECT_EQ(found, uint8_t(1 + j % 250)) << "shape " << j << " after " << i;
      }
    }
  }
}

TEST(ChoiceCache, NeverRemembersACompressedOrHugeOperation) {
  const auto codec = makeCodec(Compression::Fp8E4M3, 256);
  Operation compressed;
  compressed.bytes = 1 << 20;
  compressed.codec = codec.get();
  Operation huge;
  huge.bytes = size_t(1) << 41;  // beyond the entry's 40 bits of size
  ChoiceCache cache;
  cache.remember(compressed, 3);
  cache.remember(huge, 4);
  EXPECT_EQ(cache.find(compressed), 0);
  EXPECT_EQ(cache.find(huge), 0);
  Operation exact = compressed;
  exact.codec = nullptr;
  EXPECT_EQ(cache.find(exact), 0) << "the compressed call left nothing for its exact shape";
}

struct Told {
  int culprit;
  std::string message;
};

TEST(FailureLatch, FirstErrorWinsAndThePeersAreToldOnce) {
  std::vector<Told> told;
  FailureLatch latch("tcp", [&](int culprit, const std::string& message) {
    told.push_back({culprit, message});
  });
  EXPECT_FALSE(latch);
  EXPECT_NO_THROW(latch.rethrowIfFailed());
  const auto first =
      latch.latch(std::make_exception_ptr(TimeoutError("rank 2 is late")), 2, "rank 2 is late");
  const auto second =
      latch.latch(std::make_exception_ptr(IoError("a later fault")), 1, "a later fault");
  EXPECT_TRUE(latch);
  EXPECT_EQ(first, second) << "the later error is dropped";
  EXPECT_EQ(latch.error(), first);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].culprit, 2);
  EXPECT_EQ(told[0].message, "rank 2 is late");
  EXPECT_THROW(latch.rethrowIfFailed(), TimeoutError);
}

TEST(FailureLatch, AbortBlamesThisRankByName) {
  std::vector<Told> told;
  FailureLatch latch("mpi", [&](int culprit, const std::string& message) {
    told.push_back({culprit, message});
  });
  latch.abort(3, "rank 3 (hostA)", "the loss is NaN");
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].culprit, 3);
  EXPECT_EQ(told[0].message, "rank 3 (hostA) aborted the group: the loss is NaN");
  try {
    latch.rethrowIfFailed();
    FAIL() << "no error latched";
  } catch (const PeerAbortedError& e) {
    EXPECT_EQ(e.rank(), 3);
    EXPECT_NE(std::string(e.what()).find("the loss is NaN"), std::string::npos) << e.what();
  }
}

// More operations in flight than a thread keeps free blocks for, issued on the rank's thread and
// waited for and released on another, then issued again: the blocks cross threads both ways.
TEST(WorkQueue, WorksTakenOnOneThreadAndReleasedOnAnotherKeepTheirResults) {
  for (const std::string transport : {"shm", "tcp"}) {
    constexpr int n = 3;
    constexpr int kOps = 200;
    constexpr size_t kCount = 3;
    auto store = std::make_shared<store::MemoryStore>();
    test::runRanks(n, [&](int rank) {
      GroupOptions options;
      options.transport = transport;
      options.timeout = Millis(20000);
      auto comm = Communicator::create(store, rank, n, options);
      for (int round = 0; round < 2; ++round) {
        std::vector<std::vector<int64_t>> buffers(kOps, std::vector<int64_t>(kCount));
        std::vector<WorkPtr> works;
        for (int i = 0; i < kOps; ++i) {
          for (size_t k = 0; k < kCount; ++k)
            buffers[i][k] = (rank + 1) * 1000000 + round * 100000 + i * 10 + int64_t(k);
          works.push_back(comm->allreduce(buffers[i].data(), buffers[i].data(), kCount, DType::I64,
                                          ReduceOp::Sum));
        }
        std::thread waiter([&] {
          for (auto& work : works) {
            work->wait();
            work.reset();  // the last reference: the block goes to this thread's free list
          }
        });
        waiter.join();
        // The sum over ranks r of (r + 1) * 10^6 + c is 10^6 * n(n+1)/2 + n * c.
        for (int i = 0; i < kOps; ++i)
          for (size_t k = 0; k < kCount; ++k)
            ASSERT_EQ(buffers[i][k],
                      1000000 * n * (n + 1) / 2 + n * (round * 100000 + i * 10 + int64_t(k)))
                << transport << " round " << round << " operation " << i << " element " << k;
      }
    });
  }
}

}  // namespace
}  // namespace hetra::comm
