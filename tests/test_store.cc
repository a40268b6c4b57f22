// One behavioural suite run against every Store (memory, file, tcp), then the faults only TCP has:
// many clients, a server that dies, garbage on the wire, no server at all.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>

#include "common/auth.h"
#include "common/errors.h"
#include "harness.h"
#include "store/file_store.h"
#include "store/store.h"
#include "store/tcp_store.h"

namespace hetra::store {
namespace {

using namespace std::chrono_literals;

constexpr Millis kClientTimeout{10000};

Bytes bytesOf(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

std::string makeTempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "hetra-store-XXXXXX").string();
  HETRA_ENFORCE(::mkdtemp(pattern.data()) != nullptr, "mkdtemp failed");
  return pattern;
}

// A free TCP port on 127.0.0.1 (bound then released; the kernel does not hand it out again at
// once).
int freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  HETRA_ENFORCE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0, "bind");
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Backends: client() returns a new handle on the same underlying key space, as a separate rank
// would.
struct MemoryBackend {
  std::shared_ptr<MemoryStore> store = std::make_shared<MemoryStore>();
  std::shared_ptr<Store> client() { return store; }
};

struct FileBackend {
  std::string dir = makeTempDir();
  ~FileBackend() { std::filesystem::remove_all(dir); }
  std::shared_ptr<Store> client() { return std::make_shared<FileStore>(dir); }
};

struct TcpBackend {
  TcpStoreServer server{"127.0.0.1", 0};
  std::shared_ptr<Store> client() {
    return std::make_shared<TcpStore>("127.0.0.1", server.port(), kClientTimeout);
  }
};

// The TCP store with a job secret: every connection authenticates first, nothing else changes.
struct AuthTcpBackend {
  auth::AuthOptions auth = [] {
    auth::AuthOptions options;
    options.secret = auth::JobSecret::fromHex(auth::generateJobSecret(), "test");
    return options;
  }();
  TcpStoreServer server{"127.0.0.1", 0, auth};
  std::shared_ptr<Store> client() {
    return std::make_shared<TcpStore>("127.0.0.1", server.port(), kClientTimeout, auth);
  }
};

template <typename Backend>
class StoreTest : public ::testing::Test {
 protected:
  Backend backend;
};

using Backends = ::testing::Types<MemoryBackend, FileBackend, TcpBackend, AuthTcpBackend>;
TYPED_TEST_SUITE(StoreTest, Backends);

TYPED_TEST(StoreTest, SetGetOverwriteAndBinaryValues) {
  auto store = this->backend.client();
  const Bytes binary = {0, 1, 255, 0, 10, 13, 37};
  store->set("bin", binary);
  store->set("empty", {});
  store->set("a/b", bytesOf("slash"));
  store->set("a_b", bytesOf("underscore"));
  store->set("a%2Fb", bytesOf("percent"));
  EXPECT_EQ(store->get("bin", deadlineAfter(1s)), binary);
  EXPECT_EQ(store->get("empty", deadlineAfter(1s)), Bytes{});
  EXPECT_EQ(store->getString("a/b", deadlineAfter(1s)), "slash");
  EXPECT_EQ(store->getString("a_b", deadlineAfter(1s)), "underscore");
  EXPECT_EQ(store->getString("a%2Fb", deadlineAfter(1s)), "percent");
  store->setString("a/b", "again");
  EXPECT_EQ(store->getString("a/b", deadlineAfter(1s)), "again");
  // Another client sees the same keys.
  EXPECT_EQ(this->backend.client()->get("bin", deadlineAfter(1s)), binary);
  // Large value (above one socket buffer).
  Bytes large(3'000'001);
  for (size_t i = 0; i < large.size(); ++i) large[i] = uint8_t(i * 7 + i / 251);
  store->set("large", large);
  EXPECT_EQ(this->backend.client()->get("large", deadlineAfter(5s)), large);
}

TYPED_TEST(StoreTest, GetWaitsForALaterSetFromAnotherThread) {
  auto reader = this->backend.client();
  auto writer = this->backend.client();
  const auto start = Clock::now();
  std::thread late([&] {
    std::this_thread::sleep_for(150ms);
    writer->setString("late", "value");
  });
  EXPECT_EQ(reader->getString("late", deadlineAfter(5s)), "value");
  EXPECT_GE(secondsSince(start), 0.14);
  late.join();

  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    writer->setString("w1", "1");
    std::this_thread::sleep_for(50ms);
    writer->setString("w2", "2");
  });
  reader->wait({"w1", "w2"}, deadlineAfter(5s));
  EXPECT_TRUE(reader->check({"w1", "w2"}));
  later.join();
}

