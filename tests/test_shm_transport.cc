// The shared-memory transport: point-to-point through the pair rings (threads as ranks), setup
// timeouts, abort, a peer process killed mid-collective (fork), and the lifetime of the segments.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
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

using test::runRanks;
using test::runRanksCollect;

// A small ring (4 KiB) so that modest messages already wrap around it many times.
std::unique_ptr<Transport> connect(store::Store& store, int rank, int size,
                                   size_t ringBytes = 4096) {
  ShmOptions options;
  options.timeout = Millis(10000);
  options.ringBytes = ringBytes;
  options.slotBytes = 8192;
  return createShmTransport(store, rank, size, options);
}

Deadline soon() {
  return deadlineAfter(Millis(30000));
}

// Byte i of the message from `src` to `dst` with tag `tag`: every message differs.
uint8_t pattern(int src, int dst, uint64_t tag, size_t i) {
  return uint8_t(i * 131 + size_t(src) * 17 + size_t(dst) * 5 + tag * 3 + (i >> 8));
}

std::vector<uint8_t> message(int src, int dst, uint64_t tag, size_t bytes) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = pattern(src, dst, tag, i);
  return data;
}

void expectMessage(const std::vector<uint8_t>& got, int src, int dst, uint64_t tag) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != pattern(src, dst, tag, i))
      throw std::runtime_error(str("byte ", i, " of ", got.size(), " from rank ", src, " to ", dst,
                                   " tag ", tag, " is ", int(got[i]), ", want ",
                                   int(pattern(src, dst, tag, i))));
}

TEST(ShmTransport, PointToPointSizes) {
  auto store = test::newGroupStore();
  runRanks(2, [&](int rank) {
    auto t = connect(*store, rank, 2);
    EXPECT_STREQ(t->name(), "shm");
    EXPECT_EQ(t->rank(), rank);
    EXPECT_EQ(t->size(), 2);
    const int peer = 1 - rank;
    uint64_t expectedBytes = 0;
    // 0, 1, odd, exactly the ring, larger than the ring (many wraps).
    for (size_t bytes : {size_t(0), size_t(1), size_t(13), size_t(4096), size_t(100003)}) {
      const uint64_t tag = bytes;
      if (rank == 0) {
        auto data = message(0, 1, tag, bytes);
        t->isend(peer, tag, data.data(), bytes)->wait(soon());
      } else {
        std::vector<uint8_t> got(bytes, 0xEE);
        t->irecv(peer, tag, got.data(), bytes)->wait(soon());
        expectMessage(got, 0, 1, tag);
      }
      expectedBytes += bytes;
    }
    EXPECT_EQ(rank == 0 ? t->bytesSent() : t->bytesReceived(), expectedBytes);
  });
  EXPECT_TRUE(test::shmSegmentsOfPid(getpid()).empty());
}

TEST(ShmTransport, RingExchangeLargerThanThePairRing) {
  // Every rank sends right and receives left at once, waiting for its send first: without a
  // progress engine that also drains the incoming ring this deadlocks as soon as messages exceed
  // the ring.
  for (int n : {2, 3, 5, 8}) {
    auto store = test::newGroupStore();
    runRanks(n, [&](int rank) {
      auto t = connect(*store, rank, n);
      const int right = (rank + 1) % n, left = (rank + n - 1) % n;
      for (size_t bytes : {size_t(7), size_t(50001), size_t(300007)}) {
        for (int round = 0; round < 2; ++round) {
          const uint64_t tag = bytes + round;
          auto data = message(rank, right, tag, bytes);
          std::vector<uint8_t> got(bytes);
          auto send = t->isend(right, tag, data.data(), bytes);
          auto recv = t->irecv(left, tag, got.data(), bytes);
          send->wait(soon());
          recv->wait(soon());
          expectMessage(got, left, rank, tag);
        }
      }
    });
  }
}

TEST(ShmTransport, TagsMatchOutOfOrderAndKeepTheirOrder) {
  auto store = test::newGroupStore();
  runRanks(2, [&](int rank) {
    auto t = connect(*store, rank, 2);
    if (rank == 0) {
      // Tag 1 (three messages, larger than the ring) then tag 2; all sent before any receive.
      std::vector<std::vector<uint8_t>> data;
      std::vector<std::unique_ptr<Request>> sends;
      for (uint64_t k = 0; k < 3; ++k) data.push_back(message(0, 1, 10 + k, 9000 + k));
      data.push_back(message(0, 1, 99, 20000));
      for (uint64_t k = 0; k < 3; ++k)
        sends.push_back(t->isend(1, 1, data[k].data(), data[k].size()));
      sends.push_back(t->isend(1, 2, data[3].data(), data[3].size()));
      for (auto& s : sends) s->wait(soon());
    } else {
      // Tag 2 first: tag 1's messages arrive first and wait as unexpected messages.
      std::vector<uint8_t> last(20000);
      t->irecv(0, 2, last.data(), last.size())->wait(soon());
      expectMessage(last, 0, 1, 99);
      for (uint64_t k = 0; k < 3; ++k) {
        std::vector<uint8_t> got(9000 + k);
        t->irecv(0, 1, got.data(), got.size())->wait(soon());
        expectMessage(got, 0, 1, 10 + k);
      }
    }
  });
}

