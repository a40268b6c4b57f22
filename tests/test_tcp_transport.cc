// The tcp transport: point-to-point transfers (sizes, per-tag ordering, byte counters), and faults:
// abort, timeouts, a rank that never joins, a rank killed mid-collective (a forked process).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "comm/algorithms/ring.h"
#include "comm/transport/tcp_transport.h"
#include "common/errors.h"
#include "harness.h"
#include "store/store.h"

namespace hetra::comm {
namespace {

using test::runRanks;
using test::runRanksCollect;

// A store that processes share through a directory: one file per key, written to a temporary name
// and renamed so readers never see half a value; add/compareSet hold an flock. Enough for a test.
class DirStore : public store::Store {
 public:
  explicit DirStore(std::string dir) : dir_(std::move(dir)) {}

  void set(const std::string& key, const store::Bytes& value) override {
    const std::string tmp = str(dir_, "/.tmp.", getpid(), ".", counter_++);
    {
      std::ofstream out(tmp, std::ios::binary);
      out.write(reinterpret_cast<const char*>(value.data()), std::streamsize(value.size()));
    }
    std::filesystem::rename(tmp, path(key));
  }
  store::Bytes get(const std::string& key, Deadline deadline) override {
    wait({key}, deadline);
    std::ifstream in(path(key), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    return store::Bytes(s.begin(), s.end());
  }
  int64_t add(const std::string& key, int64_t delta) override {
    Locked lock(dir_);
    const int64_t value = (check({key}) ? store::parseInteger(get(key, Clock::now())) : 0) + delta;
    set(key, store::integerBytes(value));
    return value;
  }
  store::Bytes compareSet(const std::string& key, const store::Bytes& expected,
                          const store::Bytes& desired) override {
    Locked lock(dir_);
    const bool present = check({key});
    const store::Bytes current = present ? get(key, Clock::now()) : store::Bytes{};
    if ((!present && expected.empty()) || (present && current == expected)) {
      set(key, desired);
      return desired;
    }
    return current;
  }
  void wait(const std::vector<std::string>& keys, Deadline deadline) override {
    const Millis budget = remaining(deadline);
    while (!check(keys)) {
      if (Clock::now() >= deadline)
        throw TimeoutError(str("dir store: timed out after ", budget.count(), " ms waiting for ",
                               store::describeKeys(keys)));
      usleep(1000);
    }
  }
  bool check(const std::vector<std::string>& keys) override {
    for (const auto& key : keys)
      if (access(path(key).c_str(), F_OK) != 0) return false;
    return true;
  }
  bool deleteKey(const std::string& key) override { return unlink(path(key).c_str()) == 0; }

 private:
  struct Locked {
    explicit Locked(const std::string& dir)
        : fd(open((dir + "/.lock").c_str(), O_CREAT | O_RDWR, 0600)) {
      flock(fd, LOCK_EX);
    }
    ~Locked() {
      flock(fd, LOCK_UN);
      close(fd);
    }
    int fd;
  };
  std::string path(const std::string& key) const {
    std::string name = "k_";
    for (unsigned char c : key)
      name += std::isalnum(c) ? std::string(1, char(c)) : str("%", int(c));
    return dir_ + "/" + name;
  }
  std::string dir_;
  std::atomic<int> counter_{0};
};

std::vector<std::unique_ptr<Transport>> connectGroup(int n, std::shared_ptr<store::Store> shared,
                                                     Millis timeout = Millis(20000)) {
  std::vector<std::unique_ptr<Transport>> ranks(n);
  TcpOptions options;
  options.timeout = timeout;
  runRanks(n, [&](int r) { ranks[r] = createTcpTransport(shared, r, n, options); });
  return ranks;
}

std::shared_ptr<store::Store> memoryStore(const std::string& prefix) {
  return std::make_shared<store::PrefixStore>(prefix, std::make_shared<store::MemoryStore>());
}

Deadline soon() {
  return deadlineAfter(Millis(20000));
}

std::vector<uint8_t> pattern(size_t bytes, int seed) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = uint8_t((i * 131 + seed * 17 + (i >> 8)) & 0xff);
  return data;
}

TEST(TcpTransport, PointToPointSizesAndCounters) {
  auto ranks = connectGroup(3, memoryStore("p2p"));
  const size_t sizes[] = {0, 1, 7, 4093, (size_t(3) << 20) + 5};
  uint64_t expected = 0;
  for (size_t bytes : sizes) expected += bytes;
  // Every rank sends each size to the next rank and receives from the previous one.
  runRanks(3, [&](int r) {
    Transport& t = *ranks[r];
    EXPECT_STREQ(t.name(), "tcp");
    EXPECT_EQ(t.rank(), r);
    EXPECT_EQ(t.size(), 3);
    for (size_t bytes : sizes) {
      auto mine = pattern(bytes, r);
      std::vector<uint8_t> got(bytes + 1, 0xee);
      auto recv = t.irecv((r + 2) % 3, 5, got.data(), bytes);
      auto send = t.isend((r + 1) % 3, 5, mine.data(), bytes);
      recv->wait(soon());
      send->wait(soon());
      got.pop_back();
      EXPECT_TRUE(got == pattern(bytes, (r + 2) % 3))
          << "rank " << r << " got wrong bytes for size " << bytes;
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ranks[r]->bytesSent(), expected);
    EXPECT_EQ(ranks[r]->bytesReceived(), expected);
  }
}

TEST(TcpTransport, MessagesOfOneTagArriveInOrderAndTagsAreSeparate) {
  auto ranks = connectGroup(2, memoryStore("order"));
  constexpr int kMessages = 20;
  runRanks(2, [&](int r) {
    Transport& t = *ranks[r];
    if (r == 0) {
      std::vector<std::unique_ptr<Request>> sends;
      std::vector<std::vector<uint8_t>> data;
      for (int i = 0; i < kMessages; ++i) data.push_back(pattern(1000 + i, i));
      data.push_back(pattern(64, 99));
      // Tag 8 is sent first but received last: matching is by tag, not by arrival.
      sends.push_back(t.isend(1, 8, data[kMessages].data(), 64));
      for (int i = 0; i < kMessages; ++i)
        sends.push_back(t.isend(1, 7, data[i].data(), data[i].size()));
      for (auto& s : sends) s->wait(soon());
    } else {
      std::vector<std::vector<uint8_t>> got(kMessages);
      std::vector<std::unique_ptr<Request>> recvs;
      for (int i = 0; i < kMessages; ++i) {
        got[i].resize(1000 + i);
        recvs.push_back(t.irecv(0, 7, got[i].data(), got[i].size()));
      }
      for (int i = 0; i < kMessages; ++i) {
        recvs[i]->wait(soon());
        EXPECT_TRUE(got[i] == pattern(1000 + i, i)) << "message " << i << " out of order";
      }
      std::vector<uint8_t> late(64);
      t.irecv(0, 8, late.data(), late.size())->wait(soon());
      EXPECT_TRUE(late == pattern(64, 99));
    }
  });
}

TEST(TcpTransport, SingleRankNeedsNoPeersAndRejectsItself) {
  auto ranks = connectGroup(1, memoryStore("single"));
  uint8_t byte = 0;
  EXPECT_THROW(ranks[0]->isend(0, 1, &byte, 1), EnforceError);
  EXPECT_THROW(ranks[0]->irecv(1, 1, &byte, 1), EnforceError);
  AllreduceArgs args;
  float x = 3;
  args.in = args.out = &x;
  args.count = 1;
  args.deadline = soon();
  allreduceRing(*ranks[0], args);
  EXPECT_EQ(x, 3);
}

TEST(TcpTransport, AbortWakesLocalWaitersAndPeersWithTheReason) {
  auto ranks = connectGroup(3, memoryStore("abort"));
  const auto start = Clock::now();
  auto errors = runRanksCollect(3, [&](int r) {
    uint8_t buf[16];
    if (r == 1) {
      // A local waiter blocked on rank 2 must wake when another thread aborts.
      auto pending = ranks[1]->irecv(2, 3, buf, sizeof buf);
      std::thread aborter([&] {
        std::this_thread::sleep_for(Millis(100));
        ranks[1]->abort("user asked");
      });
      try {
        pending->wait(soon());
      } catch (...) {
        aborter.join();
        throw;
      }
      aborter.join();
    } else {
      // Ranks 0 and 2 wait on rank 1, which never sends.
      ranks[r]->irecv(1, 3, buf, sizeof buf)->wait(soon());
    }
  });
  EXPECT_LT(secondsSince(start), 12.0);  // well before soon()'s 20 s: the abort woke it
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const PeerAbortedError& e) {
      EXPECT_EQ(e.rank(), 1) << e.what();
      EXPECT_NE(std::string(e.what()).find("user asked"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
  // A failed transport stays failed.
  uint8_t byte = 0;
  EXPECT_THROW(ranks[0]->isend(1, 9, &byte, 1), PeerAbortedError);
}

TEST(TcpTransport, TimeoutNamesThePeerAndFailsTheGroup) {
  auto ranks = connectGroup(2, memoryStore("timeout"));
  const auto start = Clock::now();
  auto errors = runRanksCollect(2, [&](int r) {
    uint8_t buf[40];
    // Rank 0 gives up after 300 ms; rank 1 would wait 20 s but must fail as soon as rank 0 does.
    const Deadline deadline = r == 0 ? deadlineAfter(Millis(300)) : soon();
    ranks[r]->irecv(1 - r, 77, buf, sizeof buf)->wait(deadline);
  });
  EXPECT_LT(secondsSince(start), 12.0);  // well before soon()'s 20 s: the abort woke it
  ASSERT_TRUE(errors[0] && errors[1]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
    EXPECT_NE(what.find("40 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("tag 77"), std::string::npos) << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank 0: " << e.what();
  }
  try {
    std::rethrow_exception(errors[1]);
  } catch (const PeerAbortedError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank 1: " << e.what();
  }
}

TEST(TcpTransport, MissingRankAtSetupIsATimeoutNamingIt) {
  auto shared = memoryStore("missing");
  const auto start = Clock::now();
  TcpOptions options;
  options.timeout = Millis(800);
  // Ranks 0 and 1 of 3 show up; rank 2 never does.
  auto errors = runRanksCollect(2, [&](int r) { createTcpTransport(shared, r, 3, options); });
  const double elapsed = secondsSince(start);
  EXPECT_LT(elapsed, 10.0);  // the 0.8 s setup timeout, with room for a sanitizer build
  EXPECT_GE(elapsed, 0.7);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]);
    try {
      std::rethrow_exception(errors[r]);
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
}

// Rank 2 of 3 runs in a child process and is killed with SIGKILL while the group is in the middle
// of allreduces; ranks 0 and 1 (threads here) must fail with PeerAbortedError or TimeoutError
// within 10 s, not hang.
TEST(TcpTransport, KilledPeerMidCollectiveFailsTheOthersQuickly) {
  char dirTemplate[] = "/tmp/hetra-tcp-test-XXXXXX";
  ASSERT_NE(mkdtemp(dirTemplate), nullptr);
  const std::string dir = dirTemplate;
  constexpr int kSize = 3, kChildRank = 2;
  constexpr size_t kCount = 1 << 18;  // 1 MiB of float32: several segments per block

  auto runAllreduces = [&](Transport& t, std::atomic<int>* progress) {
    std::vector<float> data(kCount, 1.0f);
    for (uint64_t seq = 0;; ++seq) {
      AllreduceArgs args;
      args.in = args.out = data.data();
      args.count = kCount;
      args.seq = seq;
      args.deadline = deadlineAfter(Millis(30000));
      allreduceRing(t, args);
      if (progress) progress->fetch_add(1);
    }
  };

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      auto shared = std::make_shared<DirStore>(dir);
      TcpOptions options;
      auto t = createTcpTransport(shared, kChildRank, kSize, options);
      runAllreduces(*t, nullptr);
    } catch (...) {
    }
    _exit(0);
  }

  auto shared = std::make_shared<DirStore>(dir);
  std::vector<std::unique_ptr<Transport>> ranks(kSize - 1);
  std::atomic<int> progress{0};
  std::atomic<bool> killed{false};
  Clock::time_point killedAt;
  std::thread killer([&] {
    // Kill once the group has done a few operations, so that it dies mid-collective.
    while (progress.load() < 6) std::this_thread::sleep_for(Millis(1));
    killedAt = Clock::now();
    kill(child, SIGKILL);
    killed = true;
  });
  auto errors = runRanksCollect(kSize - 1, [&](int r) {
    TcpOptions options;
    ranks[r] = createTcpTransport(shared, r, kSize, options);
    runAllreduces(*ranks[r], &progress);
  });
  const auto failedAt = Clock::now();
  if (!killed) kill(child, SIGKILL);
  killer.join();
  waitpid(child, nullptr, 0);
  std::filesystem::remove_all(dir);

  ASSERT_TRUE(killed.load());
  EXPECT_LT(std::chrono::duration<double>(failedAt - killedAt).count(), 10.0);
  for (int r = 0; r < kSize - 1; ++r) {
    ASSERT_TRUE(errors[r]);
    try {
      std::rethrow_exception(errors[r]);
    } catch (const PeerAbortedError& e) {
      std::cout << "[   info   ] rank " << r << ": " << e.what() << "\n";
      EXPECT_EQ(e.rank(), kChildRank) << "rank " << r << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    } catch (const TimeoutError& e) {
      std::cout << "[   info   ] rank " << r << ": " << e.what() << "\n";
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " failed with an unexpected error: " << e.what();
    }
  }
}

// A send queued on the socket (the receiver is stopped, its buffers are full) must fail when the
// receiver dies: the transport has to notice the dead connection, not wait for its deadline.
TEST(TcpTransport, KilledReceiverFailsAQueuedSend) {
  char dirTemplate[] = "/tmp/hetra-tcp-test-XXXXXX";
  ASSERT_NE(mkdtemp(dirTemplate), nullptr);
  const std::string dir = dirTemplate;
  constexpr size_t kBytes = size_t(64) << 20;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      auto t = createTcpTransport(std::make_shared<DirStore>(dir), 1, 2, TcpOptions{});
      std::vector<uint8_t> sink(kBytes);
      auto recv = t->irecv(0, 1, sink.data(), kBytes);
      raise(SIGSTOP);  // stop reading: the sender's data backs up in the socket
      recv->wait(deadlineAfter(Millis(60000)));
    } catch (...) {
    }
    _exit(0);
  }
  auto t = createTcpTransport(std::make_shared<DirStore>(dir), 0, 2, TcpOptions{});
  std::vector<uint8_t> data(kBytes, 7);
  auto send = t->isend(1, 1, data.data(), kBytes);
  std::thread killer([&] {
    std::this_thread::sleep_for(Millis(300));
    kill(child, SIGKILL);
  });
  const auto start = Clock::now();
  try {
    send->wait(deadlineAfter(Millis(20000)));
    ADD_FAILURE() << "a send of 64 MiB to a stopped rank completed";
  } catch (const PeerAbortedError& e) {
    EXPECT_EQ(e.rank(), 1) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected error: " << e.what();
  }
  EXPECT_LT(secondsSince(start), 12.0);  // well before soon()'s 20 s: the abort woke it
  killer.join();
  waitpid(child, nullptr, 0);
  std::filesystem::remove_all(dir);
}

// A receive of another size than the send is a MismatchError naming the sender and both sizes on
// the receiving rank; the sender's group fails too instead of hanging.
TEST(TcpTransport, SizeMismatchIsAnErrorNamingTheSender) {
  auto ranks = connectGroup(2, memoryStore("mismatch"));
  const auto start = Clock::now();
  auto errors = runRanksCollect(2, [&](int r) {
    uint8_t buf[40] = {};
    if (r == 0) {
      ranks[0]->isend(1, 4, buf, 40)->wait(soon());
      ranks[0]->irecv(1, 5, buf, 8)->wait(soon());  // never sent: fails when rank 1 does
    } else {
      ranks[1]->irecv(0, 4, buf, 32)->wait(soon());
    }
  });
  EXPECT_LT(secondsSince(start), 12.0);  // well before soon()'s 20 s: the abort woke it
  ASSERT_TRUE(errors[0] && errors[1]);
  try {
    std::rethrow_exception(errors[1]);
  } catch (const MismatchError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
    EXPECT_NE(what.find("40 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("32 bytes"), std::string::npos) << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank 1: " << e.what();
  }
  EXPECT_THROW(std::rethrow_exception(errors[0]), PeerAbortedError);
}

// Messages that arrive before their receive is posted are buffered, including one still arriving
// when the receive is posted (the rest then goes straight into the posted buffer).
TEST(TcpTransport, EarlyMessagesAreBufferedAndMatchedInOrder) {
  auto ranks = connectGroup(2, memoryStore("early"));
  const size_t sizes[] = {3, 0, 100000, (size_t(8) << 20) + 3};
  runRanks(2, [&](int r) {
    if (r == 0) {
      std::vector<std::unique_ptr<Request>> sends;
      std::vector<std::vector<uint8_t>> data;
      for (size_t i = 0; i < 4; ++i) data.push_back(pattern(sizes[i], int(i) + 10));
      for (size_t i = 0; i < 4; ++i)
        sends.push_back(ranks[0]->isend(1, 9, data[i].data(), sizes[i]));
      for (auto& s : sends) s->wait(soon());
    } else {
      std::this_thread::sleep_for(Millis(100));  // let the messages arrive unasked
      for (size_t i = 0; i < 4; ++i) {
        std::vector<uint8_t> got(sizes[i]);
        ranks[1]->irecv(0, 9, got.data(), sizes[i])->wait(soon());
        EXPECT_TRUE(got == pattern(sizes[i], int(i) + 10)) << "message " << i;
      }
    }
  });
  EXPECT_EQ(ranks[1]->bytesReceived(), sizes[0] + sizes[1] + sizes[2] + sizes[3]);
}

}  // namespace
}  // namespace hetra::comm