TYPED_TEST(StoreTest, ConcurrentAddsGiveAnExactTotal) {
  constexpr int kThreads = 7;
  constexpr int kAddsPerThread = 60;
  auto shared = this->backend.client();
  std::vector<std::vector<int64_t>> results(kThreads);
  test::runRanks(kThreads, [&](int rank) {
    // Odd ranks share one client (its mutex), even ranks own theirs.
    auto store = rank % 2 ? shared : this->backend.client();
    for (int i = 0; i < kAddsPerThread; ++i)
      results[rank].push_back(store->add("counter", rank + 1));
  });
  int64_t expected = 0;
  for (int rank = 0; rank < kThreads; ++rank) expected += int64_t(rank + 1) * kAddsPerThread;
  EXPECT_EQ(shared->add("counter", 0), expected);
  EXPECT_EQ(shared->getString("counter", deadlineAfter(1s)), std::to_string(expected));
  // Every add saw a distinct running total: none was lost or applied twice.
  std::set<int64_t> seen;
  for (const auto& r : results) seen.insert(r.begin(), r.end());
  EXPECT_EQ(seen.size(), size_t(kThreads * kAddsPerThread));
  EXPECT_EQ(shared->add("negative", -5), -5);
  shared->setString("text", "abc");
  EXPECT_THROW(shared->add("text", 1), Error);
  EXPECT_EQ(shared->getString("text", deadlineAfter(1s)), "abc");
}

TYPED_TEST(StoreTest, CompareSetSemantics) {
  auto store = this->backend.client();
  // Absent key equals an empty expected value.
  EXPECT_EQ(store->compareSet("cas", bytesOf("x"), bytesOf("no")), Bytes{});
  EXPECT_FALSE(store->check({"cas"}));
  EXPECT_EQ(store->compareSet("cas", {}, bytesOf("first")), bytesOf("first"));
  EXPECT_EQ(store->compareSet("cas", {}, bytesOf("second")), bytesOf("first"));
  EXPECT_EQ(store->compareSet("cas", bytesOf("wrong"), bytesOf("second")), bytesOf("first"));
  EXPECT_EQ(store->compareSet("cas", bytesOf("first"), bytesOf("second")), bytesOf("second"));
  EXPECT_EQ(store->getString("cas", deadlineAfter(1s)), "second");

  // Exactly one of many racing threads wins the election.
  std::atomic<int> winners{0};
  test::runRanks(5, [&](int rank) {
    auto client = this->backend.client();
    const Bytes mine = bytesOf("rank" + std::to_string(rank));
    if (client->compareSet("leader", {}, mine) == mine) ++winners;
  });
  EXPECT_EQ(winners.load(), 1);
}

TYPED_TEST(StoreTest, WaitAndGetTimeOutWithinTheirTimeout) {
  auto store = this->backend.client();
  store->setString("present", "1");
  for (int which = 0; which < 2; ++which) {
    const auto start = Clock::now();
    try {
      if (which == 0)
        store->wait({"present", "missing-key-x"}, deadlineAfter(200ms));
      else
        store->get("missing-key-y", deadlineAfter(200ms));
      ADD_FAILURE() << "no timeout";
    } catch (const TimeoutError& e) {
      const double elapsed = secondsSince(start);
      EXPECT_GE(elapsed, 0.19);
      EXPECT_LT(elapsed, 10.0);  // it ended by its deadline, not by a hang (sanitizer room)
      EXPECT_NE(std::string(e.what()).find(which == 0 ? "missing-key-x" : "missing-key-y"),
                std::string::npos)
          << e.what();
    }
  }
  // The store is still usable after a timeout.
  store->setString("after", "ok");
  EXPECT_EQ(store->getString("after", deadlineAfter(1s)), "ok");
  EXPECT_THROW(store->wait({"missing"}, deadlineAfter(0ms)), TimeoutError);
}