TEST(ShmTransport, ReceiveOfTheWrongSizeFails) {
  auto store = test::newGroupStore();
  runRanks(2, [&](int rank) {
    auto t = connect(*store, rank, 2);
    std::vector<uint8_t> data(100, 1);
    if (rank == 0) {
      t->isend(1, 5, data.data(), 100)->wait(soon());
      t->isend(1, 6, data.data(), 10)->wait(soon());
    } else {
      EXPECT_THROW(t->irecv(0, 5, data.data(), 99)->wait(soon()), MismatchError);
      // The stream stays usable after the bad message was drained.
      t->irecv(0, 6, data.data(), 10)->wait(soon());
    }
  });
}

TEST(ShmTransport, ReceiveTimesOutNamingThePeer) {
  auto store = test::newGroupStore();
  auto errors = runRanksCollect(2, [&](int rank) {
    auto t = connect(*store, rank, 2);
    if (rank == 1) {
      std::this_thread::sleep_for(Millis(400));
      return;
    }
    uint8_t byte = 0;
    t->irecv(1, 0, &byte, 1)->wait(deadlineAfter(Millis(150)));
  });
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("from rank 1"), std::string::npos) << e.what();
  }
}

TEST(ShmTransport, AbortWakesReceiversAndCollectives) {
  const int n = 3;
  auto store = test::newGroupStore();
  const auto start = Clock::now();
  auto errors = runRanksCollect(n, [&](int rank) {
    auto t = connect(*store, rank, n);
    if (rank == 2) {
      std::this_thread::sleep_for(Millis(150));
      t->abort("lost the device");
      std::this_thread::sleep_for(Millis(200));
      return;
    }
    if (rank == 0) {
      std::vector<uint8_t> buf(10);
      t->irecv(2, 0, buf.data(), buf.size())->wait(soon());
    } else {
      BarrierArgs args;
      args.deadline = soon();
      barrierShared(*t->sharedArena(), args);
    }
  });
  EXPECT_LT(secondsSince(start), 10.0);  // well before soon(): the abort woke it
  for (int rank : {0, 1}) {
    ASSERT_TRUE(errors[rank]) << "rank " << rank;
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const PeerAbortedError& e) {
      EXPECT_EQ(e.rank(), 2);
      EXPECT_NE(std::string(e.what()).find("rank 2 aborted the group: lost the device"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(ShmTransport, SetupTimesOut) {
  ShmOptions options;
  options.timeout = Millis(200);
  // Rank 0 never publishes a segment: the store wait expires.
  auto store = test::newGroupStore();
  EXPECT_THROW(createShmTransport(*store, 1, 2, options), TimeoutError);
  // Rank 1 never maps the segment: rank 0 gives up, naming it, and removes the segment.
  try {
    createShmTransport(*test::newGroupStore(), 0, 3, options);
    ADD_FAILURE() << "setup without peers succeeded";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 1, 2"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(test::shmSegmentsOfPid(getpid()).empty());
}

TEST(ShmTransport, SegmentIsPrivateAndUnlinkedOnceEveryRankMappedIt) {
  auto store = test::newGroupStore();
  runRanks(3, [&](int rank) {
    auto t = connect(*store, rank, 3);
    BarrierArgs args;
    args.deadline = soon();
    barrierShared(*t->sharedArena(), args);
    // Every rank mapped it, so its name is gone already while the transports live, and so is the
    // store key that published it.
    EXPECT_TRUE(test::shmSegmentsOfPid(getpid()).empty());
    EXPECT_FALSE(store->check({"segment"}));
    barrierShared(*t->sharedArena(), args);
  });
  // Name and mode while it exists: observe the segment of a group that never completes.
  ShmOptions options;
  options.timeout = Millis(300);
  auto lonely = test::newGroupStore();
  std::thread creator(
      [&] { EXPECT_THROW(createShmTransport(*lonely, 0, 2, options), TimeoutError); });
  std::this_thread::sleep_for(Millis(100));
  auto names = test::shmSegmentsOfPid(getpid());
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ("/" + names[0], lonely->getString("segment"));
  const std::string prefix = str("hetra-", getpid(), "-");
  EXPECT_EQ(names[0].size(), prefix.size() + 32) << names[0] << ": 128 random bits in hex";
  struct stat st;
  ASSERT_EQ(stat(str("/dev/shm/", names[0]).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  creator.join();
  EXPECT_TRUE(test::shmSegmentsOfPid(getpid()).empty());
}

TEST(ShmTransport, StaleSegmentsOfDeadJobsAreRemoved) {
  // A pid that surely does not exist any more: a child that exited and was reaped.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string stale = str("/hetra-", child, "-0123456789abcdef");
  const int fd = shm_open(stale.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(test::shmSegmentsOfPid(child).size(), 1u);
  auto store = test::newGroupStore();
  runRanks(2, [&](int rank) { connect(*store, rank, 2); });
  EXPECT_TRUE(test::shmSegmentsOfPid(child).empty()) << "stale segment " << stale << " survived";
  shm_unlink(stale.c_str());
}

// Rank 1 is a forked child process, killed with SIGKILL while both ranks run allreduces in a loop:
// rank 0 must get PeerAbortedError naming rank 1 within seconds (the child is not reaped until
// then, so the transport has to recognise a zombie as dead too).
TEST(ShmTransport, KilledPeerProcessIsReported) {
  const std::string name = newShmSegmentName();
  ShmOptions options;
  options.timeout = Millis(10000);
  const size_t count = 100000;  // pipelined path: several sync points per allreduce
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int code = 0;
    try {
      auto t = createShmTransport(name, 1, 2, options);
      std::vector<float> in(count, 1.0f), out(count);
      for (uint64_t seq = 0;; ++seq) {
        AllreduceArgs args;
        args.in = in.data();
        args.out = out.data();
        args.count = count;
        args.seq = seq;
        args.deadline = deadlineAfter(Millis(10000));
        allreduceShared(*t->sharedArena(), args);
      }
    } catch (...) {
      code = 1;
    }
    _exit(code);
  }
  std::thread killer([&] {
    std::this_thread::sleep_for(Millis(300));
    kill(child, SIGKILL);
  });
  Clock::time_point killedAround = Clock::now() + Millis(300);
  int rounds = 0;
  try {
    auto t = createShmTransport(name, 0, 2, options);
    std::vector<float> in(count, 2.0f), out(count);
    for (uint64_t seq = 0;; ++seq) {
      AllreduceArgs args;
      args.in = in.data();
      args.out = out.data();
      args.count = count;
      args.seq = seq;
      args.deadline = deadlineAfter(Millis(20000));
      allreduceShared(*t->sharedArena(), args);
      ASSERT_EQ(out[count - 1], 3.0f);
      ++rounds;
    }
  } catch (const PeerAbortedError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_NE(std::string(e.what()).find(str("rank 1 (pid ", child, ") died")), std::string::npos)
        << e.what();
    EXPECT_LT(secondsSince(killedAround), 10.0);
  }
  killer.join();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_GT(rounds, 0);
  EXPECT_TRUE(test::shmSegmentsOfPid(getpid()).empty());
}

// A receive from a child process that is killed before it sends: PeerAbortedError, not a timeout.
TEST(ShmTransport, ReceiveFromAKilledPeerFails) {
  const std::string name = newShmSegmentName();
  ShmOptions options;
  options.timeout = Millis(10000);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      auto t = createShmTransport(name, 1, 2, options);
      pause();  // never sends
    } catch (...) {
    }
    _exit(1);
  }
  auto t = createShmTransport(name, 0, 2, options);
  std::thread killer([&] {
    std::this_thread::sleep_for(Millis(100));
    kill(child, SIGKILL);
  });
  const auto start = Clock::now();
  std::vector<uint8_t> buf(1000);
  try {
    t->irecv(1, 3, buf.data(), buf.size())->wait(deadlineAfter(Millis(20000)));
    ADD_FAILURE() << "receive from a dead peer succeeded";
  } catch (const PeerAbortedError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_NE(std::string(e.what()).find("died"), std::string::npos) << e.what();
  }
  EXPECT_LT(secondsSince(start), 10.0);
  killer.join();
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
}

TEST(ShmTransport, ExplicitNameMustBeOurs) {
  ShmOptions options;
  options.timeout = Millis(100);
  EXPECT_THROW(createShmTransport(std::string("/etc-passwd"), 0, 1, options), ConfigError);
  EXPECT_THROW(createShmTransport(std::string("/hetra-1-../x"), 0, 1, options), ConfigError);
}

}  // namespace
}  // namespace hetra::comm