// The point of a Deadline: calls made one after another under it share its budget, where each
// given a timeout would wait the whole of it again (three calls here would take 6 s).
TYPED_TEST(StoreTest, CallsUnderOneDeadlineShareItsBudget) {
  auto store = this->backend.client();
  const auto start = Clock::now();
  const Deadline deadline = deadlineAfter(2000ms);
  EXPECT_THROW(store->get("missing-first", deadline), TimeoutError);
  EXPECT_GE(secondsSince(start), 1.95);  // the first get spent the whole budget
  EXPECT_THROW(store->wait({"missing-second"}, deadline), TimeoutError);
  EXPECT_THROW(store->getString("missing-third", deadline), TimeoutError);
  EXPECT_LT(secondsSince(start), 4.0);  // below the 6 s of three 2 s timeouts
}

TYPED_TEST(StoreTest, CheckAndDeleteKey) {
  auto store = this->backend.client();
  EXPECT_TRUE(store->check({}));
  EXPECT_FALSE(store->check({"k1"}));
  store->setString("k1", "v");
  store->setString("k2", "v");
  EXPECT_TRUE(store->check({"k1", "k2"}));
  EXPECT_FALSE(store->check({"k1", "k3"}));
  EXPECT_TRUE(store->deleteKey("k1"));
  EXPECT_FALSE(store->deleteKey("k1"));
  EXPECT_FALSE(store->check({"k1"}));
  EXPECT_THROW(store->get("k1", deadlineAfter(50ms)), TimeoutError);
  EXPECT_EQ(store->add("k1", 3), 3);  // a deleted counter restarts from 0
}

TYPED_TEST(StoreTest, PrefixStoresAreIsolated) {
  auto inner = this->backend.client();
  PrefixStore a("job/a", inner);
  PrefixStore b("job/b", this->backend.client());
  a.setString("key", "from a");
  b.setString("key", "from b");
  EXPECT_EQ(a.getString("key", deadlineAfter(1s)), "from a");
  EXPECT_EQ(b.getString("key", deadlineAfter(1s)), "from b");
  EXPECT_EQ(inner->getString("job/a/key", deadlineAfter(1s)), "from a");
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 5), 5);
  EXPECT_FALSE(a.check({"only-b"}));
  b.setString("only-b", "x");
  EXPECT_FALSE(a.check({"only-b"}));
  EXPECT_THROW(a.wait({"only-b"}, deadlineAfter(50ms)), TimeoutError);
  EXPECT_TRUE(a.deleteKey("key"));
  EXPECT_EQ(b.getString("key", deadlineAfter(1s)), "from b");
}

// ---------------------------------------------------------------------------------------------
// FileStore only

TEST(FileStore, KeysWithAnyBytesMapToDistinctFileNames) {
  const std::vector<std::string> keys = {"a/b",
                                         "a%2Fb",
                                         "a_b",
                                         "..",
                                         ".",
                                         "",
                                         std::string(300, 'x'),
                                         std::string(300, 'x') + "y",
                                         std::string("nul\0byte", 8)};
  std::set<std::string> names;
  for (const auto& key : keys) {
    const std::string name = FileStore::fileNameForKey(key);
    EXPECT_EQ(name.find('/'), std::string::npos) << name;
    EXPECT_LE(name.size(), 255u);
    names.insert(name);
  }
  EXPECT_EQ(names.size(), keys.size());
  FileBackend backend;
  auto store = backend.client();
  for (size_t i = 0; i < keys.size(); ++i) store->setString(keys[i], std::to_string(i));
  for (size_t i = 0; i < keys.size(); ++i)
    EXPECT_EQ(store->getString(keys[i], deadlineAfter(1s)), std::to_string(i));
}

// flock must serialise separate processes, not only threads.
TEST(FileStore, AddsFromForkedProcessesGiveAnExactTotal) {
  FileBackend backend;
  constexpr int kProcesses = 3;
  constexpr int kAdds = 80;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        FileStore store(backend.dir);
        for (int i = 0; i < kAdds; ++i) store.add("counter", p + 1);
      } catch (...) {
        code = 1;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(backend.client()->add("counter", 0), (1 + 2 + 3) * kAdds);
}

// ---------------------------------------------------------------------------------------------
// TcpStore only

TEST(TcpStore, ManyClientsRendezvous) {
  TcpStoreServer server("127.0.0.1", 0);
  constexpr int kRanks = 11;
  test::runRanks(kRanks, [&](int rank) {
    TcpStore store("127.0.0.1", server.port(), kClientTimeout);
    store.setString("addr/" + std::to_string(rank), "rank-" + std::to_string(rank * 13));
    store.add("arrived", 1);
    std::vector<std::string> keys;
    for (int r = 0; r < kRanks; ++r) keys.push_back("addr/" + std::to_string(r));
    store.wait(keys, deadlineAfter(5s));
    for (int r = 0; r < kRanks; ++r)
      HETRA_ENFORCE_EQ(store.getString(keys[r], deadlineAfter(1s)),
                       "rank-" + std::to_string(r * 13));
  });
  TcpStore store("127.0.0.1", server.port(), kClientTimeout);
  EXPECT_EQ(store.add("arrived", 0), kRanks);
  // A value over the frame limit is refused by the client, and the connection stays usable.
  EXPECT_THROW(store.set("huge", Bytes((64u << 20) + 1)), Error);
  EXPECT_EQ(store.getString("addr/3", deadlineAfter(1s)), "rank-39");
}

TEST(TcpStore, ParkedWaitersDoNotBlockOtherClients) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore waiting("127.0.0.1", server.port(), kClientTimeout);
  TcpStore other("127.0.0.1", server.port(), kClientTimeout);
  // The waiter stays parked until the other client sets its key, which that client can do only if
  // the server serves it meanwhile.
  std::atomic<bool> returned{false};
  std::thread parked([&] {
    EXPECT_EQ(waiting.getString("released", deadlineAfter(60s)), "now");
    returned = true;
  });
  std::this_thread::sleep_for(50ms);
  for (int i = 0; i < 20; ++i) other.setString("k" + std::to_string(i), "v");
  EXPECT_TRUE(other.check({"k0", "k19"}));
  EXPECT_FALSE(returned.load());  // served while the waiter is parked
  other.setString("released", "now");
  parked.join();
  EXPECT_TRUE(returned.load());
}

TEST(TcpStore, ServerDestroyedGivesIoErrorToBlockedAndLaterCalls) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  TcpStore store("127.0.0.1", server->port(), kClientTimeout);
  store.setString("k", "v");
  const auto start = Clock::now();
  std::thread blocked([&] { EXPECT_THROW(store.get("never", deadlineAfter(20s)), IoError); });
  std::this_thread::sleep_for(100ms);
  server.reset();
  blocked.join();
  EXPECT_LT(secondsSince(start), 12.0);              // the server's end, not the 20 s deadline
  EXPECT_THROW(store.setString("k", "v"), IoError);  // latched
}

TEST(TcpStore, KilledServerProcessGivesIoError) {
  // Fork first, while this process has no other thread, so the child may start its server thread.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    try {
      TcpStoreServer server("127.0.0.1", 0);
      const int port = server.port();
      if (::write(fds[1], &port, sizeof(port)) != sizeof(port)) ::_exit(2);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(1);
    }
  }
  ::close(fds[1]);
  int port = 0;
  ASSERT_EQ(::read(fds[0], &port, sizeof(port)), ssize_t(sizeof(port)));
  ::close(fds[0]);
  {
    TcpStore store("127.0.0.1", port, kClientTimeout);
    store.setString("k", "v");
    EXPECT_EQ(store.getString("k", deadlineAfter(1s)), "v");
    std::thread killer([&] {
      std::this_thread::sleep_for(100ms);
      ::kill(pid, SIGKILL);
    });
    const auto start = Clock::now();
    EXPECT_THROW(store.get("never", deadlineAfter(20s)), IoError);
    EXPECT_LT(secondsSince(start), 12.0);  // the server's death, not the 20 s deadline
    killer.join();
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
}

// Sends raw bytes and reports whether the server closed the connection within 2 s.
bool serverCloses(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(uint16_t(port));
  HETRA_ENFORCE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0, "connect");
  HETRA_ENFORCE_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buffer[64];
  const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
  ::close(fd);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

std::string frameHeader(uint32_t magic, uint32_t length) {
  std::string out;
  for (uint32_t v : {magic, length})
    for (int i = 0; i < 4; ++i) out += char(v >> (8 * i));
  return out;
}

TEST(TcpStore, GarbageClientsAreRefusedAndOthersStillServed) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore good("127.0.0.1", server.port(), kClientTimeout);
  good.setString("before", "1");
  std::thread parked([&] {
    TcpStore waiter("127.0.0.1", server.port(), kClientTimeout);
    EXPECT_EQ(waiter.getString("after", deadlineAfter(5s)), "2");
  });
  constexpr uint32_t kMagic = 0x31535448;
  EXPECT_TRUE(serverCloses(server.port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_TRUE(serverCloses(server.port(), frameHeader(kMagic, 100u << 20)));  // absurd length
  EXPECT_TRUE(serverCloses(server.port(),
                           frameHeader(kMagic, 3) + std::string("\x7f\x00\x00", 3)));  // bad opcode
  EXPECT_TRUE(serverCloses(
      server.port(), frameHeader(kMagic, 5) + std::string("\x01\xff\xff\x00\x00", 5)));  // short
  good.setString("after", "2");
  parked.join();
  EXPECT_EQ(good.getString("before", deadlineAfter(1s)), "1");
}

// A peer that accepts connections but never answers (a hung server) must not hang the client.
TEST(TcpStore, SilentServerCannotHangTheClient) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(listener, 4), 0);  // the kernel completes connects; nobody ever reads
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  TcpStore store("127.0.0.1", ntohs(addr.sin_port), 300ms);
  auto start = Clock::now();
  EXPECT_THROW(store.setString("k", "v"), TimeoutError);
  EXPECT_LT(secondsSince(start), 10.0);  // ended by the 300 ms timeout, not a hang
  start = Clock::now();
  EXPECT_THROW(store.get("k", deadlineAfter(100ms)),
               TimeoutError);  // the timeout plus the reply grace
  EXPECT_LT(secondsSince(start), 10.0);
  ::close(listener);
}

TEST(TcpStore, ConnectTimesOutWhenNoServerAndNamesTheAddress) {
  const int port = freePort();
  const auto start = Clock::now();
  try {
    TcpStore store("127.0.0.1", port, 300ms);
    ADD_FAILURE() << "connected to nothing";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
  const double elapsed = secondsSince(start);
  EXPECT_GE(elapsed, 0.28);
  EXPECT_LT(elapsed, 10.0);  // ended by the 300 ms timeout, not a hang
}

TEST(TcpStore, ConnectRetriesUntilTheServerStarts) {
  const int port = freePort();
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(250ms);
    server = std::make_unique<TcpStoreServer>("127.0.0.1", port);
  });
  TcpStore store("127.0.0.1", port, 5s);
  starter.join();
  store.setString("k", "v");
  EXPECT_EQ(store.getString("k", deadlineAfter(1s)), "v");
}

TEST(TcpStore, ConnectStoreParsesAndRendezvous) {
  for (const std::string bad : {"", "host", "host:", ":29500", "host:port", "host:70000",
                                "host:12:34", "[::1]29500", "[::1"}) {
    try {
      connectStore(bad, 1, 100ms, nullptr);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + bad + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parseHostPort("[::1]:80").host, "::1");
  EXPECT_EQ(parseHostPort("node-3.cluster:29500").port, 29500);

  const std::string address = "127.0.0.1:" + std::to_string(freePort());
  constexpr int kRanks = 5;
  std::unique_ptr<TcpStoreServer> server;
  std::vector<std::shared_ptr<Store>> stores(kRanks);
  test::runRanks(kRanks, [&](int rank) {
    // Ranks above 0 start first: they must wait for rank 0's server.
    if (rank == 0) std::this_thread::sleep_for(100ms);
    stores[rank] = connectStore(address, rank, 5s, rank == 0 ? &server : nullptr);
    stores[rank]->add("joined", rank + 1);
    stores[rank]->setString("r" + std::to_string(rank), std::to_string(rank * 3 + 1));
  });
  ASSERT_TRUE(server);
  for (int rank = 0; rank < kRanks; ++rank)
    EXPECT_EQ(stores[(rank + 2) % kRanks]->getString("r" + std::to_string(rank), deadlineAfter(1s)),
              std::to_string(rank * 3 + 1));
  EXPECT_EQ(stores[3]->add("joined", 0), 15);

  // Without serverOut the single rank-0 client owns its server (port 0 picks one).
  auto solo = connectStore("127.0.0.1:0", 0, 1s, nullptr);
  solo->setString("x", "y");
  EXPECT_EQ(solo->getString("x", deadlineAfter(1s)), "y");
}

}  // namespace
}  // namespace hetra::store
